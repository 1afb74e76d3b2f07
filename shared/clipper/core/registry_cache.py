"""A warm container's short-lived copy of the registry, so a query does not read DynamoDB every time.

Entries are trusted for ``ttl_s`` seconds (the frontend's config refresh interval). Memory is bounded
whatever clients send: at most ``max_entries`` entries, least recently used first out; misses (``NotFound``:
an unknown application name in a URL) are remembered apart, at most ``max_negative`` of them, for
``negative_ttl_s`` only. An application and its links are one item collection (``APP#<app>``), read by one
query when the registry offers ``app_and_links``; so are a model's active version, its canary and the canary's
version, when it offers ``model_record``.

With a ``refresh`` runner (e.g. a one-thread executor's ``submit``), an entry older than ``ttl_s`` is
still answered while it is reloaded off the query path (stale-while-revalidate), so no query waits for a
registry read after the first: a version switch then reaches a frontend within ``ttl_s`` plus one
reload. Only an entry older than ``ttl_s + max_stale_s`` (a reload keeps failing, or no query came for a
while) is reloaded on the query path, as without a runner; not while its reload is still in flight (for up to
``RELOAD_PATIENCE_S`` more): a registry slow to answer would answer the query's read no sooner, and every query
meanwhile would make one of its own (on a saturated core, the local stack's emulated DynamoDB at its background
niceness took over 2 s, and the queries waiting on their reads in that time were answered with their defaults).

Names the copy does not hold are read one by one (so an application added a moment ago is found). With
``unknown_reads_per_s`` (the local stack's frontend, where one process serves every request) a query's admission
takes a token for such a read (one a name: the admissions of a name already charged, its read not settled yet,
take none); past that rate (a flood of made-up names: each read held a worker thread, the
registry and the GIL the event loop needs for every other query), a name missing from the registry's list of
application names, read within ``negative_ttl_s`` (as long as a remembered miss), is answered ``NotFound`` without
a read of its own. A read (or a look) that finds its application gives its token back, so applications being
added, however many and however often queried at once, are each read; only during a flood can one added in the last
``negative_ttl_s`` be missed, as a remembered miss can. The list is read (one keys-only scan of the registry, off
the query path) only while over that rate.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable
from functools import partial
from typing import Any, TypeVar

from clipper.core.domain import Application, Canary, ModelRecord, ModelVersion
from clipper.core.keep_warm import KeepWarm
from clipper.core.log_sampling import SampledLog
from clipper.core.single_flight import SingleFlight
from clipper.errors import ClipperError, NotFound, Unavailable
from clipper.ports import Clock, Registry

Key = tuple[str, ...]
T = TypeVar("T")
# A model without a canary, as an entry (None would read as "not held")
_NO_CANARY = object()

logger = logging.getLogger(__name__)

# Names charged a token and not settled yet: an admission that never read its name (none is known) cannot grow them
MAX_PENDING = 1024

# How much longer than ``ttl_s + max_stale_s`` an entry whose reload is in flight is still answered. A reload that
# fails or ends in that time ends it sooner; one that hangs longer leaves the next read to the query path.
RELOAD_PATIENCE_S = 30.0


class ReadBudget:
    """A token bucket: ``per_s`` reads a second, up to ``max(1, per_s)`` at once after a quiet while."""

    def __init__(self, per_s: float, now: float) -> None:
        self._per_s, self._cap = per_s, max(1.0, per_s)
        self._tokens, self._at = self._cap, now
        self._lock = threading.Lock()

    def _refill(self, now: float) -> None:
        self._tokens = min(self._cap, self._tokens + max(0.0, now - self._at) * self._per_s)
        self._at = now

    def take(self, now: float) -> bool:
        """One read's token, if one is left now."""
        with self._lock:
            self._refill(now)
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True

    def give_back(self, now: float) -> None:
        with self._lock:
            self._refill(now)
            self._tokens = min(self._cap, self._tokens + 1.0)


def _model_entries(record: ModelRecord) -> dict[Key, object]:
    name, head = record.head.name, record.head
    active = record.versions.get(head.active_version)
    entries: dict[Key, object] = {
        ("active", name): active or NotFound("model version", f"{name}:{head.active_version}"),
        ("canary", name): head.canary or _NO_CANARY,
    }
    if head.canary is not None and head.canary.version in record.versions:
        entries[("version", name, head.canary.version)] = record.versions[head.canary.version]
    return entries


