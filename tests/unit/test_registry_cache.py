from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from clipper.core.domain import Application
from clipper.core.registry_cache import RELOAD_PATIENCE_S, CachedRegistry
from clipper.errors import NotFound, Unavailable
from tests.fakes import FakeClock, InMemoryRegistry, digits_app, model_version

pytestmark = pytest.mark.unit


@dataclass
class OneQueryRegistry(InMemoryRegistry):
    """Offers ``app_and_links`` (one read of the APP#<app> collection) and counts every read."""

    queries: int = 0
    down: bool = False
    table_gone: bool = False

    def app_and_links(self, name: str) -> tuple[Application, list[str]]:
        self.queries += 1
        if self.down:
            raise Unavailable("dynamodb down")
        if self.table_gone:  # what translate makes of ResourceNotFoundException
            raise NotFound("resource", "dynamodb.Query(registry) (ResourceNotFoundException)")
        return self.get_app(name), self.linked_models(name)


class ManualRunner:
    """A refresh runner whose tasks run when the test says so."""

    def __init__(self) -> None:
        self.tasks: list[Callable[[], None]] = []

    def __call__(self, task: Callable[[], None]) -> None:
        self.tasks.append(task)

    def run(self) -> None:
        tasks, self.tasks = self.tasks, []
        for t in tasks:
            t()


def world() -> tuple[OneQueryRegistry, FakeClock]:
    inner = OneQueryRegistry()
    inner.apps["digits"] = digits_app()
    inner.links["digits"] = ["mlp"]
    inner.versions[("mlp", "1")] = model_version("mlp", "1")
    inner.versions[("mlp", "2")] = model_version("mlp", "2")
    inner.active["mlp"] = "1"
    return inner, FakeClock()


def test_an_app_and_its_links_are_one_read():
    inner, clock = world()
    cached = CachedRegistry(inner, clock, ttl_s=2)
    assert cached.get_app("digits").name == "digits" and cached.linked_models("digits") == ["mlp"]
    assert inner.queries == 1
    clock.advance(2.1)
    assert cached.linked_models("digits") == ["mlp"] and cached.get_app("digits").name == "digits"
    assert inner.queries == 2
    with pytest.raises(NotFound):
        cached.get_app("nope")
    with pytest.raises(NotFound):
        cached.linked_models("nope")  # the same read answered both
    assert inner.queries == 3


def test_stale_entries_are_answered_while_they_reload_off_the_query_path():
    inner, clock = world()
    runner = ManualRunner()
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner)
    assert cached.active_version("mlp").version == "1"
    inner.active["mlp"] = "2"
    clock.advance(2.1)
    assert cached.active_version("mlp").version == "1"  # stale, answered at once
    assert cached.active_version("mlp").version == "1"
    assert len(runner.tasks) == 1  # one reload per entry in flight
    runner.run()
    assert cached.active_version("mlp").version == "2" and runner.tasks == []


def test_a_failing_reload_keeps_the_stale_entry_until_the_staleness_bound():
    inner, clock = world()
    runner = ManualRunner()
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner, max_stale_s=3)
    cached.get_app("digits")
    inner.down = True
    clock.advance(2.5)
    assert cached.get_app("digits").name == "digits"
    runner.run()  # fails: logged, the entry stays
    clock.advance(2.0)  # 4.5 s old: still within ttl + max_stale
    assert cached.get_app("digits").name == "digits"
    runner.run()
    clock.advance(1.0)  # 5.5 s, past the bound: the registry's last read failed, so the entry held is answered
    reads = inner.queries  # without a read on the query path, and reloaded off it
    assert cached.get_app("digits").name == "digits" and cached.linked_models("digits") == ["mlp"]
    assert inner.queries == reads and len(runner.tasks) == 1
    with pytest.raises(Unavailable):  # a name the copy never held: read, and nothing to answer
        cached.get_app("other")
    assert inner.queries == reads + 1
    inner.down = False
    inner.apps["digits"] = digits_app(latency_slo_micros=50_000)
    assert cached.get_app("digits").latency_slo_micros == 100_000  # the held one, until a reload succeeds
    runner.run()  # it does: the registry is read on the query path again when it must be
    assert cached.get_app("digits").latency_slo_micros == 50_000
    clock.advance(5.0)
    reads = inner.queries
    assert cached.get_app("digits").latency_slo_micros == 50_000 and inner.queries == reads + 1


