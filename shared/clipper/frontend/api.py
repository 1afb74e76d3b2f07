"""The frontend's HTTP face: Clipper's query routes as a FastAPI app.

The routes' answers come from ``clipper.frontend.handling`` (bodies parsed there, once, so every rejection carries
Clipper's error body with a cause naming the field); ``POST /<app>/predict`` is answered by an ASGI fast path
(``clipper.frontend.fastpath``) before the framework and its middleware stack, the route below describing it in
the OpenAPI document and answering the same where the fast path is not in front. Unknown routes and methods
answer in Clipper's error shape too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from clipper.feedback import FeedbackReceiver
from clipper.frontend.fastpath import PredictFastPath, predicted_app
from clipper.frontend.handling import WATCHDOG_GRACE_S, HttpAnswer, QueryHandling, debug_requested
from clipper.frontend.metrics import InProcessMetrics
from clipper.frontend.query import QueryProcessor
from clipper.frontend.results import QueryResult

__all__ = ["WATCHDOG_GRACE_S", "create_app"]


# An application (the local stack's demo application as the example) and a digit of its 8x8 images.
AppName = Annotated[str, Path(openapi_examples={"demo": {"summary": "the demo application", "value": "digits"}})]
DIGIT = [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0]
DIGIT += [0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0]

# A user id: Clipper's integer, or a non-empty string.
Uid = int | Annotated[str, Field(min_length=1)]


class PredictRequest(BaseModel):
    """Exactly one of ``input`` and ``input_batch`` (what an input must be depends on the application's input
    type and shape: a list of numbers of its shape, a string, or base64 bytes)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"oneOf": [{"required": ["input"]}, {"required": ["input_batch"]}]}
    )

    input: list[Any] | str = Field(
        None,  # type: ignore[assignment]
        description="One input: a list of numbers (integers/floats/doubles), a string, or base64 bytes",
    )
    input_batch: list[list[Any] | str] = Field(
        None,  # type: ignore[arg-type]
        min_length=1,
        description="Several inputs (at most the frontend's batch limit, 1,000 by default), answered in order",
    )
    uid: Uid | None = Field(None, description="The user, when the application learns per user (null: none)")


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


def _response(answer: HttpAnswer) -> Response:
    headers = {k.decode(): v.decode() for k, v in answer.headers if k != b"content-type"}
    return Response(answer.body, status_code=answer.status, media_type="application/json", headers=headers)


class ClipperApi(FastAPI):
    """FastAPI, with ``POST /<app>/predict`` answered by the fast path before the framework's middleware stack
    (when ``fast_path`` is set)."""

    fast_path: PredictFastPath | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        fast = self.fast_path
        if fast is not None:
            app_name = predicted_app(scope)
            if app_name is not None:
                await fast.answer(app_name, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uid: Uid | None = Field(None, description="The user, when the application learns per user (null: none)")
    input: list[Any] | str = Field(description="The input the feedback is about, as it was queried")
    label: float | int | str = Field(description="The true output for that input")
    feedback_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.:-]{1,128}$",
        description="A key of the client's: the same feedback sent again with it (a retry) is applied once",
    )


class FeedbackAccepted(BaseModel):
    accepted: bool
    feedback_id: str


def _encoding(request: Request) -> str | None:
    """Every Content-Encoding header of the request as one list (HTTP's rule for a repeated header)."""
    codings = request.headers.getlist("content-encoding")
    return ", ".join(codings) if codings else None


