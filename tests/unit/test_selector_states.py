from __future__ import annotations

import random
import threading
import time

import pytest

from clipper.core.registry_cache import RELOAD_PATIENCE_S
from clipper.frontend.selection import Selector
from clipper.selection import state_key
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


def _bandit_world(refresh=None, ttl_s: float = 1.0):
    registry = InMemoryRegistry()
    registry.apps["d"] = digits_app(name="d", policy="exp3")
    registry.links["d"] = ["a", "b"]
    for m in ("a", "b"):
        registry.versions[(m, "1")] = model_version(m)
        registry.active[m] = "1"
    reads: list[str] = []

    class CountingStore(InMemorySelectionStore):
        def load(self, key):
            reads.append(key)
            return super().load(key)

    clock = FakeClock()
    selector = Selector(registry, CountingStore(), clock, random.Random(1), ttl_s=ttl_s, refresh=refresh)
    return selector, registry.get_app("d"), clock, reads


def test_a_stale_bandit_state_is_read_again_off_the_query_path_once_however_many_queries_ask():
    """Past its TTL a state is still used (``is_cached``: the query may run on the event loop) while one background
    read renews it; past twice the TTL it is read on the query path again."""
    queued = []
    selector, app, clock, reads = _bandit_world(refresh=queued.append)
    assert not selector.is_cached(app, None)
    selector.choose(app, None)  # the first query reads it on its path
    assert len(reads) == 1 and selector.is_cached(app, None)
    clock.advance(1.5)
    for _ in range(5):  # stale: used, and read again in the background, once
        assert selector.is_cached(app, None)
        assert selector.choose(app, None) is not None
    assert len(reads) == 1 and len(queued) == 1
    queued.pop()()  # the runner's thread reads it
    assert len(reads) == 2 and selector.is_cached(app, None)
    assert selector.choose(app, None) is not None and len(reads) == 2 and queued == []
    clock.advance(2.5)  # past TTL + max stale (no query for a while): the next query reads it on its path
    assert not selector.is_cached(app, None)
    selector.choose(app, None)
    assert len(reads) == 3 and queued == []


def test_past_twice_the_ttl_a_state_whose_read_is_in_flight_is_still_used():
    """The store is slow (a background read started and is not back): the query uses the state it holds rather
    than read it on its path, for up to RELOAD_PATIENCE_S past the bound."""
    queued = []
    selector, app, clock, reads = _bandit_world(refresh=queued.append)
    selector.choose(app, None)
    clock.advance(1.5)
    assert selector.choose(app, None) is not None and len(queued) == 1  # the background read is in flight
    clock.advance(5.0)  # 6.5 s old: past TTL + max stale
    assert selector.is_cached(app, None) and selector.choose(app, None) is not None
    assert len(reads) == 1 and len(queued) == 1
    clock.advance(RELOAD_PATIENCE_S)
    assert not selector.is_cached(app, None)
    selector.choose(app, None)
    assert len(reads) == 2


def test_without_a_runner_a_stale_state_is_read_on_the_query_path():
    selector, app, clock, reads = _bandit_world()
    selector.choose(app, None)
    clock.advance(1.5)
    assert not selector.is_cached(app, None)
    selector.choose(app, None)
    assert len(reads) == 2


def test_queries_that_read_a_state_at_once_share_one_read():
    """Past the staleness bound (or before the first read) each query read the bandit state on its path: a burst
    of them after a quiet while must make one read, not one each."""
    gate, entered = threading.Event(), threading.Semaphore(0)
    registry = InMemoryRegistry()
    registry.apps["d"] = digits_app(name="d", policy="exp3")
    registry.links["d"] = ["a", "b"]
    for m in ("a", "b"):
        registry.versions[(m, "1")] = model_version(m)
        registry.active[m] = "1"
    reads: list[str] = []

    class SlowStore(InMemorySelectionStore):
        def load(self, key):
            reads.append(key)
            entered.release()
            assert gate.wait(5)
            return super().load(key)

    selector = Selector(registry, SlowStore(), FakeClock(), random.Random(1), ttl_s=1.0)
    app = registry.get_app("d")
    chosen: list[object] = []
    threads = [threading.Thread(target=lambda: chosen.append(selector.choose(app, None))) for _ in range(6)]
    threads[0].start()
    assert entered.acquire(timeout=5)  # the first query's read is in flight
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 5
    while selector._flights.joined < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    for t in threads:
        t.join(5)
    assert len(chosen) == 6 and all(c is not None for c in chosen)
    assert len(reads) == 1


