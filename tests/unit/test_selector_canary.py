"""The frontend's routing of a model's queries between its active version and its canary."""

from __future__ import annotations

import random

import pytest

from clipper.core.domain import Canary
from clipper.frontend.selection import Selector
from tests.fakes import FakeClock, InMemoryRegistry, digits_app, model_version

pytestmark = pytest.mark.unit


def _registry(share: float | None) -> InMemoryRegistry:
    registry = InMemoryRegistry()
    registry.apps["d"] = digits_app(name="d")
    registry.links["d"] = ["mlp"]
    for v in ("1", "2"):
        registry.versions[("mlp", v)] = model_version("mlp", version=v)
    registry.active["mlp"] = "1"
    if share is not None:
        registry.canaries["mlp"] = Canary("2", share, 1_700_000_000.0)
    return registry


def _versions(registry: InMemoryRegistry, users: list[str | None], seed: int = 7) -> list[str]:
    selector = Selector(registry, None, FakeClock(), random.Random(seed), ttl_s=60.0)
    app = registry.get_app("d")
    out = []
    for user in users:
        choice = selector.choose(app, user)
        assert choice is not None
        out.append(choice.models[0].version)
    return out


def test_without_a_canary_every_query_goes_to_the_active_version():
    assert set(_versions(_registry(None), [None] * 500)) == {"1"}


def test_the_canary_takes_its_share_of_anonymous_queries():
    versions = _versions(_registry(0.1), [None] * 4000)
    share = versions.count("2") / len(versions)
    assert 0.08 < share < 0.12  # binomial sd 0.0047 at n=4000: 4 sd either side


def test_a_user_sees_one_version_throughout_a_trial_and_the_users_split_by_the_share():
    users: list[str | None] = [f"user-{i}" for i in range(2000)]
    first = _versions(_registry(0.25), users, seed=1)
    again = _versions(_registry(0.25), users, seed=2)  # another frontend (another RNG): the same split
    assert first == again
    assert 0.22 < first.count("2") / len(first) < 0.28
    # a new trial of the same version draws anew
    registry = _registry(0.25)
    registry.canaries["mlp"] = Canary("2", 0.25, 1_700_000_100.0)
    assert _versions(registry, users) != first


def test_a_canary_whose_version_is_gone_leaves_its_queries_to_the_active_version():
    registry = _registry(0.99)
    del registry.versions[("mlp", "2")]
    assert set(_versions(registry, [None] * 200)) == {"1"}
