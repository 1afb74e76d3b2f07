"""The frontend's HTTP face: Clipper's query routes as a FastAPI app.

Bodies are parsed here rather than by FastAPI so that every rejection carries Clipper's error body
(``{"error": ..., "cause": ...}``) with a cause naming the field; the OpenAPI document still describes
the request and response shapes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from clipper.errors import ClipperError, InvalidInput, NotFound, PayloadTooLarge, Unavailable
from clipper.feedback import FeedbackReceiver
from clipper.frontend.metrics import InProcessMetrics
from clipper.frontend.query import QueryProcessor
from clipper.frontend.results import QueryResult

T = TypeVar("T")


class PredictRequest(BaseModel):
    """Exactly one of ``input`` and ``input_batch``."""

    input: list[Any] | str | None = Field(
        None, description="One input: a list of numbers (integers/floats/doubles), a string, or base64 bytes"
    )
    input_batch: list[list[Any] | str] | None = Field(None, description="Several inputs, answered in order")


class PredictionBody(BaseModel):
    query_id: int
    output: Any
    default: bool
    default_explanation: str | None = Field(None, description="Why the default output was returned")


class BatchPredictionBody(BaseModel):
    batch_predictions: list[PredictionBody]


class ErrorBody(BaseModel):
    error: str
    cause: str


def _error(status: int, error: str, cause: str) -> JSONResponse:
    return JSONResponse({"error": error, "cause": cause}, status_code=status)


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in {"1", "true", "yes"}


class FeedbackRequest(BaseModel):
    uid: int | str | None = Field(None, description="The user, when the application learns per user")
    input: list[Any] | str = Field(description="The input the feedback is about, as it was queried")
    label: float | int | str = Field(description="The true output for that input")


class FeedbackAccepted(BaseModel):
    accepted: bool
    feedback_id: str


def create_app(
    processor: QueryProcessor,
    max_body_bytes: int,
    title: str = "Clipper query API",
    inline: bool = False,
    feedback: FeedbackReceiver | None = None,
    observe: Callable[[str, QueryResult, float], None] | None = None,
    metrics: InProcessMetrics | None = None,
) -> FastAPI:
    """``inline`` runs the (blocking) query on the event loop's thread: right in Lambda, where Mangum serves
    one event per invocation and a thread hop only adds latency; wrong under uvicorn, which serves many."""
    app = FastAPI(title=title, version="1", description="Clipper's prediction API, served on AWS Lambda.")

    @app.get("/health", tags=["ops"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"], summary="Clipper's metrics: counters, meters and histograms")
    def get_metrics() -> dict[str, Any]:
        """Counters, meters (count, 1-minute and mean rates) and histograms (p50/p95/p99/mean/min/max)
        named ``app:<app>:*`` and ``model:<model>:<version>:*``, for this process (a Lambda container)."""
        return metrics.report() if metrics is not None else {"counters": [], "meters": [], "histograms": []}

    @app.post(
        "/{app_name}/predict",
        tags=["query"],
        response_model=PredictionBody | BatchPredictionBody,
        response_model_exclude_none=True,
        responses={400: {"model": ErrorBody}, 404: {"model": ErrorBody}, 413: {"model": ErrorBody}},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": PredictRequest.model_json_schema()}},
            }
        },
        summary="Predict with an application's models",
    )
    async def predict(app_name: str, request: Request) -> Any:
        """Clipper's query: ``{"input": [...]}`` answers ``{"query_id", "output", "default"}``;
        ``{"input_batch": [[...], ...]}`` answers ``{"batch_predictions": [...]}`` in order. Add
        ``?debug=true`` (or the header ``X-Clipper-Debug: 1``) for the model and per-stage timings."""
        debug = _truthy(request.query_params.get("debug")) or _truthy(request.headers.get("x-clipper-debug"))
        started = time.perf_counter()
        result = await run(request, lambda body: processor.predict(app_name, body))
        if isinstance(result, JSONResponse):
            return result
        if observe is not None:
            observe(app_name, result, time.perf_counter() - started)
        return JSONResponse(result.as_dict(debug))

    @app.post(
        "/{app_name}/update",
        tags=["query"],
        response_model=FeedbackAccepted,
        responses={400: {"model": ErrorBody}, 404: {"model": ErrorBody}, 503: {"model": ErrorBody}},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": FeedbackRequest.model_json_schema()}},
            }
        },
        summary="Feedback: the true label of an input, for the application's bandit",
    )
    async def update(app_name: str, request: Request) -> Any:
        """Clipper's feedback: ``{"uid"?, "input": [...], "label": ...}``. It is queued durably and applied
        to the bandit state shortly after; the answer only says it was accepted."""
        if feedback is None:
            return _error(503, "service unavailable", "feedback is not configured on this frontend")
        accepted = await run(request, lambda body: feedback.accept(app_name, body))
        return accepted if isinstance(accepted, JSONResponse) else JSONResponse(accepted)

    async def run(request: Request, call: Callable[[Any], T]) -> T | JSONResponse:
        """Read and parse the body, run ``call`` on it, and turn the project's errors into Clipper's
        error bodies (a failing model never gets here: it is a default output)."""
        raw = await request.body()
        if len(raw) > max_body_bytes:
            e = PayloadTooLarge("body", f"at most {max_body_bytes} bytes", f"{len(raw)} bytes")
            return _error(413, "payload too large", str(e))
        try:
            body = json.loads(raw)
        except ValueError as e:
            return _error(400, "invalid JSON", f"body: expected a JSON object, got invalid JSON ({e})")
        try:
            return call(body) if inline else await run_in_threadpool(call, body)
        except NotFound as e:
            return _error(404, "unknown application", str(e))
        except InvalidInput as e:
            return _error(400, "invalid input", str(e))
        except Unavailable as e:
            return _error(503, "service unavailable", str(e))
        except ClipperError as e:
            return _error(500, "internal error", str(e))

    return app