def test_a_read_in_flight_at_a_restore_is_not_kept():
    gate, entered = threading.Event(), threading.Semaphore(0)
    registry = InMemoryRegistry()
    registry.apps["d"] = digits_app(name="d", policy="exp3")
    registry.links["d"] = ["a", "b"]
    for m in ("a", "b"):
        registry.versions[(m, "1")] = model_version(m)
        registry.active[m] = "1"

    class SlowStore(InMemorySelectionStore):
        def load(self, key):
            entered.release()
            assert gate.wait(5)
            return super().load(key)

    selector = Selector(registry, SlowStore(), FakeClock(), random.Random(1), ttl_s=60.0)
    app = registry.get_app("d")
    reader = threading.Thread(target=lambda: selector.choose(app, None))
    reader.start()
    assert entered.acquire(timeout=5)
    selector.after_restore()  # the snapshot's states are dropped: a read begun before is of the snapshot's time
    gate.set()
    reader.join(5)
    assert selector.cached_states == 0 and not selector.is_cached(app, None)


def test_while_the_state_store_cannot_be_read_the_state_held_is_used_however_old(caplog):
    """An exp3 application queried after a quiet spell while DynamoDB (moto) is down: its bandit state, past the
    staleness bound, was read on the query path and failed, and the query answered its default. The state held
    is used instead (its weights a little behind pick models as well); a user's state never held gives way to the
    application's; an application's never held is still the failure."""
    from clipper.errors import Unavailable

    registry = InMemoryRegistry()
    registry.apps["d"] = digits_app(name="d", policy="exp3")
    registry.links["d"] = ["a", "b"]
    for m in ("a", "b"):
        registry.versions[(m, "1")] = model_version(m)
        registry.active[m] = "1"
    down = False

    class FlakyStore(InMemorySelectionStore):
        def load(self, key):
            if down:
                raise Unavailable("dynamodb.GetItem(selection): EndpointConnectionError")
            return super().load(key)

    clock = FakeClock()
    selector = Selector(registry, FlakyStore(), clock, random.Random(1), ttl_s=1.0)
    app = registry.get_app("d")
    assert selector.choose(app, None) is not None
    down = True
    clock.advance(600.0)
    with caplog.at_level("WARNING", logger="clipper.frontend.selection"):
        for _ in range(20):
            assert selector.choose(app, None) is not None
            assert selector.choose(app, "a-new-user") is not None
    lines = [r for r in caplog.records if "answered as last held" in r.getMessage()]
    assert len(lines) == 2  # one a second for the application's state and one for users', not one a query
    registry.apps["e"] = digits_app(name="e", policy="exp3")
    registry.links["e"] = ["a", "b"]
    with pytest.raises(Unavailable):
        selector.choose(registry.get_app("e"), None)


def test_a_linked_models_version_unreadable_is_the_failure_not_no_model_linked():
    """choose() skipped a model whose active version could not be read (any ClipperError) and, with none left,
    answered None: the query's default then said 'no model is linked to application ...', which was false (a
    user's review, moto killed). An unreadable registry now reaches the query as itself."""
    from clipper.errors import Unavailable

    class DownRegistry(InMemoryRegistry):
        def active_version(self, model):
            raise Unavailable("dynamodb.Query(registry): EndpointConnectionError")

    registry = DownRegistry()
    registry.apps["d"] = digits_app(name="d")
    registry.links["d"] = ["a"]
    selector = Selector(registry, None, FakeClock(), random.Random(1), ttl_s=1.0)
    with pytest.raises(Unavailable):
        selector.choose(registry.get_app("d"), None)


def test_an_ensemble_is_still_answered_by_the_models_it_can_read():
    """exp4 over a and b, b's active version unreadable (a throttled read, never held): the query is answered by a,
    as before the registry's failure reached choose() as itself (found by a review of that change); only when no
    model is left is it the failure."""
    from clipper.core.registry_cache import CachedRegistry
    from clipper.errors import Unavailable

    inner = InMemoryRegistry()
    inner.apps["d"] = digits_app(name="d", policy="exp4")
    inner.links["d"] = ["a", "b"]
    for m in ("a", "b"):
        inner.versions[(m, "1")] = model_version(m)
        inner.active[m] = "1"
    clock = FakeClock()
    copy = CachedRegistry(inner, clock, ttl_s=1.0)
    copy.active_version("a")
    copy.canary("a")  # a held
    real = inner.active_version
    down = {"b"}

    def flaky(model):
        if model in down:
            raise Unavailable("dynamodb.Query(registry): ProvisionedThroughputExceeded")
        return real(model)

    inner.active_version = flaky  # type: ignore[method-assign]
    selector = Selector(copy, InMemorySelectionStore(), clock, random.Random(1), ttl_s=1.0)
    choice = selector.choose(copy.get_app("d"), None)
    assert choice is not None and [m.name for m in choice.models] == ["a"]
    down.add("a")
    clock.advance(600.0)
    copy.invalidate()  # nothing held now
    with pytest.raises(Unavailable):
        selector.choose(copy.get_app("d"), None)