def test_a_missing_table_is_the_registry_unavailable_not_a_missing_application():
    """The local stack's emulator restarting (its tables not restored yet), or a deployment fault: the table's
    ResourceNotFoundException is NotFound("resource"); held as "no such application", every query of an existing
    application was a 404 until the entry expired."""
    inner, clock = world()
    runner = ManualRunner()
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner, max_stale_s=3)
    cached.get_app("digits")
    inner.table_gone = True
    clock.advance(2.5)
    assert cached.get_app("digits").name == "digits"
    runner.run()  # the reload fails as a registry failure: the entry stays
    assert cached.get_app("digits").name == "digits" and cached.linked_models("digits") == ["mlp"]
    with pytest.raises(Unavailable):  # a name not held: unavailable, not "does not exist"
        cached.get_app("other")


def test_past_the_staleness_bound_an_entry_is_still_answered_while_its_reload_is_in_flight():
    """A slow registry (its reload started, not back): the query would wait for a read of its own no sooner, so the
    stale entry is answered, up to RELOAD_PATIENCE_S more; once the reload ends, the bound applies again."""
    inner, clock = world()
    runner = ManualRunner()
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner, max_stale_s=2)
    cached.get_app("digits")
    clock.advance(2.5)
    assert cached.get_app("digits").name == "digits" and len(runner.tasks) == 1  # its reload is now in flight
    clock.advance(10.0)  # 12.5 s old, past ttl + max_stale: answered while the reload is in flight
    assert cached.get_app("digits").name == "digits" and cached.linked_models("digits") == ["mlp"]  # one read
    assert inner.queries == 1 and len(runner.tasks) == 1
    clock.advance(RELOAD_PATIENCE_S)  # past the patience too: read on the query path
    assert cached.get_app("digits").name == "digits" and inner.queries == 2
    inner.down = True
    clock.advance(2.5)
    assert cached.get_app("digits").name == "digits"  # stale: reload queued
    runner.tasks[-1]()  # ... and it fails: nothing in flight any more
    runner.tasks.clear()
    clock.advance(2.0)  # 4.5 s old, past the bound, no reload in flight, the registry failing: the entry held
    # is answered (stale-if-error: nothing can change the registry while it cannot be read), reloaded off the path
    reads = inner.queries
    assert cached.get_app("digits").name == "digits" and inner.queries == reads and len(runner.tasks) == 1


def test_without_the_combined_read_each_entry_is_read_alone():
    inner = InMemoryRegistry()
    inner.apps["digits"] = digits_app()
    inner.links["digits"] = ["mlp"]
    cached = CachedRegistry(inner, FakeClock(), ttl_s=2)
    assert cached.get_app("digits").name == "digits" and cached.linked_models("digits") == ["mlp"]
    assert inner.reads == 1  # get_app once; the links were read by their own call


def test_unknown_names_cannot_grow_the_cache_and_are_forgotten_soon():
    clock, inner = FakeClock(), OneQueryRegistry()
    inner.apps["digits"] = digits_app()
    cached = CachedRegistry(inner, clock, ttl_s=2.0, max_entries=64, max_negative=100, negative_ttl_s=0.5)
    cached.get_app("digits")
    for i in range(10_000):
        with pytest.raises(NotFound):
            cached.get_app(f"nope-{i}")
    assert cached.sizes[1] <= 100 and cached.sizes[0] <= 64
    assert cached.get_app("digits").name == "digits"  # known entries are not pushed out by misses
    reads = inner.queries
    with pytest.raises(NotFound):
        cached.get_app("nope-9999")  # remembered for a moment
    assert inner.queries == reads
    inner.apps["nope-9999"] = digits_app(name="nope-9999")
    clock.advance(0.6)
    assert cached.get_app("nope-9999").name == "nope-9999"  # a miss is forgotten after negative_ttl_s


def test_the_cache_keeps_the_most_recently_used_entries():
    clock, inner = FakeClock(), OneQueryRegistry()
    for i in range(10):
        inner.apps[f"a{i}"] = digits_app(name=f"a{i}")
    cached = CachedRegistry(inner, clock, ttl_s=60.0, max_entries=4)  # an app and its links: 2 entries
    cached.get_app("a0")
    cached.get_app("a1")
    cached.get_app("a0")  # a0 used last: a1 goes first
    cached.get_app("a2")
    reads = inner.queries
    cached.get_app("a0")
    assert inner.queries == reads and cached.sizes[0] <= 4
    cached.get_app("a1")
    assert inner.queries == reads + 1


