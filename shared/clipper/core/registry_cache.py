"""A warm container's short-lived copy of the registry, so a query does not read DynamoDB every time.

Entries are trusted for ``ttl_s`` seconds (the frontend's config refresh interval): a version switch
reaches every frontend within that time. Misses (``NotFound``) are cached too, for the same time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from clipper.core.domain import Application, ModelVersion
from clipper.errors import NotFound
from clipper.ports import Clock, Registry

T = TypeVar("T")


class CachedRegistry:
    def __init__(self, inner: Registry, clock: Clock, ttl_s: float) -> None:
        self._inner = inner
        self._clock = clock
        self._ttl = ttl_s
        self._entries: dict[tuple[str, ...], tuple[float, object]] = {}

    def _get(self, key: tuple[str, ...], load: Callable[[], T]) -> T:
        now = self._clock.now()
        hit = self._entries.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            value = hit[1]
        else:
            try:
                value = load()
            except NotFound as e:
                value = e
            self._entries[key] = (now, value)
        if isinstance(value, NotFound):
            raise value
        return value  # type: ignore[return-value]

    def get_app(self, name: str) -> Application:
        return self._get(("app", name), lambda: self._inner.get_app(name))

    def linked_models(self, app: str) -> list[str]:
        return self._get(("links", app), lambda: self._inner.linked_models(app))

    def active_version(self, model: str) -> ModelVersion:
        return self._get(("active", model), lambda: self._inner.active_version(model))

    def get_version(self, model: str, version: str) -> ModelVersion:
        return self._get(("version", model, version), lambda: self._inner.get_version(model, version))

    def invalidate(self) -> None:
        self._entries.clear()
