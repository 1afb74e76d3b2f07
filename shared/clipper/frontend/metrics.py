"""Serving metrics of the query path, as CloudWatch embedded-metric-format (EMF) lines through
Powertools: latency, default outputs, and the prediction cache's hits and misses per model (the hit
ratio is hits / (hits + misses) of the ``model`` dimension)."""

from __future__ import annotations

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from clipper.frontend.query import QueryResult


class EmfQueryMetrics:
    def __init__(self, namespace: str = "Clipper") -> None:
        self._namespace = namespace

    def _emit(self, name: str, unit: MetricUnit, value: float, **dimensions: str) -> None:
        with single_metric(name=name, unit=unit, value=value, namespace=self._namespace, default_dimensions=dimensions):
            pass

    def __call__(self, app: str, result: QueryResult, seconds: float) -> None:
        self._emit("QueryLatency", MetricUnit.Milliseconds, seconds * 1000, app=app)
        self._emit("Queries", MetricUnit.Count, len(result.predictions), app=app)
        defaults = sum(1 for p in result.predictions if p.default)
        self._emit("DefaultOutputs", MetricUnit.Count, defaults, app=app)
        for model, (hits, misses) in result.cache_by_model.items():
            self._emit("CacheHits", MetricUnit.Count, hits, model=model)
            self._emit("CacheMisses", MetricUnit.Count, misses, model=model)
