"""Serving metrics of the query path: CloudWatch embedded-metric-format (EMF) lines, and
Clipper's in-process registry behind ``GET /metrics``.

EMF, one line per dimension set and query: by ``app`` the query latency, queries (throughput), default
outputs (the default rate is DefaultOutputs / Queries) and each stage's time (``<Stage>Latency``: validate,
select, cache, enqueue, wait, combine, record); by ``service`` the queries and default outputs across
applications (the template's default-rate alarm); by ``model`` the prediction cache's hits and misses (the
hit ratio is hits / (hits + misses)), the model's errors (no output because the model failed: an error reply, no
reply within the SLO), its transport failures (no output because the frontend's own dependencies failed: the
request queue, the reply channel, the prediction cache, such as Redis down or SQS refusing the send; no model's
error) and its stages (send, queue, batch wait, inference, reply) and batch size. The in-process registry keeps
the same figures as Clipper named them (``app:<app>:*``, ``model:<model>:<version>:*``; the transport failures
as ``model:<model>:<version>:num_transport_failures`` beside ``num_errors``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from clipper.frontend.results import QueryResult


def _metric_name(stage: str) -> str:
    return "".join(part.capitalize() for part in stage.split("_")) + "Latency"


class EmfQueryMetrics:
    """EMF lines written straight to stdout (Lambda ships them to CloudWatch Logs, which extracts the metrics).

    The lines are built here rather than through Powertools' metrics (whose validation per metric cost the
    query path ~12% of the frontend's CPU): one orjson dump per dimension set. ``POWERTOOLS_METRICS_DISABLED``
    (the local stack) turns them off, as it does Powertools', read when the metrics are made."""

    def __init__(self, namespace: str = "Clipper", service: str = "clipper-frontend", out: Any = None) -> None:
        self._namespace = namespace
        self._service = service
        self._out = out
        self.enabled = os.environ.get("POWERTOOLS_METRICS_DISABLED", "").lower() not in ("1", "true")

    def _line(self, dimension: tuple[str, str], values: list[tuple[str, str, float]], now_ms: int) -> bytes:
        """One EMF line: every metric in ``values`` under one dimension."""
        body: dict[str, Any] = {
            "_aws": {
                "Timestamp": now_ms,
                "CloudWatchMetrics": [
                    {
                        "Namespace": self._namespace,
                        "Dimensions": [[dimension[0]]],
                        "Metrics": [{"Name": name, "Unit": unit} for name, unit, _ in values],
                    }
                ],
            },
            dimension[0]: dimension[1],
        }
        for name, _, value in values:
            body[name] = value
        return orjson.dumps(body) + b"\n"

    def __call__(self, app: str, result: QueryResult, seconds: float) -> None:
        if not self.enabled:  # read once: a lookup in os.environ costs every query
            return
        ms, count = "Milliseconds", "Count"
        now_ms = int(time.time() * 1000)
        queries = len(result.predictions)
        defaults = sum(1 for p in result.predictions if p.default)
        by_app: list[tuple[str, str, float]] = [
            ("QueryLatency", ms, seconds * 1000),
            ("Queries", count, queries),
            ("DefaultOutputs", count, defaults),
        ]
        by_app += [(_metric_name(stage), ms, value) for stage, value in result.timings_ms.items()]
        lines = [
            self._line(("app", app), by_app, now_ms),
            # the same two across applications: template.yaml's default-output-rate alarm reads these
            self._line(
                ("service", self._service), [("Queries", count, queries), ("DefaultOutputs", count, defaults)], now_ms
            ),
        ]
        for model in result.models:
            _, hits, misses = result.cache_by_model.get(model, ("", 0, 0))
            values: list[tuple[str, str, float]] = [
                ("CacheHits", count, hits),
                ("CacheMisses", count, misses),
                ("ModelErrors", count, 1 if model in result.model_errors else 0),
                ("TransportFailures", count, 1 if model in result.transport_failures else 0),
            ]
            for stage, value in result.model_timings_ms.get(model, {}).items():
                if stage == "batch_size":
                    values.append(("BatchSize", count, value))
                else:
                    values.append((_metric_name(stage), ms, value))
            lines.append(self._line(("model", model), values, now_ms))
        out = self._out or sys.stdout
        out.write(b"".join(lines).decode())  # one write: lines of concurrent queries never interleave
        out.flush()


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

    def reset(self) -> None:
        """Forget everything (after a SnapStart restore: the snapshot's figures and clocks are not this
        container's)."""
        with self._lock:
            self.counters.clear()
            self.meters.clear()
            self.histograms.clear()

    def __call__(self, app: str, result: QueryResult, seconds: float) -> None:
        with self._lock:
            n = len(result.predictions)
            self.counters[f"app:{app}:num_predictions"] += n
            self.counters[f"app:{app}:default_predictions"] += sum(1 for p in result.predictions if p.default)
            self.meters[f"app:{app}:prediction_throughput"].mark(n)
            self.histograms[f"app:{app}:prediction_latency_ms"].add(seconds * 1000)
            for stage, value in result.timings_ms.items():
                self.histograms[f"app:{app}:{stage}_ms"].add(value)
            for model, (version, hits, misses) in result.cache_by_model.items():
                prefix = f"model:{model}:{version}"
                self.counters[f"{prefix}:cache_hits"] += hits
                self.counters[f"{prefix}:cache_misses"] += misses
                if model in result.model_errors:
                    self.counters[f"{prefix}:num_errors"] += 1
                for stage, value in result.model_timings_ms.get(model, {}).items():
                    self.histograms[f"{prefix}:{stage}" if stage == "batch_size" else f"{prefix}:{stage}_ms"].add(value)
            for model in result.transport_failures:  # (a late default has no cache figures: its versions say)
                self.counters[f"model:{model}:{result.versions.get(model, '')}:num_transport_failures"] += 1

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