def test_ready_for_says_whether_choosing_an_apps_models_would_read_the_registry():
    """A query runs on the event loop only when its selection reads nothing: a copy past ttl + max_stale (the
    registry hung or down) would read on the loop and hold every query there."""
    from clipper.frontend.query import QueryProcessor
    from clipper.frontend.results import QueryTicket
    from tests.fakes import InMemoryReplies, ListQueue

    clock, registry = FakeClock(), OneQueryRegistry()
    registry.apps["digits"] = digits_app()
    registry.links["digits"] = ["mlp"]
    registry.versions[("mlp", "1")] = model_version()
    registry.active["mlp"] = "1"
    runner = ManualRunner()
    cached = CachedRegistry(registry, clock, ttl_s=2, refresh=runner, max_stale_s=2)
    processor = QueryProcessor(cached, ListQueue(), InMemoryReplies(), clock, lambda: 1, inline=True)

    def inline_now() -> bool:
        ticket = QueryTicket()
        processor.admit("digits", {"input": [0.0] * 64}, ticket)
        return processor.can_inline(ticket)

    assert cached.ready_for("digits") is False  # nothing held yet
    cached.active_version("mlp")  # the model's version read first...
    clock.advance(3)
    cached.linked_models("digits")  # ... the app and its links 3 s later (entries age apart)
    assert cached.ready_for("digits") is False  # whether the model has a canary is not known yet
    clock.advance(-3)
    cached.canary("mlp")
    clock.advance(3)
    assert cached.ready_for("digits") and inline_now()
    # the registry hangs: the version's reload (it was stale) never completes, the runner's task never runs
    clock.advance(1.5)  # the app is fresh, the version past ttl + max_stale but its reload in flight: held
    assert cached.ready_for("digits") and inline_now()
    clock.advance(RELOAD_PATIENCE_S)  # the reload outlived the patience: choosing would read the registry
    assert cached.get_app_nowait("digits") is not None
    assert cached.ready_for("digits") is False and inline_now() is False


def test_held_first_model_is_ready_for_with_what_it_found():
    """The common query's lane asks once what ``ready_for`` and three lookups would answer: it must say None
    wherever ``ready_for`` says False (a read would follow), and otherwise give what the lookups give."""
    from clipper.core.domain import Canary

    clock, registry = FakeClock(), OneQueryRegistry()
    registry.apps["digits"] = digits_app()
    registry.links["digits"] = ["mlp", "tree"]
    for name in ("mlp", "tree"):
        registry.versions[(name, "1")] = model_version(name, "1")
        registry.active[name] = "1"
    registry.versions[("mlp", "2")] = model_version("mlp", "2")
    runner = ManualRunner()
    cached = CachedRegistry(registry, clock, ttl_s=2, refresh=runner, max_stale_s=2)

    def agrees() -> bool:
        held = cached.held_first_model("digits")
        if not cached.ready_for("digits"):
            return held is None
        found = (cached.linked_models("digits"), cached.active_version("mlp"), cached.canary("mlp"))
        return held == found

    assert cached.held_first_model("digits") is None and agrees()  # nothing held
    cached.linked_models("digits")
    cached.active_version("mlp")
    cached.canary("mlp")
    assert cached.held_first_model("digits") is None and agrees()  # the second model's entries are not held
    cached.active_version("tree")
    cached.canary("tree")
    assert cached.held_first_model("digits") is not None and agrees()
    # a canary on the first model: held only once the canary's version is
    registry.canaries["mlp"] = Canary("2", 0.1, 0.0)
    cached.invalidate()
    for name in ("mlp", "tree"):
        cached.linked_models("digits")
        cached.active_version(name)
        cached.canary(name)
    assert cached.held_first_model("digits") is None and agrees()
    cached.get_version("mlp", "2")
    held = cached.held_first_model("digits")
    assert held is not None and held[2] == Canary("2", 0.1, 0.0) and agrees()
    # the second model's entry past ttl + max stale with no reload in flight: a read would follow
    clock.advance(3)
    cached.active_version("mlp"), cached.canary("mlp"), cached.linked_models("digits"), cached.get_version("mlp", "2")
    runner.run()
    clock.advance(1.5)
    assert agrees()
    # an unknown application's links (a remembered miss): the lane leaves it to the general path's 404
    assert cached.held_first_model("nope") is None


def test_a_second_look_after_a_quiet_while_does_not_take_the_first_looks_reload_for_a_slow_registry():
    """The first query after a quiet while (the entry past ttl + max_stale) looks twice: the frontend's lane,
    then the general path. The first look starts a reload; the second saw it in flight and took the entry for
    current (a slow registry's patience), so the query went on with an application deleted meanwhile (a review
    helper: a model's answer 10 s after delete_app). A reload started within the bound still keeps it current."""
    inner, clock = world()
    runner = ManualRunner()
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner, max_stale_s=2)
    cached.get_app("digits")
    clock.advance(10.0)  # quiet: past the bound, within RELOAD_PATIENCE_S of it
    first = cached.get_app_held("digits")
    second = cached.get_app_held("digits")
    assert first[1] is False and second[1] is False and len(runner.tasks) == 1
    runner.run()
    assert cached.get_app_held("digits")[1] is True  # reloaded: current again
    clock.advance(2.5)  # past the ttl, within the bound: this look's reload is a slow registry's, if it lasts
    assert cached.get_app_held("digits")[1] is True and len(runner.tasks) == 1
    clock.advance(5.0)
    assert cached.get_app_held("digits")[1] is True  # still in flight: patient


