"""The HTTP app: the SageMaker inference contract over one :class:`~clipper_endpoint.model.OnnxModel`.

- ``GET /ping``: 200 once the model is loaded (it is loaded before the app is built); 503 while the model has
  failed every batch for ``unhealthy_after_s`` (a fault that persists in the process, such as a CUDA error that
  leaves the session unusable: SageMaker replaces an instance whose ping fails, and a new process mends it), or
  while the batch on the worker thread has run that long (a hung kernel: no batch would ever be answered again).
- ``POST /invocations``: ``application/x-npy`` (one ``.npy`` array, rows first) or ``application/json``
  (``{"instances": [...]}`` or ``{"inputs": [...]}``). The answer has the request's format unless ``Accept``
  names only the other one: ``.npy`` of the served output, or ``{"predictions": [...]}``. A wrong content type
  gets 415, a body over the size limit 413, a body that does not fit the model 400, a failing model 500;
  every error body is ``{"error": "..."}``.
- ``GET /metadata``: the model's input and outputs, the providers in use and the model path.

``POST /invocations`` is the hot path, so it is served by a plain ASGI callable in front of the Starlette app
(which serves everything else): no request/response objects, no middleware, one decode, one session run, one
encode. A batch runs either inline on the event loop (cheapest for small CPU models) or on one worker thread
(the event loop keeps answering ``/ping`` and reading the next request while a long batch computes, e.g. on a
GPU); either way the one session runs one batch at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from clipper_endpoint import npy
from clipper_endpoint.model import CUDA, InputError, OnnxModel, PredictionError

logger = logging.getLogger(__name__)

NPY = "application/x-npy"
JSON = "application/json"
OCTET_STREAM = "application/octet-stream"  # SageMaker's default content type; read as .npy
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_UNHEALTHY_AFTER_S = 60.0
INLINE_ROW_S = 0.0002  # auto: batches of a model whose row takes less run on the event loop (2,048 rows: ~0.4 s)
INFERENCE_MODES = ("auto", "inline", "thread")

_T = TypeVar("_T")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _media_type(value: str) -> str:
    return value.partition(";")[0].strip().lower()


def _answer_format(request_format: str, accept: str) -> str:
    """The request's own format unless ``Accept`` names only the other one."""
    wants_npy = NPY in accept
    wants_json = JSON in accept
    if wants_json and not wants_npy:
        return JSON
    if wants_npy and not wants_json:
        return NPY
    return request_format


def _error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class _BodyTooLarge(Exception):
    pass