def test_after_a_failed_read_of_the_state_store_queries_use_the_state_held_without_reads_of_their_own():
    """A store failing slowly (retried 503s, a hang) held each query past the staleness bound for a failing read
    of its own. After one failed read the held states are used, however old, and read again off the path; the
    first read that succeeds ends it."""
    from clipper.errors import Unavailable

    runner_tasks: list = []
    selector, app, clock, reads = _bandit_world(refresh=runner_tasks.append)
    store = selector._store
    assert selector.choose(app, None) is not None and selector.choose(app, "u1") is not None
    down = [True]
    real_load = store.load

    def load(key):
        if down[0]:
            reads.append(key)
            raise Unavailable("dynamodb.GetItem(selection): 503 after retries")
        return real_load(key)

    store.load = load
    clock.advance(600.0)  # long past the bound, no read in flight: the first query reads, and fails
    assert selector.choose(app, "u1") is not None
    failed = len(reads)
    for _ in range(10):  # the next ones read nothing on their path (a user never held: the application's)
        assert selector.choose(app, "u1") is not None and selector.choose(app, "u2") is not None
    assert len(reads) == failed
    assert len(runner_tasks) == 2  # the application's state and u1's read again off the path; u2 never held: none
    down[0] = False
    for task in list(runner_tasks):
        task()
    clock.advance(600.0)
    before = len(reads)
    assert selector.choose(app, None) is not None and len(reads) == before + 1  # read on the path again


def test_a_missing_state_table_is_the_store_unavailable_and_the_state_held_answers():
    """The local stack's emulator restoring its tables: the selection table's ResourceNotFoundException is
    NotFound("resource"); it was raised as such, so an exp3 query past the bound answered its default."""
    from clipper.errors import NotFound

    selector, app, clock, _ = _bandit_world(refresh=lambda task: None)
    assert selector.choose(app, None) is not None
    store = selector._store

    def gone(key):
        raise NotFound("resource", "dynamodb.GetItem(selection) (ResourceNotFoundException)")

    store.load = gone
    clock.advance(600.0)
    assert selector.choose(app, None) is not None


def test_a_query_that_joins_a_state_read_does_not_report_its_outcome_as_its_own():
    """As the registry copy's (a review): a query joining a read of the state store started in an outage reported
    its failure with its own start, after a later read had succeeded: the store counted as failing again."""
    from clipper.errors import Unavailable

    tasks: list = []
    selector, app, clock, _ = _bandit_world(refresh=tasks.append)
    assert selector.choose(app, None) is not None
    store = selector._store
    real_load = store.load
    gate, slow = threading.Event(), set()

    def load(key):
        if threading.get_ident() in slow:  # the read started in the outage: fails late
            gate.wait(5)
            raise Unavailable("dynamodb.GetItem(selection): read timed out")
        return real_load(key)

    store.load = load
    clock.advance(600.0)
    errors: list = []

    def leader():
        slow.add(threading.get_ident())
        selector.choose(app, None)  # its read fails: the state held answers

    a = threading.Thread(target=leader)
    a.start()
    time.sleep(0.2)
    clock.advance(0.5)
    tasks.clear()
    selector._reload_in_background(state_key("d", "u1"))  # another state's read, started after the leader's
    (task,) = tasks
    task()  # ... succeeds: the store is not failing
    assert not selector._reloads.failing
    clock.advance(0.5)  # within the leader's flight's TTL: the joiner joins it

    def joiner():
        try:
            selector.choose(app, None)
        except Unavailable as e:
            errors.append(e)

    c = threading.Thread(target=joiner)
    c.start()
    time.sleep(0.2)
    gate.set()
    a.join()
    c.join()
    assert selector._flights.joined == 1 and not errors
    assert not selector._reloads.failing  # the leader's read started before the success: it does not count