def _absent(e: NotFound) -> NotFound:
    """``e`` as an entry: the thing read does not exist. A missing table or queue (``NotFound("resource")``: a
    deployment fault, or the local stack's emulator restarting with its state not restored yet) says nothing of
    the application or model, so it is raised as the registry being unavailable: the copy keeps answering what
    it held (while a reload fails), and nothing is remembered as missing (every query of an existing application
    was a 404, "unknown application", for the seconds the emulator took to come back)."""
    if e.kind == "resource":
        raise Unavailable(f"registry unavailable: {e}") from e
    return e


def held_app(registry: Registry, name: str) -> tuple[Application | None, bool]:
    """The application as ``registry`` holds it without a read (None: a registry that reads every time, or a copy
    that never held it; a remembered miss, or a name the copy answers from its list of names, raises ``NotFound``),
    and whether it is current (``CachedRegistry.get_app_held``, an admission). A plain registry holds nothing."""
    held = getattr(registry, "get_app_held", None)
    if held is None:
        return None, True
    app, current = held(name, admit=True)
    return app, current


def reread_app(registry: Registry, name: str) -> Application:
    """The application read from the registry itself: past a copy's held entry (``CachedRegistry.reread_app``),
    which it keeps; a plain registry's ``get_app``."""
    reread = getattr(registry, "reread_app", None)
    app: Application = reread(name) if reread is not None else registry.get_app(name)
    return app


class FailureWindow:
    """Whether a source is failing now: a read of it failed (``Unavailable``) within the last ``window_s`` (since
    it ended), and no read started after the failed one has succeeded. The window ages out (one failure long ago,
    a throttled read, a malformed key, must not stand for an outage hours later: a read then decides again); a
    read's outcome counts only against reads started before it (a read started in an outage that fails after
    a later one succeeded does not bring the outage back)."""

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self._window, self._clock = window_s, clock
        self._lock = threading.Lock()
        self._failed: tuple[float, float] | None = None  # the last failed read's start and end
        self._succeeded = -math.inf  # the start of the latest read that succeeded

    def failing(self) -> bool:
        failed = self._failed
        # (a clock stepped back before the failure's end: not failing, or the window would last as long as the step)
        return failed is not None and 0 <= self._clock() - failed[1] < self._window

    def failed(self, started: float) -> None:
        with self._lock:
            if started >= self._succeeded and (self._failed is None or started >= self._failed[0]):
                self._failed = (started, self._clock())

    def succeeded(self, started: float) -> None:
        with self._lock:
            self._succeeded = max(self._succeeded, started)
            if self._failed is not None and started >= self._failed[0]:
                self._failed = None


