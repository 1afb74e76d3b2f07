"""Which version of each linked model answers now: what a bandit arm is checked against
(:func:`clipper.selection.state.follow_versions`) when a query chooses and when feedback updates."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from clipper.core.domain import ModelVersion
from clipper.errors import ClipperError


class ActiveVersions(Protocol):
    def active_version(self, model: str) -> ModelVersion: ...


def active_versions(
    registry: ActiveVersions, models: Iterable[str], tolerate: type[ClipperError] = ClipperError
) -> dict[str, str]:
    """Each model's active version (a model without one is left out: it cannot answer, its arm waits).
    ``tolerate``: the errors that leave a model out; others raise (feedback tolerates ``NotFound`` only: a
    registry it cannot read must fail the feedback, to be retried, not judge every model as versionless; a
    query leaves the model's arm as it is)."""
    out = {}
    for model in models:
        try:
            out[model] = registry.active_version(model).version
        except tolerate:
            continue
    return out
