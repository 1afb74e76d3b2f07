"""Log lines a query's path writes once per query while something is wrong, written at most once a key every
interval: the first at once, then one an interval, naming how many like it were left out since the one before.

In an outage every query meets the same trouble (Redis down: ``cache unavailable``; a model too slow: ``default
output``), and a line per query was a line per query: a frontend answering 1,000 queries a second wrote 1,000 a
second, ~26 us of CPU each on a core the queries already lack, and on AWS each is paid as CloudWatch Logs
ingestion. The answers themselves still name their cause (``default_explanation``) and the metrics still count
every one; the log keeps one line an interval for each key (what went wrong, for which application)::

    log = SampledLog(logger, every_s=1.0)
    log.warning(("cache", app.name), "cache unavailable: %s", e)

A line after left-out ones carries ``left_out`` (the count) in its extra fields and says it in its text. The keys
are bounded (the oldest forgotten first), so made-up names cannot grow them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

EVERY_S = 1.0  # at most one line a key a second
MAX_KEYS = 1024


class SampledLog:
    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_KEYS,
    ) -> None:
        if every_s < 0 or max_keys < 1:
            raise ValueError("every_s must not be negative and max_keys must be at least 1")
        self._logger = logger
        self._every = every_s
        self._clock = clock
        self._max_keys = max_keys
        self._lock = threading.Lock()
        self._keys: dict[Hashable, list[float]] = {}  # key -> [when the next line may be written, left out since]

    def log(self, level: int, key: Hashable, msg: str, *args: Any, extra: dict[str, Any] | None = None) -> bool:
        """Write the line unless one with ``key`` was written less than the interval ago (then count it); whether
        it was written."""
        if not self._logger.isEnabledFor(level):
            return False
        now = self._clock()
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None and now < entry[0]:
                entry[1] += 1
                return False
            left_out = int(entry[1]) if entry is not None else 0
            if entry is not None:
                del self._keys[key]  # written again: the newest key, the last to be forgotten
            elif len(self._keys) >= self._max_keys:
                del self._keys[next(iter(self._keys))]
            self._keys[key] = [now + self._every, 0]
        if left_out:
            msg = f"{msg} ({left_out} more like it since the last such line, not logged)"
            extra = {**(extra or {}), "left_out": left_out}
        self._logger.log(level, msg, *args, extra=extra)
        return True

    def info(self, key: Hashable, msg: str, *args: Any, extra: dict[str, Any] | None = None) -> bool:
        return self.log(logging.INFO, key, msg, *args, extra=extra)

    def warning(self, key: Hashable, msg: str, *args: Any, extra: dict[str, Any] | None = None) -> bool:
        return self.log(logging.WARNING, key, msg, *args, extra=extra)