def test_a_reload_asked_for_past_the_bound_and_again_within_it_keeps_the_entry_current_while_in_flight():
    """After a quiet while the first look's reload (past the bound: not patient) is still queued behind a slow
    registry when the query's recheck has refreshed the entry; the queries that follow ask for it again within the
    bound: that ask makes it patient, or every query past the bound would read the registry itself (the bursts of
    defaults of a saturated core). Found by a review helper."""
    inner, clock = world()
    runner = ManualRunner()  # nothing runs: the one reload stays in flight
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner, max_stale_s=2)
    cached.get_app("digits")
    clock.advance(10.0)
    assert cached.get_app_held("digits")[1] is False
    cached.reread_app("digits")  # the query's recheck
    seen = []
    for _ in range(10):  # a query every 0.5 s
        clock.advance(0.5)
        seen.append(cached.get_app_held("digits")[1])
    assert all(seen) and len(runner.tasks) == 1, seen


@dataclass
class ListingRegistry(OneQueryRegistry):
    """Also offers the list of application names (one scan), counted."""

    scans: int = 0
    during_scan: Callable[[], None] | None = None

    def app_names(self) -> list[str]:
        self.scans += 1
        names = sorted(self.apps)
        if self.during_scan is not None:
            self.during_scan()
        return names


def flooded(per_s: float = 3.0) -> tuple[ListingRegistry, FakeClock, ManualRunner, CachedRegistry]:
    inner, clock, runner = ListingRegistry(), FakeClock(), ManualRunner()
    inner.apps["digits"] = digits_app()
    cached = CachedRegistry(inner, clock, ttl_s=2.0, refresh=runner, unknown_reads_per_s=per_s)
    return inner, clock, runner, cached


def admitted(cached: CachedRegistry, name: str) -> bool:
    """A query's admission of a name the copy does not hold: True when the query is to read it itself (the
    general path's ``get_app``), False when it was answered ``NotFound`` at once."""
    try:
        app, _ = cached.get_app_held(name, admit=True)
    except NotFound:
        return False
    assert app is None
    return True


def unknown(cached: CachedRegistry, name: str) -> None:
    """A query for a name that does not exist, admitted and then read when the admission says so."""
    if admitted(cached, name):
        with pytest.raises(NotFound):
            cached.get_app(name)


def test_unknown_names_are_each_read_within_the_budget():
    inner, _, runner, cached = flooded(per_s=3.0)
    for i in range(3):
        unknown(cached, f"nope-{i}")
    assert inner.queries == 3 and inner.scans == 0 and not runner.tasks


def test_the_budget_is_taken_at_admission_so_queries_admitted_together_cannot_overrun_it():
    inner, _, runner, cached = flooded(per_s=3.0)
    let_in = [admitted(cached, f"nope-{i}") for i in range(50)]  # 50 admissions before any read ends
    assert let_in[:3] == [True] * 3  # the budget's reads; the rest read too until the list comes, then are 404s
    runner.run()
    assert [admitted(cached, f"more-{i}") for i in range(50)] == [False] * 50
    assert inner.queries == 0  # admissions read nothing themselves


def test_past_the_budget_names_missing_from_the_list_are_answered_without_their_own_read():
    inner, _, runner, cached = flooded(per_s=3.0)
    for i in range(3):
        unknown(cached, f"nope-{i}")
    inner.apps["elsewhere"] = digits_app(name="elsewhere")
    unknown(cached, "nope-3")  # over the budget, no list yet: read alone, the list asked for off the path
    assert inner.queries == 4 and len(runner.tasks) == 1
    runner.run()
    assert inner.scans == 1
    reads = inner.queries
    for i in range(4, 100):
        with pytest.raises(NotFound, match=f"nope-{i}"):
            cached.get_app_held(f"nope-{i}", admit=True)
    assert inner.queries == reads and inner.scans == 1 and not runner.tasks
    assert admitted(cached, "elsewhere")  # on the list: read, as any name under the budget
    assert cached.get_app("elsewhere").name == "elsewhere" and inner.queries == reads + 1
    assert cached.get_app_held("nope-x", admit=False) == (None, False)  # the lane's look decides nothing


def test_the_lanes_look_takes_no_read_of_the_budget():
    _, _, runner, cached = flooded(per_s=3.0)
    for i in range(10):
        assert cached.get_app_held(f"nope-{i}", admit=False) == (None, False)
    assert [admitted(cached, f"nope-{i}") for i in range(3)] == [True] * 3  # the budget whole for admissions
    assert not runner.tasks


