"""Whether a model version can answer an application's queries: the same input type, and the same input shape
where both give one. Checked wherever a version comes to serve a linked application: a version added to a linked
model, a link, the active version switched by hand or rolled back, a canary started (its version takes a share of
the queries, and a promotion makes it the active one). A version that cannot serve every linked application is
refused with a 400 naming the field, and nothing is written."""

from __future__ import annotations

from typing import Protocol

from clipper.core.domain import Application, ModelRecord, ModelVersion
from clipper.errors import InvalidInput, NotFound


class LinkedApps(Protocol):
    def model_record(self, name: str) -> ModelRecord: ...

    def app_and_links(self, name: str) -> tuple[Application, list[str]]: ...


def check_compatible(app: Application, mv: ModelVersion, field: str) -> None:
    if app.input_type is not mv.input_type:
        raise InvalidInput(
            field,
            f"a model taking {app.input_type.value} like application {app.name}",
            f"{mv.name}:{mv.version} takes {mv.input_type.value}",
        )
    if app.input_shape and mv.input_shape and app.input_shape != mv.input_shape:
        raise InvalidInput(
            field,
            f"a model of input shape {list(app.input_shape)} like application {app.name}",
            f"{mv.name}:{mv.version} has {list(mv.input_shape)}",
        )


def linked_apps(registry: LinkedApps, model: str, names: list[str] | None = None) -> list[Application]:
    """The applications linked to ``model`` (none for an unknown model); ``names``, the links of a model record
    the caller already read, saves reading it again."""
    if names is None:
        try:
            names = registry.model_record(model).linked_apps
        except NotFound:
            return []
    out = []
    for name in names:
        try:
            out.append(registry.app_and_links(name)[0])
        except NotFound:
            continue
    return out


def check_serves_linked_apps(
    registry: LinkedApps, mv: ModelVersion, field: str, names: list[str] | None = None
) -> None:
    """``InvalidInput`` naming ``field`` when ``mv`` cannot answer an application linked to its model (``names``:
    its links, when the caller read its record already)."""
    for app in linked_apps(registry, mv.name, names):
        check_compatible(app, mv, field)
