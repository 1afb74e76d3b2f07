from __future__ import annotations

import time


class SystemClock:
    """Wall-clock time; deadlines cross processes and machines, so they are epoch based."""

    def now(self) -> float:
        return time.time()