def test_applications_being_added_are_each_found_however_many_a_second():
    inner, clock, runner, cached = flooded(per_s=3.0)
    for i in range(200):  # an application created and queried at once, 50 a second
        inner.apps[f"tenant-{i}"] = digits_app(name=f"tenant-{i}")
        assert admitted(cached, f"tenant-{i}")  # a found name gives its read back
        assert cached.get_app(f"tenant-{i}").name == f"tenant-{i}"
        clock.advance(0.02)
    assert inner.scans == 0 and not runner.tasks


def test_the_list_is_trusted_as_long_as_a_remembered_miss_and_read_again_at_half_of_it():
    inner, clock, runner, cached = flooded(per_s=3.0)
    for i in range(4):
        unknown(cached, f"nope-{i}")
    runner.run()  # the list at t=0
    clock.advance(0.4)  # 1.2 reads back: one is read, then the list (0.4 s old) answers
    unknown(cached, "again-0")
    assert not admitted(cached, "again-1") and not runner.tasks
    clock.advance(0.2)  # 0.6 s old: still answered from, and asked for again
    unknown(cached, "again-2")
    assert not admitted(cached, "again-3") and len(runner.tasks) == 1
    inner.apps["late"] = digits_app(name="late")  # added after the list was read
    clock.advance(0.5)  # 1.1 s old, its reload not run yet: not trusted, names are read
    for i in range(2):
        unknown(cached, f"more-{i}")
    reads = inner.queries
    assert admitted(cached, "more-2") and admitted(cached, "late")
    runner.run()  # the list again: now it has "late"
    assert admitted(cached, "late") and cached.get_app("late").name == "late"
    assert inner.queries == reads + 1


def test_invalidate_drops_the_list_and_what_a_scan_in_flight_read():
    inner, _, runner, cached = flooded(per_s=1.0)
    unknown(cached, "nope-0")
    assert admitted(cached, "nope-1") and len(runner.tasks) == 1  # the scan asked for

    def restored() -> None:  # (a restore of the registry while the scan runs): what it read is not kept
        inner.apps["restored"] = digits_app(name="restored")
        cached.invalidate()

    inner.during_scan = restored
    runner.run()
    inner.during_scan = None
    assert admitted(cached, "restored")  # no list: read
    assert len(runner.tasks) == 1
    runner.run()
    assert not admitted(cached, "nope-2") and admitted(cached, "restored")


def test_a_name_admitted_by_many_queries_at_once_is_charged_once_and_given_back_when_found():
    inner, clock, runner, cached = flooded(per_s=20.0)
    inner.apps["a"] = digits_app(name="a")
    assert all(admitted(cached, "a") for _ in range(64))  # 64 first queries at once: one token
    assert cached.get_app("a").name == "a"  # the first to read; the others find it held
    clock.advance(0.2)
    inner.apps["b"] = digits_app(name="b")  # created, then queried by 16 clients at once
    assert all(admitted(cached, "b") for _ in range(16))
    assert cached.get_app("b").name == "b"
    for i in range(19):  # the budget whole again: each name's token came back
        unknown(cached, f"nope-{i}")
    assert not runner.tasks and inner.scans == 0


def test_a_read_no_admission_charged_gives_nothing_back():
    inner, _, runner, cached = flooded(per_s=2.0)
    inner.apps["a"] = digits_app(name="a")
    assert admitted(cached, "nope-0")  # charged, its read not done yet
    assert cached.get_app("a").name == "a"  # read with no admission (a feedback's, say): no token made
    with pytest.raises(NotFound):
        cached.get_app("nope-0")
    assert admitted(cached, "nope-1") and not runner.tasks
    assert admitted(cached, "nope-2") and len(runner.tasks) == 1  # the budget spent: read, the list asked for


def test_invalidate_drops_a_list_read_before():
    inner, _, runner, cached = flooded(per_s=1.0)
    unknown(cached, "nope-0")
    unknown(cached, "nope-1")
    runner.run()
    assert not admitted(cached, "nope-2")  # answered from the list
    inner.apps["nope-2"] = digits_app(name="nope-2")
    cached.invalidate()
    assert admitted(cached, "nope-2")  # no list: read


def test_under_one_read_a_second_the_first_unknown_name_is_still_read():
    inner, _, runner, cached = flooded(per_s=0.5)
    unknown(cached, "nope-0")
    assert inner.queries == 1 and not runner.tasks


def test_without_a_budget_every_unknown_name_is_read():
    inner, _, runner, cached = flooded(per_s=0.0)
    for i in range(50):
        unknown(cached, f"nope-{i}")
    assert inner.queries == 50 and inner.scans == 0 and not runner.tasks


