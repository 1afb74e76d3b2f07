"""What queries used recently stays fresh while no query comes: the registry copy's entries and the bandit states
are reloaded off the query path, so the first queries after a quiet spell read nothing on theirs."""

from __future__ import annotations

import random

import pytest

from clipper.core.keep_warm import KeepWarm
from clipper.core.registry_cache import CachedRegistry
from clipper.errors import NotFound
from clipper.frontend.selection import Selector
from tests.fakes import FakeClock, InMemoryRegistry, InMemorySelectionStore, digits_app, model_version
from tests.unit.test_registry_cache import ManualRunner, OneQueryRegistry

pytestmark = pytest.mark.unit


def test_a_tick_reloads_what_was_used_lately_and_is_old_enough_and_forgets_the_rest():
    clock, ages, reloaded = FakeClock(), {"a": 2.5, "b": 0.5, "c": 3.0}, []
    warm = KeepWarm(
        clock, 60.0, 1.0, 2.0, 4.0, lambda k, now: ages.get(k), lambda k, _: reloaded.append(k), "test-warm"
    )
    now = clock.now()
    warm._used.update({"a": now - 10, "b": now - 10, "c": now - 61, "gone": now})  # c unused for over keep_s
    assert warm.tick(now) == 1 and reloaded == ["a"]  # b is young; c is forgotten; "gone" is not held
    assert set(warm._used) == {"a", "b", "gone"}


def test_the_registry_copy_stays_current_through_a_quiet_spell():
    inner = OneQueryRegistry()
    inner.apps["digits"] = digits_app()
    inner.links["digits"] = ["mlp"]
    inner.versions[("mlp", "1")] = model_version("mlp", "1")
    inner.active["mlp"] = "1"
    clock, runner = FakeClock(), ManualRunner()

    def quiet_spell(keep_warm_s: float) -> tuple[bool, int]:
        """A query, then 5 s with none (the warmer ticking each second), then the next query's look."""
        inner.queries = 0
        cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner, keep_warm_s=keep_warm_s)
        assert cached.get_app_held("digits")[0] is None
        cached.get_app("digits")  # the first query reads it
        assert cached.get_app_held("digits")[1]
        for _ in range(5):
            clock.advance(1.0)
            if cached._warm is not None:
                cached._warm.tick(clock.now())
            runner.run()
        return cached.get_app_held("digits")[1], inner.queries

    assert quiet_spell(keep_warm_s=60) == (True, 3)  # current: reloaded off the path while no query came
    assert quiet_spell(keep_warm_s=0) == (False, 1)  # past the bound: the next query reads it on its path


def test_bandit_states_stay_fresh_through_a_quiet_spell():
    registry = InMemoryRegistry()
    registry.apps["d"] = digits_app(name="d", policy="exp3")
    registry.links["d"] = ["a", "b"]
    for m in ("a", "b"):
        registry.versions[(m, "1")] = model_version(m)
        registry.active[m] = "1"
    clock, runner = FakeClock(), ManualRunner()
    selector = Selector(
        registry, InMemorySelectionStore(), clock, random.Random(1), ttl_s=1.0, refresh=runner, keep_warm_s=60
    )
    app = registry.get_app("d")
    selector.choose(app, None)
    for _ in range(6):
        clock.advance(0.5)
        assert selector._warm is not None
        selector._warm.tick(clock.now())
        runner.run()
    assert selector.is_cached(app, None)  # 3 s on, twice past its TTL and more, still held fresh


def test_only_what_exists_and_what_is_bounded_is_kept_warm():
    """An unknown name's read, and a user's bandit state (one per user: unbounded), are not kept warm."""
    inner = OneQueryRegistry()
    inner.apps["digits"] = digits_app()
    inner.links["digits"] = ["mlp"]
    cached = CachedRegistry(inner, FakeClock(), ttl_s=2, refresh=ManualRunner(), keep_warm_s=60)
    cached.get_app("digits")
    with pytest.raises(NotFound):
        cached.get_app("made-up")
    assert cached._warm is not None and set(cached._warm._used) == {("app", "digits")}
    registry = InMemoryRegistry()
    registry.apps["d"] = digits_app(name="d", policy="exp3")
    registry.links["d"] = ["a", "b"]
    for m in ("a", "b"):
        registry.versions[(m, "1")] = model_version(m)
        registry.active[m] = "1"
    selector = Selector(
        registry, InMemorySelectionStore(), FakeClock(), random.Random(1), 1.0, refresh=ManualRunner(), keep_warm_s=60
    )
    for user in ("u1", "u2"):
        selector.choose(registry.get_app("d"), user)
    assert selector._warm is not None and set(selector._warm._used) == {"app/d"}


def test_the_warmers_reload_of_an_entry_past_its_bound_does_not_make_it_current():
    """Past the bound (reloads failing, say) a query rereads its application: a reload the warmer asks for then must
    not make the stale entry current while it is in flight (a deleted application or a switch served on)."""
    inner = OneQueryRegistry()
    inner.apps["digits"] = digits_app()
    inner.links["digits"] = ["mlp"]
    clock, runner = FakeClock(), ManualRunner()
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner, keep_warm_s=60)
    cached.get_app("digits")
    clock.advance(5.0)  # past the bound (4 s) with no reload done
    assert cached._warm is not None and cached._warm.tick(clock.now()) >= 1  # asked for, still in flight
    assert cached.get_app_held("digits")[1] is False
    runner.run()
    assert cached.get_app_held("digits")[1] is True  # once it came


def test_the_warmers_thread_ends_with_its_owner():
    import gc
    import time

    warm = KeepWarm(FakeClock(), 60.0, 0.01, 1.0, 2.0, lambda k, now: None, lambda k, _: None, "test-warm-gone")
    warm.touch("k", 0.0)
    thread = warm._thread
    assert thread.is_alive()
    del warm
    gc.collect()
    deadline = time.monotonic() + 5
    while thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not thread.is_alive()
