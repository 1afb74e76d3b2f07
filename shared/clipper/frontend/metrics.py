"""Serving metrics of the query path: CloudWatch embedded-metric-format (EMF) lines through Powertools
(latency, default outputs, the prediction cache's hits and misses per model: the hit ratio is
hits / (hits + misses) of the ``model`` dimension), and Clipper's in-process registry behind
``GET /metrics``."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

import numpy as np
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from clipper.frontend.results import QueryResult


class EmfQueryMetrics:
    def __init__(self, namespace: str = "Clipper", service: str = "clipper-frontend") -> None:
        self._namespace = namespace
        self._service = service

    def _emit(self, name: str, unit: MetricUnit, value: float, **dimensions: str) -> None:
        with single_metric(name=name, unit=unit, value=value, namespace=self._namespace, default_dimensions=dimensions):
            pass

    def __call__(self, app: str, result: QueryResult, seconds: float) -> None:
        self._emit("QueryLatency", MetricUnit.Milliseconds, seconds * 1000, app=app)
        self._emit("Queries", MetricUnit.Count, len(result.predictions), app=app)
        defaults = sum(1 for p in result.predictions if p.default)
        self._emit("DefaultOutputs", MetricUnit.Count, defaults, app=app)
        # the same two across applications: template.yaml's default-output-rate alarm reads these
        self._emit("Queries", MetricUnit.Count, len(result.predictions), service=self._service)
        self._emit("DefaultOutputs", MetricUnit.Count, defaults, service=self._service)
        for model, (_, hits, misses) in result.cache_by_model.items():
            self._emit("CacheHits", MetricUnit.Count, hits, model=model)
            self._emit("CacheMisses", MetricUnit.Count, misses, model=model)


class _Meter:
    def __init__(self, window_s: float = 60.0) -> None:
        self.count = 0
        self._window = window_s
        self._recent: deque[float] = deque()
        self._start = time.monotonic()

    def mark(self, n: int = 1) -> None:
        now = time.monotonic()
        self.count += n
        self._recent.extend([now] * n)
        while self._recent and now - self._recent[0] > self._window:
            self._recent.popleft()

    def report(self) -> dict[str, float]:
        now = time.monotonic()
        while self._recent and now - self._recent[0] > self._window:
            self._recent.popleft()
        elapsed = max(now - self._start, 1e-9)
        return {
            "count": self.count,
            "rate_1m": len(self._recent) / min(self._window, elapsed),
            "mean_rate": self.count / elapsed,
        }


class _Histogram:
    def __init__(self, size: int = 1028) -> None:
        self._values: deque[float] = deque(maxlen=size)  # the most recent values (a sliding reservoir)
        self.count = 0

    def add(self, value: float) -> None:
        self._values.append(value)
        self.count += 1

    def report(self) -> dict[str, float]:
        if not self._values:
            return {"count": 0}
        xs = np.asarray(self._values)
        p50, p95, p99 = np.percentile(xs, [50, 95, 99])
        return {
            "count": self.count,
            "p50": float(p50),
            "p95": float(p95),
            "p99": float(p99),
            "mean": float(xs.mean()),
            "min": float(xs.min()),
            "max": float(xs.max()),
        }


class InProcessMetrics:
    """Clipper's metrics registry, as its ``GET /metrics`` reported it: counters, meters (with rates) and
    histograms named ``app:<app>:*`` and ``model:<model>:<version>:*``. One per process (in Lambda, per
    warm container: the EMF metrics in CloudWatch are the fleet-wide view)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.meters: defaultdict[str, _Meter] = defaultdict(_Meter)
        self.histograms: defaultdict[str, _Histogram] = defaultdict(_Histogram)

    def __call__(self, app: str, result: QueryResult, seconds: float) -> None:
        with self._lock:
            n = len(result.predictions)
            self.counters[f"app:{app}:num_predictions"] += n
            self.counters[f"app:{app}:default_predictions"] += sum(1 for p in result.predictions if p.default)
            self.meters[f"app:{app}:prediction_throughput"].mark(n)
            self.histograms[f"app:{app}:prediction_latency_ms"].add(seconds * 1000)
            for model, (version, hits, misses) in result.cache_by_model.items():
                self.counters[f"model:{model}:{version}:cache_hits"] += hits
                self.counters[f"model:{model}:{version}:cache_misses"] += misses
            if result.model and "model_inference_ms" in result.timings_ms:
                prefix = f"model:{result.model}:{result.version}"
                self.histograms[f"{prefix}:inference_ms"].add(result.timings_ms["model_inference_ms"])
                self.histograms[f"{prefix}:batch_size"].add(result.timings_ms.get("model_batch_size", 1.0))

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {
                "counters": [{name: value} for name, value in sorted(self.counters.items())],
                "meters": [{name: m.report()} for name, m in sorted(self.meters.items())],
                "histograms": [{name: h.report()} for name, h in sorted(self.histograms.items())],
            }


class Observers:
    """Several observers of each query (EMF lines and the in-process registry)."""

    def __init__(self, *observers: Callable[[str, QueryResult, float], None]) -> None:
        self._observers = observers

    def __call__(self, app: str, result: QueryResult, seconds: float) -> None:
        for observe in self._observers:
            observe(app, result, seconds)