class GatedRegistry(OneQueryRegistry):
    """Each read waits at a gate the test opens, so reads can be caught in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)

    def app_and_links(self, name: str) -> tuple[Application, list[str]]:
        self.entered.release()
        assert self.gate.wait(5)
        return super().app_and_links(name)


def gated_world() -> tuple[GatedRegistry, FakeClock]:
    inner = GatedRegistry()
    inner.apps["digits"] = digits_app()
    inner.links["digits"] = ["mlp"]
    inner.versions[("mlp", "1")] = model_version("mlp", "1")
    inner.active["mlp"] = "1"
    return inner, FakeClock()


def in_threads(calls: list[Callable[[], object]]) -> tuple[list[threading.Thread], list[object]]:
    out: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as e:  # the test looks at what each caller got
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    return threads, out


def test_queries_that_reread_an_application_at_once_share_one_read():
    """After a quiet while every query rereads its application (``reread_app``): a burst of them must make one
    read, not one each (on the local stack, ~80 reads at the emulated DynamoDB and a second of defaults)."""
    inner, clock = gated_world()
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=ManualRunner())
    first, out = in_threads([lambda: cached.reread_app("digits")])
    assert inner.entered.acquire(timeout=5)  # the first read is in flight
    clock.advance(0.5)
    others, more = in_threads([lambda: cached.reread_app("digits") for _ in range(8)])
    deadline = time.monotonic() + 5
    while cached._flights.joined < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    inner.gate.set()
    for t in first + others:
        t.join(5)
    assert [getattr(a, "name", a) for a in out + more] == ["digits"] * 9
    assert inner.queries == 1


def test_a_read_started_longer_ago_than_the_ttl_is_not_joined():
    inner, clock = gated_world()
    cached = CachedRegistry(inner, clock, ttl_s=2)
    first, out = in_threads([lambda: cached.get_app("digits")])
    assert inner.entered.acquire(timeout=5)
    clock.advance(2.5)  # the read in flight began before what a fresh entry may be: a read of its own
    second, more = in_threads([lambda: cached.get_app("digits")])
    assert inner.entered.acquire(timeout=5)
    inner.gate.set()
    for t in first + second:
        t.join(5)
    assert inner.queries == 2 and cached._flights.joined == 0
    assert [getattr(a, "name", a) for a in out + more] == ["digits", "digits"]


def test_a_shared_read_shares_its_error_and_invalidate_forgets_reads_in_flight():
    inner, clock = gated_world()
    inner.down = True
    cached = CachedRegistry(inner, clock, ttl_s=2)
    first, out = in_threads([lambda: cached.get_app("digits")])
    assert inner.entered.acquire(timeout=5)
    joiners, joined = in_threads([lambda: cached.linked_models("digits")])  # the same read (APP#digits)
    deadline = time.monotonic() + 5
    while cached._flights.joined < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    cached.invalidate()  # a caller from now on reads again
    after, late = in_threads([lambda: cached.reread_app("digits")])
    assert inner.entered.acquire(timeout=5)
    inner.gate.set()
    for t in first + joiners + after:
        t.join(5)
    assert all(isinstance(x, Unavailable) for x in out + joined + late)
    assert cached._flights.joined == 1


@pytest.mark.parametrize("how", ["invalidate", "forget"])
def test_a_read_in_flight_when_the_copy_is_told_of_a_change_is_not_kept(how):
    """A read that began before a delete (the local stack's admin API tells the copy at once) must not put the
    deleted application back, fresh, when it ends after it."""
    inner, clock = gated_world()
    cached = CachedRegistry(inner, clock, ttl_s=2)
    first, out = in_threads([lambda: cached.get_app("digits")])
    assert inner.entered.acquire(timeout=5)  # read in flight, digits still there
    del inner.apps["digits"]
    cached.invalidate() if how == "invalidate" else cached.forget({"digits"})
    inner.gate.set()
    for t in first:
        t.join(5)
    assert getattr(out[0], "name", None) == "digits"  # the query that started before the delete
    clock.advance(0.5)
    with pytest.raises(NotFound):
        cached.get_app("digits")  # read again: not answered from what the earlier read yielded
    assert inner.queries == 2


def test_forget_drops_only_what_it_names():
    inner, clock = world()
    inner.apps["other"] = digits_app(name="other")
    inner.links["other"] = ["mlp"]
    cached = CachedRegistry(inner, clock, ttl_s=60)
    cached.get_app("digits"), cached.get_app("other")
    assert inner.queries == 2
    cached.forget({"digits"})
    assert cached.get_app("other").name == "other" and inner.queries == 2  # still held
    assert cached.get_app("digits").name == "digits" and inner.queries == 3  # read again


def test_an_earlier_reads_result_does_not_replace_a_later_one():
    inner, clock = world()
    cached = CachedRegistry(inner, clock, ttl_s=2)
    newer, older = digits_app(name="digits", policy="exp3"), digits_app(name="digits")
    generation, now = cached._generation, clock.now()
    cached._keep({("app", "digits"): newer}, now + 1.0, generation)
    cached._keep({("app", "digits"): older}, now, generation)  # began before the other, ended after it
    clock.advance(1.5)
    assert cached.get_app("digits").policy == "exp3" and inner.queries == 0


@dataclass
class AllDownRegistry(OneQueryRegistry):
    """Every read fails while ``down``."""

    def _check(self) -> None:
        if self.down:
            raise Unavailable("dynamodb down")

    def active_version(self, model: str):  # type: ignore[no-untyped-def]
        self._check()
        return super().active_version(model)

    def get_version(self, model: str, version: str):  # type: ignore[no-untyped-def]
        self._check()
        return super().get_version(model, version)

    def canary(self, model: str):  # type: ignore[no-untyped-def]
        self._check()
        return super().canary(model)


def test_while_the_registry_cannot_be_read_every_entry_held_is_answered_however_old(caplog):
    """A moto crash on the local stack (a user's review): an application queried again after a quiet spell had its
    links and its model's active version past the staleness bound, read on the query path, and failed; each query
    answered its default ('no model is linked', which was false) until the registry came back. Every kind of
    entry is now answered as held when its read fails; one log line a second says so."""
    _, clock = world()
    inner = AllDownRegistry()
    inner.apps["digits"] = digits_app()
    inner.links["digits"] = ["mlp"]
    inner.versions[("mlp", "1")] = model_version("mlp", "1")
    inner.versions[("mlp", "2")] = model_version("mlp", "2")
    inner.active["mlp"] = "1"
    runner = ManualRunner()
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner, max_stale_s=2)
    assert cached.linked_models("digits") == ["mlp"] and cached.active_version("mlp").version == "1"
    assert cached.canary("mlp") is None and cached.get_version("mlp", "2").version == "2"
    inner.down = True
    clock.advance(600.0)  # ten minutes without a query: every entry long past ttl + max_stale
    with caplog.at_level("WARNING", logger="clipper.core.registry_cache"):
        for _ in range(3):
            assert cached.get_app("digits").name == "digits" and cached.linked_models("digits") == ["mlp"]
            assert cached.active_version("mlp").version == "1" and cached.canary("mlp") is None
            assert cached.get_version("mlp", "2").version == "2"
    held = [r for r in caplog.records if "answered as last held" in r.getMessage()]
    # one a second for each kind of entry (app, links, active, canary, version) and line (a read failed: the first
    # query; held while failing: the rest), not one a query
    assert len(held) == 6
    with pytest.raises(Unavailable):
        cached.active_version("never-held")
    inner.down = False
    inner.active["mlp"] = "2"
    clock.advance(1.0)  # read again once it can be (a reload off the path succeeds): the registry's answer
    assert cached.active_version("mlp").version == "1"  # still failing: held, reloaded off the path
    runner.run()
    assert cached.active_version("mlp").version == "2"


def test_failing_background_reloads_write_one_line_a_second_not_one_a_reload(caplog):
    """With the registry refusing every read (moto killed), each entry's reload failed and logged a line: 58 lines
    in a bench-faults run of a few seconds. Now one a second (the next names how many more failed)."""
    from clipper.core.registry_cache import BackgroundReloads

    reloads = BackgroundReloads(lambda task: task(), "registry reload failed", fresh_s=2.0)

    def refused() -> None:
        raise Unavailable("dynamodb.Query(registry): EndpointConnectionError")

    with caplog.at_level("WARNING", logger="clipper.core.registry_cache"):
        for key in range(50):
            reloads.submit(("links", f"app-{key}"), refused)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["registry reload failed: dynamodb.Query(registry): EndpointConnectionError"]


def test_after_a_failed_read_queries_answer_what_is_held_without_waiting_on_reads_of_their_own():
    """bench-faults' aws-emulator-killed: moto restarting answered 503s that botocore retried for ~2 s, and each
    query whose entries were past the bound (and its recheck of the application, ``reread_app``) waited on that
    read, answered with its default at its deadline. Once one read has failed, the copy answers what it holds,
    however old, and reloads it off the path; the first reload that succeeds ends it."""
    inner, clock = world()
    runner = ManualRunner()
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner, max_stale_s=2)
    cached.get_app("digits")
    inner.down = True
    clock.advance(60.0)  # past the bound, no reload in flight: the first query reads, and its read fails
    with pytest.raises(Unavailable):  # (the query's recheck answers the application held)
        cached.reread_app("digits")
    reads = inner.queries
    for _ in range(5):  # ... and the next ones read nothing on their path
        assert cached.reread_app("digits").name == "digits" and cached.linked_models("digits") == ["mlp"]
    assert inner.queries == reads
    assert len(runner.tasks) == 1  # one reload off the path for the application and its links
    runner.run()  # it fails: still failing
    assert cached.reread_app("digits").name == "digits" and inner.queries == reads + 1
    inner.down = False
    runner.run()  # this one succeeds: reads on the query path again when the bound says so
    clock.advance(60.0)
    reads = inner.queries
    assert cached.reread_app("digits").name == "digits" and inner.queries == reads + 1
    assert runner.tasks == []


def test_a_failure_long_ago_does_not_stand_for_an_outage_now():
    """A review: one failed read (a throttle, a malformed key of a made-up name) made the copy answer held entries
    without reading until some reload succeeded, which, with no query for an hour, none did: the hour-old entry
    of an application deleted meanwhile was answered, its recheck (``reread_app``) skipped. The failure now
    counts for the copy's staleness bound after it ended, and not against a read started later that succeeded."""
    inner, clock = world()
    runner = ManualRunner()
    cached = CachedRegistry(inner, clock, ttl_s=2, refresh=runner, max_stale_s=2)
    cached.get_app("digits")
    inner.down = True
    with pytest.raises(Unavailable):
        cached.get_app("never-held")
    inner.down = False
    assert cached.reread_app("digits").name == "digits" and inner.queries == 2  # within the window: held
    clock.advance(3600.0)
    del inner.apps["digits"]
    with pytest.raises(NotFound):  # the window is over: read, and found deleted
        cached.reread_app("digits")
    assert inner.queries == 3


def test_a_read_started_before_a_success_that_fails_after_it_does_not_bring_the_outage_back():
    from clipper.core.registry_cache import FailureWindow

    clock = FakeClock()
    window = FailureWindow(4.0, clock.now)
    outage_read = clock.now()
    clock.advance(1.0)
    window.succeeded(clock.now())  # a reload started later succeeded first
    clock.advance(1.0)
    window.failed(outage_read)  # the earlier read's failure comes in after it
    assert not window.failing()
    window.failed(clock.now())
    assert window.failing()
    clock.advance(4.0)
    assert not window.failing()  # aged out


def test_a_query_that_joins_a_read_does_not_report_its_outcome_as_its_own():
    """A review of the failure window: a query that joined another's read (SingleFlight) reported the read's failure
    with its own start time, so a read started in the outage, failing after a later reload had succeeded, brought
    the outage back through its joiner. The flight's own read reports it, from its start."""
    import threading
    import time

    inner, clock = world()
    gate, slow = threading.Event(), set()

    class Gated(OneQueryRegistry):
        def app_and_links(self, name: str) -> tuple[Application, list[str]]:
            if threading.get_ident() in slow:  # the read started in the outage: fails late
                gate.wait(5)
                raise Unavailable("dynamodb: read timed out")
            return super().app_and_links(name)

    gated = Gated(apps=inner.apps, links=inner.links, versions=inner.versions, active=inner.active)
    runner = ManualRunner()
    cached = CachedRegistry(gated, clock, ttl_s=2, refresh=runner, max_stale_s=2)
    cached.get_app("digits")
    clock.advance(10.0)

    def leader() -> None:
        slow.add(threading.get_ident())
        with pytest.raises(Unavailable):
            cached.reread_app("digits")  # read A, started at t=10 (the outage)

    errors: list[Exception] = []

    def joiner() -> None:
        try:
            cached.reread_app("digits")  # t=11: joins A's flight
        except Unavailable as e:
            errors.append(e)

    a = threading.Thread(target=leader)
    a.start()
    time.sleep(0.2)
    clock.advance(0.5)
    cached._reload_in_background(("app", "digits"))
    runner.run()  # reload B, started at t=10.5, succeeds
    clock.advance(0.5)
    c = threading.Thread(target=joiner)
    c.start()
    time.sleep(0.2)
    gate.set()
    a.join()
    c.join()
    assert errors and cached._flights.joined == 1
    assert not cached._reloads.failing  # A started before B succeeded: its failure does not count


def test_a_clock_stepped_back_does_not_hold_the_failure_window_open():
    from clipper.core.registry_cache import FailureWindow

    clock = FakeClock()
    window = FailureWindow(4.0, clock.now)
    window.failed(clock.now())
    assert window.failing()
    clock.advance(-3600.0)  # the wall clock stepped back an hour
    assert not window.failing()
