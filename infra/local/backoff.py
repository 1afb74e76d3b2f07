"""The supervisor's restart policy, apart from any process: exponential back-off, capped, with the crash count
starting again after a child ran long enough, and a crash-loop threshold from which a child is reported.

    Backoff().delay(1) == 0.5, delay(2) == 1.0, ... delay(n) == 30.0 (the cap)
"""

from __future__ import annotations

import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    stable_s: float = 30.0  # ran this long before it died: the next crash counts as the first
    report_after: int = 4  # crashes in a row from which a child is reported as crash-looping

    def delay(self, crashes: int) -> float:
        return float(min(self.max_s, self.first_s * self.factor ** max(0, crashes - 1)))


@dataclass
class RestartRecord:
    """What the status file says about one child, and its crash count (pure bookkeeping)."""

    restarts: int = 0
    crashes: int = 0  # exits in a row, each within Backoff.stable_s of its start
    last_exit: int | None = None
    last_restart: float | None = None

    def exited(self, code: int, ran_s: float, backoff: Backoff) -> float:
        """Record an exit after ``ran_s`` seconds of running; returns the wait before the restart."""
        self.last_exit = code
        self.crashes = 1 if ran_s >= backoff.stable_s else self.crashes + 1
        return backoff.delay(self.crashes)

    def restarted(self, at_epoch_s: float) -> None:
        self.restarts += 1
        self.last_restart = round(at_epoch_s, 3)

    def crash_looping(self, backoff: Backoff) -> bool:
        return self.crashes >= backoff.report_after


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
