"""The frontend's HTTP face: Clipper's query routes as a FastAPI app.

Bodies are parsed here (orjson, once) rather than by FastAPI so that every rejection carries Clipper's error
body (``{"error": ..., "cause": ...}``) with a cause naming the field; the OpenAPI document still describes
the request and response shapes. Unknown routes and methods answer in the same shape.

Where every dependency of the query path answers in well under a millisecond and takes a timeout per call (Redis
through the lean client: the local stack), a query runs on the event loop: its calls are bounded by its remaining
time and it waits for its replies without holding a thread (``QueryProcessor.predict_async``). Otherwise (SQS,
DynamoDB, a bandit state or a claim check still to read) it runs on a worker thread while the event loop watches
its deadline: when the query is still held up by a dependency ``WATCHDOG_GRACE_S`` after its deadline, the route
answers the application's default output naming the stage it was in, so no dependency can hold an answer past
the SLO (or, on Lambda, past the function's timeout into a 5xx).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from clipper.errors import ClipperError, InvalidInput, NotFound, PayloadTooLarge, Unavailable
from clipper.feedback import FeedbackReceiver
from clipper.frontend.metrics import InProcessMetrics
from clipper.frontend.query import QueryProcessor
from clipper.frontend.results import QueryResult, QueryTicket

T = TypeVar("T")

# How long past its deadline a query still held up by a dependency is given before the route answers for it.
WATCHDOG_GRACE_S = 0.003
PREDICT_FIELDS = frozenset({"input", "input_batch", "uid"})
UPDATE_FIELDS = frozenset({"input", "label", "uid"})


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


def _error(status: int, error: str, cause: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "cause": cause}, status_code=status, headers=headers)


def _json(body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


def _check_fields(body: Any, allowed: frozenset[str]) -> None:
    if isinstance(body, dict):
        for name in body:
            if name not in allowed:
                raise InvalidInput(name, "no such field (the request's fields are " + ", ".join(sorted(allowed)) + ")")


def _json_content(content_type: str | None) -> bool:
    """JSON, or no Content-Type at all (taken as JSON)."""
    if not content_type:
        return True
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


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
    feedback: FeedbackReceiver | None = None,
    observe: Callable[[str, QueryResult, float], None] | None = None,
    metrics: InProcessMetrics | None = None,
    query_threads: int = 64,
) -> FastAPI:
    """``query_threads``: how many queries run at once (each holds a worker thread until its replies come)."""
    app = FastAPI(title=title, version="1", description="Clipper's prediction API, served on AWS Lambda.")
    workers = ThreadPoolExecutor(max_workers=query_threads, thread_name_prefix="clipper-query")
    clock = processor.clock

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        """Unknown routes and methods (GET on /<app>/predict) in Clipper's error shape."""
        error = {404: "not found", 405: "method not allowed"}.get(exc.status_code, "http error")
        return _error(exc.status_code, error, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def request_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(400, "invalid request", f"{where}: {first.get('msg', 'invalid')}")

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
        ``{"input_batch": [[...], ...]}`` (at most the frontend's batch limit, 1,000 by default) answers
        ``{"batch_predictions": [...]}`` in order. Add ``?debug=true`` (or the header ``X-Clipper-Debug: 1``)
        for the model and per-stage timings."""
        debug = _truthy(request.query_params.get("debug")) or _truthy(request.headers.get("x-clipper-debug"))
        started = time.perf_counter()
        body = await parse(request, PREDICT_FIELDS)
        if isinstance(body, Response):
            return body
        ticket = QueryTicket()
        admitted = await answer(lambda: admit(app_name, body, ticket))
        if isinstance(admitted, Response):
            return admitted
        if processor.can_inline(ticket):  # fast, bounded dependencies: on the loop, no thread held
            result = await answer(lambda: processor.predict_async(app_name, body, ticket))
        else:
            future = workers.submit(processor.predict, app_name, body, ticket)
            result = await answer(lambda: within_deadline(future, ticket))
        if isinstance(result, Response):
            return result
        if observe is not None:
            observe(app_name, result, time.perf_counter() - started)
        headers = {"x-clipper-query-id": str(result.predictions[0].query_id)} if result.predictions else None
        return _json(result.as_dict(debug), headers)

    async def admit(app_name: str, body: Any, ticket: QueryTicket) -> bool:
        processor.admit(app_name, body, ticket)
        return True

    async def within_deadline(future: Future[QueryResult], ticket: QueryTicket) -> QueryResult:
        """The query's result, or, when it is still running ``WATCHDOG_GRACE_S`` past its deadline, the
        default answer naming the stage it is held up in (it goes on in the background; its result is dropped)."""
        waited = asyncio.wrap_future(future)
        while True:
            deadline = ticket.deadline
            timeout = 0.05 if deadline is None else deadline + WATCHDOG_GRACE_S - clock.now()
            if deadline is not None and timeout <= 0 and ticket.app is not None:
                ticket.abandoned = True
                return processor.late(ticket)
            done, _ = await asyncio.wait({waited}, timeout=max(0.0, timeout))
            if done:
                return waited.result()

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
        body = await parse(request, UPDATE_FIELDS)
        if isinstance(body, Response):
            return body
        future = workers.submit(feedback.accept, app_name, body)
        accepted = await answer(lambda: asyncio.wrap_future(future))
        return accepted if isinstance(accepted, Response) else _json(accepted)

    async def parse(request: Request, fields: frozenset[str]) -> Any:
        """The body as JSON (Clipper's error body when it is too large, not JSON, or has unknown fields)."""
        content_type = request.headers.get("content-type")
        if not _json_content(content_type):
            cause = f"Content-Type: expected application/json, got {content_type}"
            return _error(415, "unsupported media type", cause)
        raw = await request.body()
        if len(raw) > max_body_bytes:
            e = PayloadTooLarge("body", f"at most {max_body_bytes} bytes", f"{len(raw)} bytes")
            return _error(413, "payload too large", str(e))
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            try:  # NaN and Infinity are not JSON, but Python's json writes them: validation names the field
                body = json.loads(raw)
            except (ValueError, RecursionError):
                return _error(400, "invalid JSON", f"body: expected a JSON object, got invalid JSON ({e})")
        try:
            _check_fields(body, fields)
        except InvalidInput as e:
            return _error(400, "invalid input", str(e))
        return body

    async def answer(result: Callable[[], Awaitable[T]]) -> T | Response:
        """Await ``result()`` and turn the project's errors into Clipper's error bodies (a failing model never
        gets here: it is a default output)."""
        try:
            value: T = await result()
            return value
        except NotFound as e:
            return _error(404, "unknown application", str(e))
        except InvalidInput as e:
            return _error(400, "invalid input", str(e))
        except RecursionError:
            return _error(400, "invalid input", "input: expected a list of values, got a list nested too deeply")
        except Unavailable as e:
            return _error(503, "service unavailable", str(e))
        except ClipperError as e:
            return _error(500, "internal error", str(e))

    return app
