"""Batch-size controllers: they take (batch size, latency) observations and give the next maximum
batch size. Pure: no clock, no I/O; their state is a small dict that a store persists across cold starts.

- ``AimdController`` is Clipper's additive-increase/multiplicative-decrease as its authors ran it: start at
  1; after each batch, latency under 0.9 x SLO adds 2, between 0.9 x SLO and the SLO holds, at or over the
  SLO multiplies by 0.9 (at least 1). One refinement: it grows only after a full batch, since a small batch
  under the SLO says nothing about a bigger one (under light load the size would otherwise drift to the
  upper bound and the first burst would miss the SLO).
- ``QuantileController`` is Clipper's quantile-regression controller: it runs AIMD while it gathers samples
  (Clipper: 1,000), then fits the p99 batch latency as a linear function of the batch size by quantile
  regression (minimising the pinball loss: ``clipper.batching.quantile``) and sets the maximum size whose
  fitted p99 meets the SLO; it refits on a sliding window.
- ``FixedController`` keeps a size the user chose (adaptation off).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from clipper.batching.quantile import quantile_line


class BatchSizeController(Protocol):
    def max_batch_size(self) -> int: ...

    def observe(self, batch_size: int, latency_s: float) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


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

    def state(self) -> dict[str, Any]:
        return {"kind": "fixed", "size": self.size}

    def restore(self, state: dict[str, Any]) -> None:
        return None  # the user's choice wins over anything stored


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
            self.size = min(float(self.upper), self.size + self.additive)

    def state(self) -> dict[str, Any]:
        return {"kind": "aimd", "size": self.size}

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("kind") in ("aimd", "quantile") and isinstance(state.get("size"), int | float):
            self.size = min(max(1.0, float(state["size"])), float(self.upper))


@dataclass
class QuantileController:
    slo_s: float
    quantile: float = 0.99
    samples_needed: int = 1000
    refit_every: int = 100
    upper: int = 1024
    aimd: AimdController = field(init=False)
    samples: deque[tuple[int, float]] = field(init=False)
    fitted: int | None = None
    coefficients: tuple[float, float] | None = None
    _since_fit: int = 0

    def __post_init__(self) -> None:
        self.aimd = AimdController(slo_s=self.slo_s, upper=self.upper)
        self.samples = deque(maxlen=self.samples_needed)

    def max_batch_size(self) -> int:
        return self.fitted if self.fitted is not None else self.aimd.max_batch_size()

    def observe(self, batch_size: int, latency_s: float) -> None:
        self.samples.append((batch_size, latency_s))
        self.aimd.observe(batch_size, latency_s)
        self._since_fit += 1
        if len(self.samples) >= self.samples_needed and (self.fitted is None or self._since_fit >= self.refit_every):
            self._fit()
        if self.fitted is not None and latency_s >= self.slo_s:
            self.fitted = max(1, math.floor(self.fitted * 0.9))  # react at once; the next fit corrects

    def _fit(self) -> None:
        self._since_fit = 0
        sizes = np.array([s for s, _ in self.samples], dtype=float)
        lat = np.array([t for _, t in self.samples], dtype=float)
        if np.ptp(sizes) == 0:
            return  # all batches had one size: nothing to extrapolate from yet
        intercept, slope = quantile_line(sizes, lat, self.quantile)
        self.coefficients = (intercept, slope)
        self.fitted = self._size_for(intercept, slope)
        self.aimd.size = float(self.fitted)

    def _size_for(self, intercept: float, slope: float) -> int:
        """The largest batch whose fitted latency quantile is within this controller's SLO."""
        if slope <= 0:
            return self.upper if intercept < self.slo_s else 1
        return int(min(self.upper, max(1, math.floor((self.slo_s - intercept) / slope))))

    def state(self) -> dict[str, Any]:
        return {"kind": "quantile", "size": float(self.max_batch_size()), "coefficients": self.coefficients}

    def restore(self, state: dict[str, Any]) -> None:
        """Start from a saved (or the previous controller's) state: a fitted line gives the size for this
        controller's SLO and bound, which a settings change or a linked application's SLO may have moved (the
        saved size was for the old ones, and could then only shrink until a new fit, 1,000 batches away)."""
        self.aimd.restore(state)
        if state.get("kind") == "quantile" and state.get("coefficients"):
            intercept, slope = (float(x) for x in state["coefficients"])
            self.coefficients = (intercept, slope)
            self.fitted = self._size_for(intercept, slope)
            self.aimd.size = float(self.fitted)


def make_controller(kind: str, slo_s: float, batch_size: int = 0, upper: int = 1024) -> BatchSizeController:
    """``kind`` "fixed" (or ``batch_size`` > 0) fixes the size at ``batch_size`` (adaptation off); else ``kind`` is
    "aimd" or "quantile"."""
    if kind == "fixed" or batch_size > 0:
        return FixedController(batch_size)
    if kind == "aimd":
        return AimdController(slo_s=slo_s, upper=upper)
    if kind == "quantile":
        return QuantileController(slo_s=slo_s, upper=upper)
    raise ValueError(f"unknown batching controller {kind!r}: expected 'aimd', 'quantile' or 'fixed'")
