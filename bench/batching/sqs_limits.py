"""A queue with SQS's limits, in place of the in-memory pipe: at most 10 messages per receive, and every call
(receive, delete of up to 10, release) costs a latency drawn from a configurable distribution.

The calls sleep in the caller's thread: they cost the driver time, not CPU, as a network round trip does. A
receive pays its latency after it has taken its messages (those visible when it read the queue); a long poll
that ends empty, after its wait, pays nothing more (the driver then polls again). The default distribution
is log-normal with a median of 18 ms and a p99 of 50 ms (mean ~20 ms: the SQS developer guide's figure for
a request from EC2 in the same region, docs/latency-on-aws.md); ``--sqs-call-ms MEDIAN,P99`` sets it.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from bench.batching.ports import PipeQueue
from clipper.ports import ReceivedMessage

MAX_PER_RECEIVE = 10  # ReceiveMessage's MaxNumberOfMessages and DeleteMessageBatch's entries, at most
Z99 = 2.3263478740408408  # the standard normal's 99th percentile


@dataclass(frozen=True)
class CallLatency:
    """Log-normal latency of one queue API call, given by its median and p99 in ms (p99 == median: fixed)."""

    median_ms: float
    p99_ms: float

    def __post_init__(self) -> None:
        if self.median_ms < 0 or self.p99_ms < self.median_ms:
            raise ValueError(f"need 0 <= median <= p99, got {self.median_ms}, {self.p99_ms}")

    @classmethod
    def parse(cls, text: str) -> CallLatency:
        """``"18,50"`` (median, p99 in ms) or ``"18"`` (a fixed latency)."""
        parts = [float(p) for p in text.split(",")]
        return cls(parts[0], parts[1] if len(parts) > 1 else parts[0])

    @property
    def sigma(self) -> float:
        return math.log(self.p99_ms / self.median_ms) / Z99 if self.median_ms > 0 else 0.0

    def draw(self, rng: np.random.Generator) -> float:
        """One call's latency in seconds."""
        if self.median_ms == 0:
            return 0.0
        return float(self.median_ms * math.exp(self.sigma * rng.standard_normal())) / 1000

    def describe(self) -> str:
        return f"log-normal, median {self.median_ms:g} ms, p99 {self.p99_ms:g} ms"


class SqsLimitedQueue(PipeQueue):
    """``PipeQueue`` with SQS's limits (see the module docstring); counts its calls and their total latency,
    and apart the latency of acknowledgements (deletes and releases: the driver's acker thread makes them, off
    the batch path)."""

    def __init__(self, source: Connection, trial: int, latency: CallLatency, seed: int) -> None:
        super().__init__(source, trial)
        self._latency = latency
        self._rng = np.random.default_rng(seed)
        self._rng_lock = threading.Lock()
        self.calls = 0
        self.call_s = 0.0
        self.ack_s = 0.0

    def _call(self, ack: bool = False) -> None:
        with self._rng_lock:
            delay = self._latency.draw(self._rng)
            self.calls += 1
            self.call_s += delay
            if ack:
                self.ack_s += delay
        time.sleep(delay)

    def receive(self, max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        got = super().receive(min(max_messages, MAX_PER_RECEIVE), wait_s)
        if got or wait_s <= 0:
            self._call()
        return got

    def delete(self, receipt_handles: list[str]) -> None:
        for start in range(0, len(receipt_handles), MAX_PER_RECEIVE):
            self._call(ack=True)
            super().delete(receipt_handles[start : start + MAX_PER_RECEIVE])

    def release(self, receipt_handle: str, delay_s: int) -> None:
        self._call(ack=True)
        super().release(receipt_handle, delay_s)
