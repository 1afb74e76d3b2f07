"""One read in flight per key, however many threads ask for it at once (the registry copy's reads on a query's
path: ``CachedRegistry``).

Without it, every query that found its application past the copy's staleness bound read the registry itself: on
the local stack, a step from idle to 1,000 queries a second meant a read per query at the emulated DynamoDB (at
its background niceness, on the one core the frontend's queries also need) until the first of them came back,
which took longer the more of them there were: ~80 reads and a whole second of defaults ("still reading the
application"). A caller now joins a read of its key that started recently enough (``started_after``) and takes
its result, or its error; otherwise it reads, and whoever asks meanwhile joins it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Flight(Generic[T]):
    __slots__ = ("done", "error", "result", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None


def _copy(error: Exception) -> Exception:
    """The leader's error for one joiner: an exception of its class with its arguments and attributes, so no two
    threads raise (and add their frames to the traceback of) one object. Made without calling ``__init__``,
    whose signature is the class's own (``NotFound(kind, name)``)."""
    try:
        copy = type(error).__new__(type(error), *error.args)
        copy.args = error.args
        copy.__dict__.update(error.__dict__)
    except Exception:  # an exception class that cannot be made so: the shared one
        return error
    return copy


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[Hashable, _Flight[T]] = {}
        self.joined = 0  # callers that took another's read (for tests and the curious)

    def run(self, key: Hashable, load: Callable[[], T], now: float, started_after: float) -> T:
        """``load()``'s result, or that of a load of ``key`` in flight that started at or after
        ``started_after`` (its error raised here too); ``now`` is when this one would start."""
        with self._lock:
            flight = self._flights.get(key)
            leader = flight is None or flight.started < started_after
            if leader:
                flight = self._flights[key] = _Flight(now)
            else:
                self.joined += 1
        assert flight is not None
        if not leader:
            flight.done.wait()
            if flight.error is None:
                return flight.result  # type: ignore[return-value]
            if not isinstance(flight.error, Exception):  # the leader was interrupted (exit): read for itself
                return self.run(key, load, now, started_after)
            raise _copy(flight.error) from flight.error
        try:
            flight.result = load()
            return flight.result
        except BaseException as e:
            flight.error = e
            raise
        finally:
            with self._lock:
                if self._flights.get(key) is flight:
                    del self._flights[key]
            flight.done.set()

    def forget(self) -> None:
        """No caller from now on joins a load that started before (those in flight still end for their callers)."""
        with self._lock:
            self._flights.clear()
