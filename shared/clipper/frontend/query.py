"""The query path's core: validate, select, enqueue, wait for replies until the deadline, answer.

It never raises for a model failure: a model that fails, is slow or cannot be reached yields the
application's default output with an explanation. It raises ``NotFound`` for an unknown application and
``InvalidInput`` for bad input, before anything is sent to a model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clipper.core.domain import Application, ModelVersion
from clipper.core.messages import QueryMessage, Reply, encode_rows, output_value
from clipper.core.validation import DEFAULT_MAX_BATCH, QueryInput, validate_query
from clipper.errors import ClipperError, NotFound, Unavailable
from clipper.ports import ClaimStore, Clock, Registry, ReplyChannel, RequestQueue

logger = logging.getLogger(__name__)

# Time kept back from the SLO for answering the client after the wait for replies ends.
ANSWER_MARGIN_S = 0.002


@dataclass
class Prediction:
    query_id: int
    output: Any
    default: bool
    default_explanation: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"query_id": self.query_id, "output": self.output, "default": self.default}
        if self.default_explanation is not None:
            out["default_explanation"] = self.default_explanation
        return out


@dataclass
class QueryResult:
    """What ``predict`` answers: one prediction per input, in order."""

    predictions: list[Prediction]
    batch: bool
    model: str | None = None
    version: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self, debug: bool = False) -> dict[str, Any]:
        body: dict[str, Any]
        if self.batch:
            body = {"batch_predictions": [p.as_dict() for p in self.predictions]}
        else:
            body = self.predictions[0].as_dict()
        if debug:
            body["debug"] = {"model": self.model, "version": self.version, "timings_ms": self.timings_ms}
        return body


class QueryProcessor:
    def __init__(
        self,
        registry: Registry,
        queue: RequestQueue,
        replies: ReplyChannel,
        clock: Clock,
        new_query_id: Callable[[], int],
        claims: ClaimStore | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self._registry = registry
        self._queue = queue
        self._replies = replies
        self._clock = clock
        self._new_id = new_query_id
        self._claims = claims
        self._max_batch = max_batch

    def predict(self, app_name: str, body: Any) -> QueryResult:
        start = self._clock.now()
        app = self._registry.get_app(app_name)
        query = validate_query(app, body, self._max_batch)
        deadline = start + app.slo_seconds
        timings: dict[str, float] = {"validate": (self._clock.now() - start) * 1000}
        first_id = self._new_id()
        ids = [first_id + i for i in range(query.count)]

        def fallback(why: str, model: ModelVersion | None = None) -> QueryResult:
            logger.info("default output", extra={"app": app.name, "query_id": first_id, "reason": why})
            preds = [Prediction(i, app.default_output, True, why) for i in ids]
            return QueryResult(
                preds, query.batch, model.name if model else None, model.version if model else None, timings
            )

        try:
            model = self._select(app)
        except ClipperError as e:
            return fallback(f"no model to serve the query: {e}")
        if model is None:
            return fallback(f"no model is linked to application '{app.name}'")
        t = self._clock.now()
        timings["select"] = (t - start) * 1000 - timings["validate"]
        name = f"model {model.name}:{model.version}"
        try:
            self._enqueue(app, model, query, first_id, deadline)
        except Unavailable as e:
            return fallback(f"{name}: queue unavailable ({e})", model)
        t2 = self._clock.now()
        timings["enqueue"] = (t2 - t) * 1000
        try:
            replies = self._replies.wait(str(first_id), 1, deadline - ANSWER_MARGIN_S - t2)
        except Unavailable as e:
            return fallback(f"{name}: reply channel unavailable ({e})", model)
        timings["wait"] = (self._clock.now() - t2) * 1000
        if not replies:
            slo_ms = app.latency_slo_micros / 1000
            return fallback(f"{name}: timeout, no reply within the SLO of {slo_ms:g} ms", model)
        reply = replies[0]
        timings.update({f"model_{k}": v for k, v in reply.timings.items()})
        return self._answer(app, model, reply, ids, query, timings)

    def _select(self, app: Application) -> ModelVersion | None:
        linked = self._registry.linked_models(app.name)
        if not linked:
            return None
        return self._registry.active_version(linked[0])

    def _enqueue(
        self, app: Application, model: ModelVersion, query: QueryInput, query_id: int, deadline: float
    ) -> None:
        payload, blob = encode_rows(query.rows)
        if blob is not None:
            if self._claims is None:
                raise Unavailable("input too large for a queue message and no claim-check store is set")
            key = f"claims/{query_id}"
            self._claims.put(key, blob)
            payload.s3_key = key
        message = QueryMessage(
            query_id=query_id,
            app=app.name,
            model=model.name,
            version=model.version,
            input_type=app.input_type,
            rows=query.count,
            payload=payload,
            deadline_ms=int(deadline * 1000),
            sent_ms=int(self._clock.now() * 1000),
            reply_to=str(query_id),
        )
        self._queue.send(model.queue_url, message.to_json())

    @staticmethod
    def _answer(
        app: Application,
        model: ModelVersion,
        reply: Reply,
        ids: list[int],
        query: QueryInput,
        timings: dict[str, float],
    ) -> QueryResult:
        name = f"model {model.name}:{model.version}"
        if not reply.ok:
            why = f"{name}: {reply.error_kind or 'endpoint'} error: {reply.error}"
            preds = [Prediction(i, app.default_output, True, why) for i in ids]
        elif len(reply.outputs or []) != len(ids):
            why = f"{name}: endpoint error: {len(reply.outputs or [])} outputs for {len(ids)} inputs"
            preds = [Prediction(i, app.default_output, True, why) for i in ids]
        else:
            preds = [Prediction(i, output_value(o), False) for i, o in zip(ids, reply.outputs or [], strict=True)]
        return QueryResult(preds, query.batch, model.name, model.version, timings)


__all__ = ["NotFound", "Prediction", "QueryProcessor", "QueryResult"]