class Health:
    """Whether the model still serves: unhealthy when every batch for ``unhealthy_after_s`` seconds, at least
    ``MIN_FAILURES`` of them and the last within that time, failed in the model (a 500) with none answered in
    between, *and* the model then fails a batch of zeros too (:meth:`OnnxModel.probe`): failures that come from
    the inputs (an input the model rejects at run time, retried by the queue) leave it healthy, a fault of the
    process (a CUDA error that leaves the session unusable) does not. A batch refused as not fitting the model (a
    400) says nothing of the model and changes nothing; a model with no batch of zeros to run (a free inner
    dimension) cannot be told apart and stays healthy; ``unhealthy_after_s`` 0 is never. Used on the event loop
    only."""

    MIN_FAILURES = 3

    def __init__(self, unhealthy_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.unhealthy_after_s = unhealthy_after_s
        self._clock = clock
        self._since: float | None = None
        self._last_at = 0.0
        self._failures = 0
        self._last = ""
        self._reported = False
        # when the batch now on the worker thread started running there (None: none runs); set by that thread
        self.running_since: float | None = None
        self._hung_reported = False

    def run(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(*args)`` on the worker thread (a batch, or the probe's batch of zeros), its start time in
        ``running_since`` while it runs (from when it leaves the queue: a batch waiting behind a hung one is not
        the one that hangs)."""
        self.running_since = self._clock()
        try:
            return work(*args)
        finally:
            self.running_since = None

    def hung(self) -> str | None:
        """Why the model is unhealthy when the batch on the worker thread has run for ``unhealthy_after_s`` (a
        kernel that never returns: every later batch waits behind it), or None. No SageMaker request waits that
        long (its invocations time out at 60 s), so no batch that will still be answered is taken for hung."""
        started = self.running_since
        if not self.unhealthy_after_s or started is None:
            self._hung_reported = False
            return None
        running_s = self._clock() - started
        if running_s < self.unhealthy_after_s:
            return None
        problem = f"the batch on the worker thread has run for {running_s:.0f} s without an answer: hung"
        if not self._hung_reported:
            self._hung_reported = True
            logger.error("unhealthy, /ping answers 503: %s", problem)
        return problem

    def succeeded(self) -> None:
        if self._reported:
            logger.warning("the model answers again after %d failed batches: /ping answers 200", self._failures)
        self._since, self._failures, self._reported = None, 0, False

    def failed(self, error: str) -> None:
        now = self._clock()
        if self._since is None:
            self._since = now
        self._failures += 1
        self._last, self._last_at = error, now

    def due(self) -> bool:
        """Whether the failures so far would make the model unhealthy (the probe decides)."""
        if not self.unhealthy_after_s or self._since is None or self._failures < self.MIN_FAILURES:
            return False
        now = self._clock()
        return now - self._since >= self.unhealthy_after_s and now - self._last_at < self.unhealthy_after_s

    def problem(self, model_works: bool | None) -> str | None:
        """Why the model is unhealthy, or None. ``model_works``: whether a batch of zeros just ran (None: the model
        has none to run)."""
        if not self.due():
            return None
        if model_works is not False:
            if model_works:  # the model runs: the failed batches failed on their inputs
                logger.warning(
                    "%d batches failed in the model (the last: %s), but a batch of zeros runs: the inputs', not the "
                    "process's",
                    self._failures,
                    self._last,
                )
                self.succeeded()
            return None
        failing_s = self._clock() - self._since  # type: ignore[operator]  # due(): set
        problem = f"every batch for {failing_s:.0f} s ({self._failures} batches) failed in the model, and a batch "
        problem += f"of zeros fails too; the last: {self._last}"
        if not self._reported:
            self._reported = True
            logger.error("unhealthy, /ping answers 503: %s", problem)
        return problem


class Invoker:
    """Turns one request body into one answer body: decode, check and cast, run, encode."""

    def __init__(self, model: OnnxModel) -> None:
        self.model = model

    def from_npy(self, body: bytes, answer: str) -> tuple[bytes, str]:
        return self._answer(self.model.predict(npy.decode(body)), answer)

    def from_json(self, body: bytes, answer: str) -> tuple[bytes, str]:
        expected = (
            f'a JSON object {{"instances": [...]}} (or "inputs"), a list of rows, each of shape '
            f"{self.model.row_shape_text} {self.model.dtype_name}"
        )
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"body is not valid JSON ({e}); expected {expected}") from e
        rows = None
        if isinstance(payload, dict):
            if "instances" in payload and "inputs" in payload:
                raise InputError(f'got both "instances" and "inputs"; expected {expected}')
            rows = payload.get("instances", payload.get("inputs"))
        if not isinstance(rows, list):
            raise InputError(f"expected {expected}")
        try:
            batch = np.asarray(rows)
        except ValueError as e:  # ragged rows
            raise InputError(f"{self.model.expectation}, got rows of different lengths") from e
        return self._answer(self.model.predict(batch), answer)

    @staticmethod
    def _answer(output: Any, answer: str) -> tuple[bytes, str]:
        if answer == NPY:
            if not isinstance(output, np.ndarray):
                raise PredictionError("the served output is not a tensor; ask for application/json")
            try:
                return npy.encode(output), NPY
            except TypeError as e:
                raise PredictionError(f"{e}; ask for application/json") from e
        predictions = output.tolist() if isinstance(output, np.ndarray) else output
        return json.dumps({"predictions": predictions}, separators=(",", ":")).encode(), JSON


class EndpointApp:
    """The ASGI app: ``POST /invocations`` served directly, every other request by ``fallback``."""

    def __init__(
        self,
        invoker: Invoker,
        fallback: Starlette,
        *,
        max_body_bytes: int,
        executor: ThreadPoolExecutor | None,
        health: Health | None = None,
    ) -> None:
        self.invoker = invoker
        self.fallback = fallback
        self.max_body_bytes = max_body_bytes
        self.executor = executor
        self.health = health or Health(0)

    @property
    def model(self) -> OnnxModel:
        return self.invoker.model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/invocations" and scope["method"] == "POST":
            await self.invocations(scope, receive, send)
        else:
            await self.fallback(scope, receive, send)

    async def invocations(self, scope: Scope, receive: Receive, send: Send) -> None:
        content_type = accept = ""
        length = -1
        for key, value in scope["headers"]:
            if key == b"content-type":
                content_type = _media_type(value.decode("latin1"))
            elif key == b"content-length":
                length = int(value) if value.isdigit() else -1
            elif key == b"accept":
                accept = value.decode("latin1")
        if content_type in (NPY, OCTET_STREAM):
            work, request_format = self.invoker.from_npy, NPY
        elif content_type == JSON:
            work, request_format = self.invoker.from_json, JSON
        else:
            message = f"unsupported content type {content_type or '(none)'!r}; send {NPY} or {JSON}"
            return await self._send(send, 415, _error_body(message), JSON)
        if length > self.max_body_bytes:
            message = f"body of {length} bytes is over the limit of {self.max_body_bytes} bytes"
            return await self._send(send, 413, _error_body(message), JSON)

        try:
            body = await self._read_body(receive)
        except _BodyTooLarge:
            message = f"body is over the limit of {self.max_body_bytes} bytes"
            return await self._send(send, 413, _error_body(message), JSON)
        if body is None:  # the client went away
            return None
        answer = _answer_format(request_format, accept)
        try:
            if self.executor is None:
                content, media_type = work(body, answer)
            else:
                loop = asyncio.get_running_loop()
                content, media_type = await loop.run_in_executor(self.executor, self.health.run, work, body, answer)
        except InputError as e:
            return await self._send(send, 400, _error_body(str(e)), JSON)
        except RecursionError:  # JSON nested past Python's recursion limit
            return await self._send(send, 400, _error_body("input nested too deeply"), JSON)
        except PredictionError as e:
            logger.error("prediction failed: %s", e)
            self.health.failed(str(e))
            return await self._send(send, 500, _error_body(str(e)), JSON)
        except Exception as e:
            logger.exception("unexpected error in /invocations")
            self.health.failed(f"{type(e).__name__}: {e}")
            return await self._send(send, 500, _error_body(f"internal error: {type(e).__name__}: {e}"), JSON)
        self.health.succeeded()
        await self._send(send, 200, content, media_type)

    async def _read_body(self, receive: Receive) -> bytes | None:
        message = await receive()
        body: bytes = message.get("body", b"")
        if len(body) > self.max_body_bytes:  # a body without Content-Length (chunked) that came in one piece
            raise _BodyTooLarge
        if not message.get("more_body", False):
            return body
        chunks = [body]
        size = len(body)
        while message.get("more_body", False):
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    async def _send(send: Send, status: int, content: bytes, media_type: str) -> None:
        headers = [(b"content-type", media_type.encode()), (b"content-length", str(len(content)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})


def light(model: OnnxModel) -> bool:
    """Whether ``auto`` runs the model's batches on the event loop: on the CPU, and a warmed-up row under
    ``INLINE_ROW_S``. A batch on the loop holds everything else the server does (``/ping`` too, which SageMaker
    gives 2 s); a heavier model's batches, or an unknown one's (not warmed up: a free inner dimension), go to the
    worker thread, whose hand-off costs tens of microseconds a batch."""
    return CUDA not in model.providers and model.row_seconds is not None and model.row_seconds < INLINE_ROW_S


def create_app(
    model: OnnxModel,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    inference: str = "auto",
    unhealthy_after_s: float = DEFAULT_UNHEALTHY_AFTER_S,
    clock: Callable[[], float] = time.monotonic,
) -> EndpointApp:
    """The ASGI app serving ``model``.

    ``inference`` is where batches run: ``inline`` on the event loop, ``thread`` on one worker thread, or
    ``auto``: inline for a light model on the CPU (:func:`light`), else the thread. ``unhealthy_after_s``:
    ``/ping`` answers 503 once every batch failed in the model for that long (:class:`Health`; 0: never).
    """
    if inference not in INFERENCE_MODES:
        raise ValueError(f"inference must be one of {INFERENCE_MODES}, not {inference!r}")
    if inference == "auto":
        inference = "inline" if light(model) else "thread"
    executor = ThreadPoolExecutor(1, thread_name_prefix="inference") if inference == "thread" else None
    metadata = json.dumps({**model.describe(), "inference": inference}).encode()
    health = Health(unhealthy_after_s, clock)

    async def ping(request: Request) -> Response:
        problem = health.hung()  # first: a probe would wait behind the hung batch
        if problem is None:
            works = None
            if health.due():  # a batch of zeros, where batches run (the worker thread waits for the batch in hand)
                loop = asyncio.get_running_loop()
                works = (
                    model.probe()
                    if executor is None
                    else await loop.run_in_executor(executor, health.run, model.probe)  # a hung probe shows too
                )
            problem = health.problem(works)
        if problem is not None:
            return Response(_error_body(problem), status_code=503, media_type=JSON)
        return Response(b"", status_code=200)

    async def describe(request: Request) -> Response:
        return Response(metadata, media_type=JSON)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    fallback = Starlette(
        routes=[
            Route("/ping", ping, methods=["GET"]),
            Route("/metadata", describe, methods=["GET"]),
            Route("/invocations", _method_not_allowed, methods=["GET"]),
        ],
        lifespan=lifespan,
        exception_handlers={404: _routing_error, 405: _routing_error},  # errors are JSON, as every other answer
    )
    logger.info("serving batches %s", "on one worker thread" if executor else "on the event loop")
    return EndpointApp(Invoker(model), fallback, max_body_bytes=max_body_bytes, executor=executor, health=health)


async def _routing_error(request: Request, exc: Exception) -> Response:
    """A path the server does not have (404) or a method its path does not take (405), as ``{"error": ...}``."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    what = "no such path" if status == 404 else "method not allowed"
    routes = "GET /ping, GET /metadata, POST /invocations"
    headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
    body = _error_body(f"{request.method} {request.url.path}: {what} ({routes})")
    return Response(body, status_code=status, media_type=JSON, headers=headers)


async def _method_not_allowed(request: Request) -> Response:
    return Response(_error_body("use POST /invocations"), status_code=405, media_type=JSON)
