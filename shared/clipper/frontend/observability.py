"""Logs and traces of each query: the query id as the logs' correlation id, and X-Ray annotations for the
application and the models (annotations are indexed: a trace can be searched by ``app`` or ``model``).

The tracer is Powertools' ``Tracer``, created only where tracing is on: constructing it imports the X-Ray SDK
(~0.35 s measured here), a cost a cold start should pay only where traces are recorded. Powertools disables
tracing outside Lambda, under SAM local and with ``POWERTOOLS_TRACE_DISABLED``; ``tracing_enabled`` applies
the same rule before the SDK is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from clipper.core.domain import ModelVersion


class Annotations(Protocol):
    """What the frontend asks of a tracer (Powertools' ``Tracer`` is one)."""

    def put_annotation(self, key: str, value: Any) -> None: ...


class ContextLogger(Protocol):
    """What the frontend asks of a logger (Powertools' ``Logger`` is one): keys added to every line the
    current query logs (per thread and task: concurrent queries under uvicorn keep their own)."""

    def thread_safe_append_keys(self, **additional_keys: object) -> None: ...


_TRUE = {"1", "true", "yes", "on"}


def tracing_enabled(env: Mapping[str, str]) -> bool:
    """Powertools' own rule: traced in Lambda (``LAMBDA_TASK_ROOT``), not under SAM local, not when
    ``POWERTOOLS_TRACE_DISABLED`` is true."""
    if env.get("POWERTOOLS_TRACE_DISABLED", "").lower() in _TRUE:
        return False
    return bool(env.get("LAMBDA_TASK_ROOT")) and not env.get("AWS_SAM_LOCAL")


def make_tracer(service: str, env: Mapping[str, str]) -> Any:
    """Powertools' ``Tracer`` where tracing is on, else ``None`` (and the X-Ray SDK is not imported)."""
    if not tracing_enabled(env):
        return None
    from aws_lambda_powertools import Tracer

    return Tracer(service=service)


class QueryCorrelation:
    """A ``QueryListener``: the query id becomes the correlation id of every log line of the query (the
    library's loggers included, when they share the Powertools handler), and the trace gets ``app`` and
    ``model`` annotations."""

    def __init__(self, logger: ContextLogger, tracer: Annotations | None = None) -> None:
        self._logger = logger
        self._tracer = tracer

    def started(self, app: str, query_id: int) -> None:
        self._logger.thread_safe_append_keys(correlation_id=str(query_id), app=app)
        if self._tracer is not None:
            self._tracer.put_annotation("app", app)
            self._tracer.put_annotation("query_id", str(query_id))

    def selected(self, app: str, models: list[ModelVersion]) -> None:
        names = ",".join(f"{m.name}:{m.version}" for m in models)
        self._logger.thread_safe_append_keys(models=names)
        if self._tracer is not None:
            self._tracer.put_annotation("model", names)
