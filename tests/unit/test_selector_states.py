from __future__ import annotations

import random

import pytest

from clipper.frontend.selection import Selector
from tests.fakes import FakeClock, InMemoryRegistry, InMemorySelectionStore, digits_app, model_version

pytestmark = pytest.mark.unit


def test_per_user_states_are_bounded_least_recently_used_first():
    registry = InMemoryRegistry()
    registry.apps["d"] = digits_app(name="d", policy="exp3")
    registry.links["d"] = ["a", "b"]
    for m in ("a", "b"):
        registry.versions[(m, "1")] = model_version(m)
        registry.active[m] = "1"
    store = InMemorySelectionStore()
    selector = Selector(registry, store, FakeClock(), random.Random(1), ttl_s=60.0, max_states=50)
    app = registry.get_app("d")
    for user in range(5_000):
        assert selector.choose(app, f"user-{user}") is not None
    assert selector.cached_states <= 50
