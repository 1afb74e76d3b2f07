"""What a batch of ``n`` rows will take: a least-squares line ``a + b * n`` over the recent batches of one
model. Pure, no clock: the batcher feeds it each batch's (rows, seconds) and asks it before cutting a batch.

It lets the batcher cut batches so that their queries can still meet their deadlines (a batch whose
earliest deadline falls before its predicted end is cut smaller; the rest waits for the next batch) and drop
queries that no batch could answer in time (only once ``fitted``). Until it has seen two batch sizes it
scales the mean latency up with the number of rows and never down (a cautious guess for bigger batches, the
mean for smaller ones).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class LatencyModel:
    window: int = 200
    margin: float = 1.1  # predictions are scaled up by this much: a cut batch should finish in time
    _samples: deque[tuple[int, float]] = field(init=False, repr=False)
    _sums: list[float] = field(init=False, repr=False)  # n, t, n*n, n*t over the window

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError("the window must hold at least two batches")
        self._samples = deque()
        self._sums = [0.0, 0.0, 0.0, 0.0]

    def __len__(self) -> int:
        return len(self._samples)

    def observe(self, rows: int, seconds: float) -> None:
        if rows < 1 or seconds < 0:
            return
        self._samples.append((rows, seconds))
        self._add(rows, seconds, 1.0)
        if len(self._samples) > self.window:
            old_rows, old_seconds = self._samples.popleft()
            self._add(old_rows, old_seconds, -1.0)

    def _add(self, n: int, t: float, sign: float) -> None:
        s = self._sums
        s[0] += sign * n
        s[1] += sign * t
        s[2] += sign * n * n
        s[3] += sign * n * t

    @property
    def fitted(self) -> bool:
        """Whether the window holds two batch sizes or more (a line, not a guess)."""
        count = len(self._samples)
        if count < 2:
            return False
        sn, _, snn, _ = self._sums
        mean_n = sn / count
        return snn / count - mean_n * mean_n > 1e-9 * max(1.0, mean_n * mean_n)

    def line(self) -> tuple[float, float] | None:
        """``(a, b)``, both at least 0, or None before any batch."""
        count = len(self._samples)
        if count == 0:
            return None
        sn, st, snn, snt = self._sums
        mean_n, mean_t = sn / count, st / count
        var_n = snn / count - mean_n * mean_n
        if var_n <= 1e-9 * max(1.0, mean_n * mean_n):  # one batch size so far
            return None if mean_n <= 0 else (0.0, max(0.0, mean_t) / mean_n)
        slope = max(0.0, (snt / count - mean_n * mean_t) / var_n)
        return max(0.0, mean_t - slope * mean_n), slope

    def predict(self, rows: int) -> float | None:
        """Seconds a batch of ``rows`` rows is expected to take (with the margin), or None before any batch."""
        count = len(self._samples)
        if count == 0:
            return None
        sn, st, snn, _ = self._sums
        mean_n, mean_t = sn / count, st / count
        if snn / count - mean_n * mean_n <= 1e-9 * max(1.0, mean_n * mean_n):
            return self.margin * mean_t * max(1.0, rows / mean_n)
        line = self.line()
        assert line is not None
        a, b = line
        return self.margin * (a + b * rows)

    def rows_within(self, seconds: float, upper: int) -> int:
        """The most rows (0 to ``upper``) whose batch is predicted to finish within ``seconds``."""
        if upper <= 0 or seconds <= 0:
            return 0
        if not self._samples:
            return upper  # nothing known yet: no cut
        full = self.predict(upper)
        if full is not None and full <= seconds:
            return upper
        lo, hi = 0, upper  # predict is non-decreasing in rows: bisect
        while lo < hi:
            mid = (lo + hi + 1) // 2
            p = self.predict(mid)
            if p is not None and p <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return lo
