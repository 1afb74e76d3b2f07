"""Batch-size controllers: they take (batch size, latency) observations and give the next maximum
batch size. Pure: no clock, no I/O.

``AimdController`` is Clipper's additive-increase/multiplicative-decrease as its authors ran it: start at
1; after each batch, latency under 0.9 x SLO adds 2, between 0.9 x SLO and the SLO holds, at or over the
SLO multiplies by 0.9 (at least 1). ``FixedController`` keeps a size the user chose (adaptation off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class BatchSizeController(Protocol):
    def max_batch_size(self) -> int: ...

    def observe(self, batch_size: int, latency_s: float) -> None: ...


@dataclass
class FixedController:
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("batch size must be at least 1")

    def max_batch_size(self) -> int:
        return self.size

    def observe(self, batch_size: int, latency_s: float) -> None:
        return None


@dataclass
class AimdController:
    slo_s: float
    size: float = 1.0
    additive: float = 2.0
    backoff: float = 0.9
    hold_fraction: float = 0.9
    upper: int = 1024

    def __post_init__(self) -> None:
        if self.slo_s <= 0:
            raise ValueError("the SLO must be positive")
        self.size = min(max(1.0, self.size), float(self.upper))

    def max_batch_size(self) -> int:
        return max(1, min(self.upper, math.floor(self.size)))

    def observe(self, batch_size: int, latency_s: float) -> None:
        if latency_s >= self.slo_s:
            self.size = max(1.0, self.size * self.backoff)
        elif latency_s < self.hold_fraction * self.slo_s and batch_size >= self.max_batch_size():
            # Grow only after a full batch: a small batch under the SLO says nothing about a bigger one.
            self.size = min(float(self.upper), self.size + self.additive)