class BackgroundReloads:
    """Reloads handed to a ``runner`` (e.g. a one-thread executor's ``submit``), at most one in flight per key
    however many callers ask; what a reload raises is logged as ``what`` (the stale value stays, and the next
    caller past its TTL asks again). It also says how old a value may be answered (``usable``): fresh for
    ``fresh_s``, then stale while reloaded for ``stale_s`` more (``fresh_s`` when None), and past that while a
    reload started within that time is in flight (a slow source, ``submit``'s ``patient``).

    It also says whether the source is ``failing`` (``FailureWindow``): a read of it (a reload, or a read on a
    caller's path run through ``counted``) failed with ``Unavailable`` within the last
    ``fresh_s + stale_s``, and none started later has succeeded. While it is, an owner answers what it holds,
    however old, without reading on a caller's path, and reloads it off the path (each such reload that fails
    renews the window; the first that succeeds ends it). A source that fails slowly (the local stack's emulator
    restoring its tables answered 503s that botocore retried with back-off for ~2 s; a DynamoDB that hangs)
    otherwise held every query past the bound for one failing read of its own, answered with its default at its
    deadline. Reads that say nothing of the entries (the list of names, ``submit``'s ``health=False``) do not
    count."""

    def __init__(
        self,
        runner: Callable[[Callable[[], None]], Any],
        what: str,
        fresh_s: float,
        stale_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._runner, self._what, self._fresh = runner, what, fresh_s
        self._bound = fresh_s + (fresh_s if stale_s is None else stale_s)
        # key -> whether its reload in flight keeps the value usable past the bound (``submit``'s ``patient``)
        self._in_flight: dict[Any, bool] = {}
        self._lock = threading.Lock()
        # a failing source fails every entry's reload: one line a second says so (with how many more failed)
        self._failures_log = SampledLog(logger)
        self._clock = clock
        self._health = FailureWindow(self._bound, clock)

    @property
    def failing(self) -> bool:
        """Whether the source is failing now (``FailureWindow.failing``)."""
        return self._health.failing()

    def counted(self, started: float, read: Callable[[], T]) -> T:
        """``read()``, started at ``started``, its outcome counted for whether the source is failing: a reload's,
        or a read on a caller's path (the read itself, not a caller that joined it)."""
        try:
            value = read()
        except Unavailable:
            self._health.failed(started)
            raise
        self._health.succeeded(started)
        return value

    @property
    def bound_s(self) -> float:
        """``fresh_s + stale_s``: a reload asked for within it is ``patient``."""
        return self._bound

    def keep_warm(
        self,
        clock: Clock,
        keep_s: float,
        age_of: Callable[[Any, float], float | None],
        reload: Callable[[Any, bool], None],
        name: str,
    ) -> KeepWarm | None:
        """A ``KeepWarm`` for the values these reloads serve (ticks at half their freshness, reloads what is as
        old as it), or None without ``keep_s`` or a freshness."""
        if keep_s <= 0 or self._fresh <= 0:
            return None
        return KeepWarm(clock, keep_s, self._fresh / 2, self._fresh, self._bound, age_of, reload, name)

    def usable(self, key: Any, age_s: float) -> bool:
        """Whether a value ``age_s`` old may still be answered: within ``fresh_s + stale_s``, or within
        ``RELOAD_PATIENCE_S`` past that while a reload started within it is in flight (the source is slow, not
        the value gone). A reload started once the value was past the bound (no caller came for a while) does
        not keep it: a second look then must not take the first look's reload for a slow source."""
        if age_s < self._bound:
            return True
        if age_s >= self._bound + RELOAD_PATIENCE_S:
            return False
        with self._lock:
            return self._in_flight.get(key, False)

    def submit(
        self,
        key: Any,
        reload: Callable[[], object],
        inline_when_shut_down: bool = False,
        patient: bool = True,
        health: bool = True,
    ) -> None:
        """Run ``reload`` on the runner unless one for ``key`` is in flight. When the runner is shut down
        (interpreter exit): run it here (``inline_when_shut_down``), or leave it to the next caller.
        ``patient``: the value was usable when its reload was asked for, so it stays usable while the reload is
        in flight (``usable``); False for a value already past the bound. ``health``: its outcome says whether
        the source is failing."""
        with self._lock:
            if key in self._in_flight:  # asked for again: a patient ask makes the one in flight patient
                self._in_flight[key] = self._in_flight[key] or patient
                return
            self._in_flight[key] = patient

        def guarded() -> None:
            try:
                if health:
                    self.counted(self._clock(), reload)
                else:
                    reload()
            except ClipperError as e:
                self._failures_log.warning(type(e).__name__, "%s: %s", self._what, e)
            except Exception:  # a bug, on a background thread where nothing else would report it
                logger.exception("%s", self._what)
            finally:
                with self._lock:
                    self._in_flight.pop(key, None)

        try:
            self._runner(guarded)
        except RuntimeError:  # the runner is shut down
            if inline_when_shut_down:
                guarded()
            else:
                with self._lock:
                    self._in_flight.pop(key, None)


class CachedRegistry:
    def __init__(
        self,
        inner: Registry,
        clock: Clock,
        ttl_s: float,
        refresh: Callable[[Callable[[], None]], Any] | None = None,
        max_stale_s: float | None = None,
        max_entries: int = 4096,
        max_negative: int = 1024,
        negative_ttl_s: float = 1.0,
        unknown_reads_per_s: float = 0.0,
        keep_warm_s: float = 0.0,
    ) -> None:
        """``unknown_reads_per_s``: reads a second, of application names the copy does not hold, that admissions
        (``get_app_held``) allow before a name is answered from the registry's list of names (0: every such name
        is read; it needs a ``refresh`` runner and a registry that offers ``app_names``). ``keep_warm_s``: entries a
        query used within it are reloaded off the path while no query comes (``clipper.core.keep_warm``; it needs
        a ``refresh`` runner), so the first queries after a quiet spell read nothing."""
        self._inner = inner
        self._clock = clock
        self._errors_log = SampledLog(logger, clock=clock.now)  # at most a line a second for each kind of entry
        self._ttl = ttl_s
        self._refresh = refresh
        self._max_entries = max_entries
        self._max_negative = max_negative
        self._negative_ttl = min(ttl_s, negative_ttl_s)
        self._entries: OrderedDict[Key, tuple[float, object]] = OrderedDict()
        self._negative: OrderedDict[Key, tuple[float, NotFound]] = OrderedDict()
        self._reloads = (
            BackgroundReloads(refresh, "registry reload failed", ttl_s, max_stale_s, clock.now)
            if refresh is not None
            else None
        )
        self._lock = threading.Lock()
        self._app_and_links: Callable[[str], tuple[Application, list[str]]] | None = getattr(
            inner, "app_and_links", None
        )
        # a model's active version, its canary and the canary's version: one read where the registry offers it
        self._model_record: Callable[[str], ModelRecord] | None = getattr(inner, "model_record", None)
        # the registry's application names (when, what), read while unknown names come faster than the budget
        self._app_names: Callable[[], list[str]] | None = getattr(inner, "app_names", None)
        self._names: tuple[float, frozenset[str]] | None = None
        # invalidate() and forget() move it on: what a read started before them yields is not kept (the list of
        # names included), or a read in flight at a delete would put the deleted application back, fresh
        self._generation = 0
        self._budget = (  # the list is trusted for as long as a miss is remembered: none, no list
            ReadBudget(unknown_reads_per_s, clock.now())
            if unknown_reads_per_s > 0 and refresh is not None and self._app_names is not None and self._negative_ttl
            else None
        )
        self._pending: set[str] = set()  # names whose admission took a token, until a read settles it
        # reads on a caller's path: one in flight a read, joined by whoever asks within ttl_s of its start
        self._flights: SingleFlight[dict[Key, object]] = SingleFlight()
        self._warm = (
            self._reloads.keep_warm(
                clock, keep_warm_s, self._age_of, self._reload_in_background, "clipper-registry-warm"
            )
            if self._reloads is not None
            else None
        )

    # -- loading -----------------------------------------------------------------------------------------
    def _load(self, key: Key) -> dict[Key, object]:
        """The entries one read yields (a NotFound is an entry too: an application, a model or a version that does
        not exist; a missing table is not one, ``_absent``)."""
        kind, name = key[0], key[1]
        if kind in ("app", "links") and self._app_and_links is not None:
            try:
                app, links = self._app_and_links(name)
            except NotFound as e:
                return {("app", name): _absent(e), ("links", name): e}
            return {("app", name): app, ("links", name): links}
        if kind in ("active", "canary") and self._model_record is not None:
            try:
                record = self._model_record(name)
            except NotFound as e:
                return {("active", name): _absent(e), ("canary", name): _NO_CANARY}
            return _model_entries(record)
        loaders: dict[str, Callable[[], object]] = {
            "app": lambda: self._inner.get_app(name),
            "links": lambda: self._inner.linked_models(name),
            "active": lambda: self._inner.active_version(name),
            "version": lambda: self._inner.get_version(name, key[2]),
            "canary": lambda: self._inner.canary(name) or _NO_CANARY,
        }
        try:
            return {key: loaders[kind]()}
        except NotFound as e:
            return {key: _absent(e)}

    def _store(self, key: Key, at: float) -> None:
        generation = self._generation
        self._keep(self._load(key), at, generation)

    def _read_now(self, key: Key, now: float) -> dict[Key, object]:
        """``key``'s read on the caller's path, kept: this caller's own, or one that another caller started within
        ``ttl_s`` (what it yields is as recent as a fresh entry's), whose result it takes (``SingleFlight``)."""

        def load() -> dict[Key, object]:  # the flight's own read: its outcome counted once, from its start
            generation = self._generation
            read = partial(self._load, key)
            loaded = self._reloads.counted(now, read) if self._reloads is not None else read()
            self._keep(loaded, now, generation)
            return loaded

        loaded = self._flights.run(self._read_of(key), load, now, now - self._ttl)
        if self._warm is not None and not isinstance(loaded.get(key), NotFound):
            self._warm.touch(key, now)  # a query's read of what exists: what the next ones will use
        return loaded

    def _keep(self, loaded: dict[Key, object], at: float, generation: int) -> None:
        """Keep what a read started at ``at`` yielded, unless the copy was invalidated since it started
        (``generation``), and entry by entry unless a read started later is held already."""
        with self._lock:
            if generation != self._generation:
                return
            for k, v in loaded.items():
                held = self._entries.get(k) or self._negative.get(k)
                if held is not None and held[0] > at:
                    continue
                if isinstance(v, NotFound):
                    self._entries.pop(k, None)
                    self._negative[k] = (at, v)
                    self._negative.move_to_end(k)
                    while len(self._negative) > self._max_negative:
                        self._negative.popitem(last=False)
                else:
                    self._negative.pop(k, None)
                    self._entries[k] = (at, v)
                    self._entries.move_to_end(k)
                    while len(self._entries) > self._max_entries:
                        self._entries.popitem(last=False)

    def _read_of(self, key: Key) -> Key:
        """The read that loads ``key`` (``_load``): an application and its links are one read where the registry
        offers ``app_and_links``, a model's active version and canary one where it offers ``model_record``; one
        reload of it is in flight at a time, whichever of its entries asked."""
        kind = key[0]
        if kind in ("app", "links") and self._app_and_links is not None:
            return ("app+links", key[1])
        if kind in ("active", "canary") and self._model_record is not None:
            return ("model", key[1])
        return key

    def _reload_in_background(self, key: Key, patient: bool = True) -> None:
        """``patient``: the entry was usable when asked (``BackgroundReloads.submit``)."""
        assert self._reloads is not None
        read = self._read_of(key)
        self._reloads.submit(read, lambda: self._store(key, self._clock.now()), True, patient)

    def _cached(self, key: Key, now: float) -> object | None:
        """The entry's value (a ``NotFound`` for a remembered miss) if fresh enough, else None."""
        with self._lock:
            missing = self._negative.get(key)
            if missing is not None:
                if now - missing[0] < self._negative_ttl:
                    return missing[1]
                del self._negative[key]
            hit = self._entries.get(key)
            if hit is None or not self._usable(key, now - hit[0]):
                return None
            self._entries.move_to_end(key)
        if self._warm is not None:
            self._warm.touch(key, now)
        if now - hit[0] >= self._ttl:
            self._reload_in_background(key)
        return hit[1]

    def _age_of(self, key: Hashable, now: float) -> float | None:
        hit = self._entries.get(key)  # type: ignore[call-overload]
        return None if hit is None else now - hit[0]

    def _usable(self, key: Key, age_s: float) -> bool:
        if self._reloads is None:
            return age_s < self._ttl
        return self._reloads.usable(self._read_of(key), age_s)

    def _get(self, key: Key) -> Any:
        now = self._clock.now()
        value = self._cached(key, now)
        if value is None:
            value = self._held_while_failing(key, now)
        if value is None:
            try:
                value = self._read_now(key, now)[key]
            except Unavailable as e:
                value = self._held_on_error(key, now, e)
        if self._pending and key[0] == "app":
            self._settle(key[1], not isinstance(value, NotFound), now)
        if isinstance(value, NotFound):
            raise value
        return value

    def _held_on_error(self, key: Key, now: float, error: Unavailable) -> object:
        """The entry this copy holds for ``key``, however old, while the registry cannot be read (stale-if-error);
        ``error`` when it holds none. Nothing can change the registry while it is unreadable, so what the copy
        held is still what it says: a model's links and active version past ``ttl_s + max_stale_s`` (no query
        for a while) were read on the query path and failed, and each query answered its default ('no model is
        linked') for as long as the registry stayed down, though its application was answered as held."""
        with self._lock:
            hit = self._entries.get(key)
        if hit is None:
            raise error
        self._errors_log.warning(
            key[0], "registry unreadable: %s answered as last held (%.0f s old): %s", key, now - hit[0], error
        )
        return hit[1]

    def _held_while_failing(self, key: Key, now: float) -> object | None:
        """The entry held for ``key``, however old, while the registry is failing (``FailureWindow``): not read
        on the caller's path, reloaded off it (a reload that succeeds ends the outage); None when the registry is
        not failing, or nothing is held."""
        if self._reloads is None or not self._reloads.failing:
            return None
        with self._lock:
            hit = self._entries.get(key)
        if hit is None:
            return None
        self._reload_in_background(key, patient=False)
        self._errors_log.warning(
            ("failing", key[0]),
            "registry failing: %s answered as last held (%.0f s old), reloaded off the path",
            key,
            now - hit[0],
        )
        return hit[1]

    @property
    def sizes(self) -> tuple[int, int]:
        """(entries, remembered misses) held now."""
        return len(self._entries), len(self._negative)

    def get_app_nowait(self, name: str) -> Application | None:
        """The application as this copy knows it, without a read (a remembered miss raises ``NotFound``); None
        when it never held it (no admission: the budget of unknown names is not asked, ``get_app_held``). An entry past
        ``ttl_s + max_stale_s`` is answered too (and reloaded off the path when a runner is set): a query needs
        its application's deadline and default output to be answered in time while the registry cannot be read,
        even if the query itself then waits for the registry."""
        return self.get_app_held(name)[0]

    def get_app_held(self, name: str, admit: bool = False) -> tuple[Application | None, bool]:
        """``get_app_nowait``'s answer, and whether it is current: fresh, or stale within ``max_stale_s`` while
        reloaded, or past that while a reload queries already started is still in flight (the registry is slow,
        not the entry forgotten: every query would otherwise read it itself, on a saturated core the defaults'
        cause). A query or a feedback acting on an entry that is not current (no query came for a while: a policy
        change, a delete or a new incarnation may have been made meanwhile) reads the application first
        (``reread_app``). Decided from one look, before the reload this answer may start. A name the copy does
        not hold is (None, False), or, with ``admit`` (a query's or a feedback's admission, once per request) past
        the budget of such reads, ``NotFound`` when the registry's recent list of names lacks it."""
        value = self._cached(("app", name), self._clock.now())
        current = value is not None
        if value is None:
            with self._lock:
                hit = self._entries.get(("app", name))
            if hit is None:
                if admit and self._absent_by_list(name):
                    raise NotFound("application", name)
                return None, False
            if self._refresh is not None:  # past the bound: this reload does not make it current (a second look)
                self._reload_in_background(("app", name), patient=False)
            value = hit[1]
        if isinstance(value, NotFound):
            raise value
        return value, current  # type: ignore[return-value]

    def _absent_by_list(self, name: str) -> bool:
        """Whether ``name``, held neither as an entry nor as a miss, is answered ``NotFound`` without a read of its
        own: no read's token is left (else this admission takes one: the query reads the name) and the registry's
        list of names, read within ``negative_ttl_s``, lacks it. Past the budget the list is read again off the path
        once it is half that old; until it comes, names are read one by one."""
        if self._budget is None:
            return False
        now = self._clock.now()
        with self._lock:
            if name in self._pending:
                return False  # charged already: one token a name, whatever the admissions meanwhile
        if self._budget.take(now):
            with self._lock:
                if len(self._pending) >= MAX_PENDING:
                    self._pending.clear()
                self._pending.add(name)
            return False
        names, trusted_s = self._names, self._negative_ttl
        if names is None or now - names[0] >= trusted_s / 2:
            assert self._reloads is not None
            self._reloads.submit(("app names",), self._load_names, False, True, health=False)
        return names is not None and now - names[0] < trusted_s and name not in names[1]

    def _settle(self, name: str, found: bool, now: float) -> None:
        """``name`` was read, or looked at once held: its admission's token comes back when it exists (a read that
        no admission charged gives none back)."""
        assert self._budget is not None
        with self._lock:
            charged = name in self._pending
            self._pending.discard(name)
        if charged and found:
            self._budget.give_back(now)

    def _load_names(self) -> None:
        assert self._app_names is not None
        with self._lock:
            generation = self._generation
        at = self._clock.now()  # before the scan: its age is never understated
        names = frozenset(self._app_names())
        with self._lock:
            if generation == self._generation:
                self._names = (at, names)

    def reread_app(self, name: str) -> Application:
        """The application read from the registry now (with its links), kept in this copy, whatever reload is in
        flight (``NotFound`` when it no longer exists: remembered as a miss). Callers at once share one read: a
        reread another caller started within ``ttl_s`` is taken (``_read_now``). While the registry is failing,
        the application held is answered without a read (``_held_while_failing``)."""
        now = self._clock.now()
        held = self._held_while_failing(("app", name), now)
        value = held if held is not None else self._read_now(("app", name), now)[("app", name)]
        if isinstance(value, NotFound):
            raise value
        return value  # type: ignore[return-value]

    def ready_for(self, app: str) -> bool:
        """Whether choosing the models of ``app`` reads nothing from the registry now: its links and each linked
        model's active version and canary (and the canary's version) are held (fresh, or stale within
        ``max_stale_s`` and reloading off the path). A
        query that would read the registry must not run on the event loop: a hung registry would hold the loop,
        and with it every other query and the watchdog that answers late ones with their default."""
        now = self._clock.now()
        links = self._cached(("links", app), now)
        if links is None:
            return False
        if isinstance(links, NotFound):
            return True  # answered at once, from memory
        return all(self._held(m, now) is not None for m in links)  # type: ignore[attr-defined]

    def held_first_model(self, app: str) -> tuple[list[str], ModelVersion, Canary | None] | None:
        """``ready_for(app)``'s check, with what it found: the linked models, and the first one's active version
        and canary, as ``linked_models``, ``active_version`` and ``canary`` would answer them without a read;
        None when any of them would read or raise (the caller then asks them, or goes the general way)."""
        now = self._clock.now()
        held = self._cached(("links", app), now)
        if held is None or isinstance(held, NotFound) or not held:
            return None
        links: list[str] = held  # type: ignore[assignment]
        first = self._held(links[0], now)
        if first is None or any(isinstance(entry, NotFound) for entry in first):
            return None
        if not all(self._held(m, now) is not None for m in links[1:]):
            return None
        active, canary = first
        return list(links), active, None if canary is _NO_CANARY else canary  # type: ignore[return-value]

    def _held(self, model: str, now: float) -> tuple[object, object] | None:
        """The cached entries for ``model``'s active version and canary (either may be a cached ``NotFound``),
        or None when answering either would read: one of them is not held, or the canary's version is not."""
        active = self._cached(("active", model), now)
        canary = self._cached(("canary", model), now)
        if active is None or canary is None:
            return None
        if isinstance(canary, Canary) and self._cached(("version", model, canary.version), now) is None:
            return None
        return active, canary

    # -- the Registry port -------------------------------------------------------------------------------
    def get_app(self, name: str) -> Application:
        app: Application = self._get(("app", name))
        return app

    def linked_models(self, app: str) -> list[str]:
        return list(self._get(("links", app)))

    def active_version(self, model: str) -> ModelVersion:
        version: ModelVersion = self._get(("active", model))
        return version

    def get_version(self, model: str, version: str) -> ModelVersion:
        mv: ModelVersion = self._get(("version", model, version))
        return mv

    def canary(self, model: str) -> Canary | None:
        canary = self._get(("canary", model))
        return None if canary is _NO_CANARY else canary

    @property
    def uncached(self) -> Registry:
        """The registry this copies, read directly (where the copy may be behind what was written after it)."""
        return self._inner

    def invalidate(self) -> None:
        with self._lock:
            self._entries.clear()
            self._negative.clear()
            self._names, self._generation = None, self._generation + 1
        self._flights.forget()

    def forget(self, names: Collection[str]) -> None:
        """Drop what this copy holds of these applications and models (a change made to them elsewhere in this
        process: the local stack's admin API), so the next query reads them; what else it holds stays. A read in
        flight now is not kept (``invalidate``'s rule)."""
        names = set(names)
        with self._lock:
            for k in [k for k in self._entries if k[1] in names]:
                del self._entries[k]
            for k in [k for k in self._negative if k[1] in names]:
                del self._negative[k]
            self._names, self._generation = None, self._generation + 1
        self._flights.forget()
