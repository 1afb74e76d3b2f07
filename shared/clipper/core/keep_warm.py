"""Keeping what queries used recently fresh while no query comes (the registry copy's entries, the bandit states),
so the first queries after a quiet spell read nothing on their path.

A copy reloads an entry off the query path when a query finds it past its TTL (stale-while-revalidate); past twice
the TTL a query reads it itself first (``clipper.core.registry_cache``). After a few seconds with no query, then, the
first queries of a burst each waited for the registry: on the local stack, where the emulated DynamoDB runs at its
background niceness on the core those queries also need, for 60-90 ms (``python -m bench.frontdoor.sched``: a step
from 3 s idle to 1,000 q/s defaulted its first 57-93 queries, the core shared by the frontend and moto's reads).
With ``KeepWarm`` a thread reloads, every ``every_s``, each entry used within ``keep_s`` that is ``reload_age_s``
old or older, through the copy's own background reloads. Useful where the process keeps running between queries
(the local stack); a Lambda function is frozen between invocations, so there it stays off (``keep_s`` 0).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

from clipper.ports import Clock

logger = logging.getLogger(__name__)


class KeepWarm:
    def __init__(
        self,
        clock: Clock,
        keep_s: float,
        every_s: float,
        reload_age_s: float,
        bound_s: float,
        age_of: Callable[[Any, float], float | None],
        reload: Callable[[Any, bool], None],
        name: str,
    ) -> None:
        """``age_of(key, now)``: how old the held value of ``key`` is (None: not held, or a remembered miss);
        ``reload(key, patient)``: reload it off the query path, ``patient`` while the value is within ``bound_s``
        (the owner's staleness bound: a reload asked for past it must not make the value usable again while in
        flight, ``clipper.core.registry_cache.BackgroundReloads.usable``)."""
        self._clock, self._keep, self._every, self._reload_age = clock, keep_s, every_s, reload_age_s
        self._bound = bound_s
        self._age_of, self._reload = age_of, reload
        self._used: dict[Hashable, float] = {}  # key -> when a query last used it
        self._stop = threading.Event()
        # the thread holds this object weakly: it ends once its copy is gone (tests make many), or on ``stop``
        self._thread = threading.Thread(
            target=_run, args=(weakref.ref(self), every_s, self._stop), name=name, daemon=True
        )
        self._started = False
        self._lock = threading.Lock()

    def touch(self, key: Hashable, now: float) -> None:
        """A query used ``key`` now (one dict write: on every query's path)."""
        self._used[key] = now
        if not self._started:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                self._thread.start()

    def tick(self, now: float) -> int:
        """Reload what was used within ``keep_s`` and is ``reload_age_s`` old or older; forget what was not used
        for longer. Returns how many reloads it asked for."""
        asked = 0
        for key, used in list(self._used.items()):
            if now - used >= self._keep:
                last = self._used.pop(key, used)
                if last != used:  # used again meanwhile: kept
                    self._used.setdefault(key, last)
                continue
            age = self._age_of(key, now)
            if age is not None and age >= self._reload_age:
                self._reload(key, age < self._bound)
                asked += 1
        return asked

    def forget(self) -> None:
        self._used.clear()

    def stop(self) -> None:
        self._stop.set()


def _run(ref: weakref.ref[KeepWarm], every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        warm = ref()
        if warm is None:
            return
        try:
            warm.tick(warm._clock.now())
        except Exception:  # a bug, on a thread where nothing else would report it; the next tick tries again
            logger.exception("keeping entries warm failed")
        del warm