def create_app(
    processor: QueryProcessor,
    max_body_bytes: int,
    title: str = "Clipper query API",
    feedback: FeedbackReceiver | None = None,
    observe: Callable[[str, QueryResult, float], None] | None = None,
    metrics: InProcessMetrics | None = None,
    query_threads: int = 64,
    fast_path: bool = True,
) -> ClipperApi:
    """``query_threads``: how many queries run at once on worker threads (each holds its thread until its
    replies come). ``fast_path``: answer ``POST /<app>/predict`` in front of the framework (tests compare)."""
    # redirect_slashes: Starlette answered /<app>/predict/ with a bare 307 to /<app>/predict (no body; a client
    # that does not follow a redirected POST saw an empty error): an unknown route is a 404 in Clipper's shape
    app = ClipperApi(
        title=title,
        version="1",
        description="Clipper's prediction API, served on AWS Lambda.",
        redirect_slashes=False,
    )
    handling = QueryHandling(processor, max_body_bytes, feedback, observe, query_threads)
    if fast_path:
        app.fast_path = PredictFastPath(handling)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        """Unknown routes and methods (GET on /<app>/predict) in Clipper's error shape; a 405 names the methods
        the route takes (its Allow header), as the admin API's does."""
        error = {404: "not found", 405: "method not allowed"}.get(exc.status_code, "http error")
        headers = getattr(exc, "headers", None)
        cause = str(exc.detail)
        if exc.status_code == 404 and cause == "Not Found":  # no such route (an application's 404 says which)
            cause = (
                f"{request.method} {request.url.path}: no such route (POST /<app>/predict, POST /<app>/update, "
                "GET /health, GET /metrics, GET /docs, GET /openapi.json)"
            )
        if exc.status_code == 405:
            cause = (
                f"{request.method} {request.url.path}: method not allowed (allowed: {(headers or {}).get('Allow', '')})"
            )
        return _error(exc.status_code, error, cause, headers)

    @app.exception_handler(RequestValidationError)
    async def request_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(400, "invalid request", f"{where}: {first.get('msg', 'invalid')}")

    @app.get("/health", tags=["ops"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.head("/health", tags=["ops"], include_in_schema=False)
    def health_head() -> dict[str, str]:  # some health checkers send HEAD (it was a 405); the body is dropped
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
        responses={
            400: {"model": ErrorBody},
            404: {"model": ErrorBody},
            413: {"model": ErrorBody},
            415: {"model": ErrorBody},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": PredictRequest.model_json_schema(),
                        "examples": {
                            "one": {"summary": "one input", "value": {"input": DIGIT}},
                            "batch": {"summary": "two inputs", "value": {"input_batch": [DIGIT, DIGIT[::-1]]}},
                        },
                    }
                },
            }
        },
        summary="Predict with an application's models",
    )
    async def predict(app_name: AppName, request: Request) -> Any:
        """Clipper's query: ``{"input": [...]}`` answers ``{"query_id", "output", "default"}``;
        ``{"input_batch": [[...], ...]}`` (at most the frontend's batch limit, 1,000 by default) answers
        ``{"batch_predictions": [...]}`` in order. Add ``?debug=true`` (or the header ``X-Clipper-Debug: 1``)
        for the model and per-stage timings."""
        debug = debug_requested(request.url.query, request.headers.get("x-clipper-debug"))
        if isinstance(debug, HttpAnswer):
            return _response(debug)
        content_type = request.headers.get("content-type")
        refused = handling.refused(content_type, _encoding(request))
        if refused is not None:
            return _response(refused)
        raw = await request.body()
        return _response(await handling.predict(app_name, raw, content_type, debug))

    @app.post(
        "/{app_name}/update",
        tags=["query"],
        response_model=FeedbackAccepted,
        responses={
            400: {"model": ErrorBody},
            404: {"model": ErrorBody},
            413: {"model": ErrorBody},
            415: {"model": ErrorBody},
            503: {"model": ErrorBody},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": FeedbackRequest.model_json_schema(),
                        "examples": {
                            "label": {"summary": "a user's label", "value": {"uid": 7, "input": DIGIT, "label": 1}}
                        },
                    }
                },
            }
        },
        summary="Feedback: the true label of an input, for the application's bandit",
    )
    async def update(app_name: AppName, request: Request) -> Any:
        """Clipper's feedback: ``{"uid"?, "input": [...], "label": ..., "feedback_id"?}``. It is queued durably
        and applied to the bandit state shortly after; the answer only says it was accepted. A client that
        retries (a timeout, a 503) sends its own ``feedback_id`` to have the feedback applied once. Feedback for
        an input this application (and user) never queried, or whose record expired, is accepted and then
        skipped: it says nothing about the models."""
        content_type = request.headers.get("content-type")
        refused = handling.refused(content_type, _encoding(request))
        if refused is not None:
            return _response(refused)
        raw = await request.body()
        return _response(await handling.update(app_name, raw, content_type))

    return app
