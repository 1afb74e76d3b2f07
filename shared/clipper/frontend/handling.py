"""Clipper's query routes as plain functions of (application, body bytes, content type): what the FastAPI
routes and the ASGI fast path (``clipper.frontend.fastpath``) both answer with.

Bodies are parsed here (orjson, once) so that every rejection carries Clipper's error body (``{"error": ...,
"cause": ...}``) with a cause naming the field.

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
import contextvars
import json
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import orjson

from clipper.core.domain import MAX_APP_NAME, possible_app_name
from clipper.core.media import has_lone_surrogate, json_content
from clipper.core.validation import may_hold_booleans
from clipper.errors import ClipperError, InvalidInput, NotFound, PayloadTooLarge, Unavailable
from clipper.feedback import FeedbackNotQueued, FeedbackReceiver
from clipper.frontend.invocation import invocation_ends
from clipper.frontend.query import QueryProcessor
from clipper.frontend.results import QueryResult, QueryTicket

# How long past its deadline a query still held up by a dependency is given before the route answers for it.
WATCHDOG_GRACE_S = 0.003
PREDICT_FIELDS = frozenset({"input", "input_batch", "uid"})
UPDATE_FIELDS = frozenset({"input", "label", "uid", "feedback_id"})
JSON_HEADER = (b"content-type", b"application/json")


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = (JSON_HEADER,)


def error(status: int, kind: str, cause: str) -> HttpAnswer:
    return HttpAnswer(status, orjson.dumps({"error": kind, "cause": cause}))


FLAG_ON = frozenset({"1", "true", "yes", "on"})
FLAG_OFF = frozenset({"0", "false", "no", "off"})


def flag(value: str | bytes | None, name: str, bare: bool = False) -> bool:
    """A yes/no switch of the request (``?debug=``, ``X-Clipper-Debug``): 1/true/yes/on or 0/false/no/off in any
    case; absent is off, present without a value is ``bare``. Anything else is an ``InvalidInput`` naming ``name``
    (a typo must not silently leave it off)."""
    if value is None:
        return False
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    word = value.strip().lower()
    if not word:
        return bare
    if word in FLAG_ON:
        return True
    if word in FLAG_OFF:
        return False
    shown = value if len(value) <= 40 else value[:40] + "..."
    raise InvalidInput(name, "true or false (1/0, yes/no, on/off)", repr(shown))


def no_such_name(app_name: str) -> HttpAnswer:
    """The 404 of a URL naming what no application can be named (``possible_app_name``), without a registry read."""
    shown = app_name if len(app_name) <= 120 else app_name[:100] + f"... ({len(app_name)} characters)"
    rule = f"an application's name is 1-{MAX_APP_NAME} letters, digits, '_', '.' or '-', from a letter or digit"
    return error(404, "unknown application", str(NotFound("application", shown, rule)))


def debug_requested(query: str | bytes, header: str | bytes | None) -> bool | HttpAnswer:
    """Whether a query asks for its timings (``?debug=true`` or ``X-Clipper-Debug: 1``; a bare ``?debug`` too), or
    the 400 naming the parameter whose value is neither yes nor no. The URL's ``debug``, when given, decides (the
    last one given; ``?debug=false`` turns off what a client's default header turned on); else the header."""
    if isinstance(query, bytes):
        query = query.decode("latin-1")
    try:
        on = flag(header, "X-Clipper-Debug")
        if query:
            for key, value in parse_qsl(query, keep_blank_values=True):
                if key == "debug":
                    on = flag(value, "debug", bare=True)
        return on
    except InvalidInput as e:
        return error(400, "invalid input", str(e))


def check_fields(body: Any, allowed: frozenset[str]) -> None:
    if isinstance(body, dict):
        for name in body:
            if name not in allowed:
                raise InvalidInput(name, "no such field (the request's fields are " + ", ".join(sorted(allowed)) + ")")


T = TypeVar("T")


class QueryHandling:
    def __init__(
        self,
        processor: QueryProcessor,
        max_body_bytes: int,
        feedback: FeedbackReceiver | None = None,
        observe: Callable[[str, QueryResult, float], None] | None = None,
        query_threads: int = 64,
    ) -> None:
        """``query_threads``: how many queries run at once on worker threads (each holds its thread until its
        replies come)."""
        self.processor = processor
        self.max_body_bytes = max_body_bytes
        self._feedback = feedback
        self._observe = observe
        self._workers = ThreadPoolExecutor(max_workers=query_threads, thread_name_prefix="clipper-query")

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """``fn(*args)`` on a worker thread, in a copy of the caller's context: the log keys a query adds there
        (its correlation id, application, models) end with it, where the thread's own context kept them for the
        next request it ran (an update's log lines named an earlier query)."""
        return self._workers.submit(contextvars.copy_context().run, fn, *args)

    def too_large(self, size: int, partial: bool = False) -> HttpAnswer | None:
        """The 413 for a body of ``size`` bytes over the limit (``partial``: the body was read only so far)."""
        if size <= self.max_body_bytes:
            return None
        got = f"more than {self.max_body_bytes} bytes" if partial else f"{size} bytes"
        e = PayloadTooLarge("body", f"at most {self.max_body_bytes} bytes", got)
        return error(413, "payload too large", str(e))

    @staticmethod
    def unsupported(content_type: str | None) -> HttpAnswer | None:
        """The 415 for a body that is not JSON (none given: JSON); checked before the body's size, so that the
        fast path, which reads the body in chunks, and the route answer alike."""
        if json_content(content_type):
            return None
        return error(415, "unsupported media type", f"Content-Type: expected application/json, got {content_type}")

    @staticmethod
    def encoded(content_encoding: str | None) -> HttpAnswer | None:
        """The 415 for a compressed body (``Content-Encoding`` other than identity; several headers are one
        comma-separated list, every coding of which must be identity): it would otherwise be read as JSON and
        refused as invalid JSON, which does not say what to change."""
        if content_encoding is None or all(c.strip().lower() in ("", "identity") for c in content_encoding.split(",")):
            return None
        cause = f"Content-Encoding: expected none or identity (an uncompressed JSON body), got {content_encoding}"
        return error(415, "unsupported media type", cause)

    @classmethod
    def refused(cls, content_type: str | None, content_encoding: str | None) -> HttpAnswer | None:
        """The 415 for a body this API does not read (not JSON, or compressed), answered before it is read."""
        return cls.unsupported(content_type) or cls.encoded(content_encoding)

    def parse(self, raw: bytes, content_type: str | None, fields: frozenset[str]) -> Any:
        """The body as JSON, or Clipper's error answer (too large, not JSON, unknown fields)."""
        unsupported = self.unsupported(content_type)
        if unsupported is not None:
            return unsupported
        too_large = self.too_large(len(raw))
        if too_large is not None:
            return too_large
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            try:  # NaN and Infinity are not JSON, but Python's json writes them: validation names the field
                body = json.loads(raw)
            except (ValueError, RecursionError):
                return error(400, "invalid JSON", f"body: expected a JSON object, got invalid JSON ({e})")
            if has_lone_surrogate(body):  # "\ud800" alone: Python's json takes it, no UTF-8 can carry it on
                cause = "body: expected valid Unicode text, got a lone surrogate (\\ud800-\\udfff)"
                return error(400, "invalid JSON", cause)
        try:
            check_fields(body, fields)
        except InvalidInput as e:
            return error(400, "invalid input", str(e))
        return body

    async def predict(self, app_name: str, raw: bytes, content_type: str | None, debug: bool) -> HttpAnswer:
        started = time.perf_counter()
        body = self.parse(raw, content_type, PREDICT_FIELDS)
        if isinstance(body, HttpAnswer):
            return body
        if not possible_app_name(app_name):  # answered without a registry read (see possible_app_name)
            return no_such_name(app_name)
        processor, booleans = self.processor, may_hold_booleans(raw)
        lane = processor.lane
        try:
            # the common query (one input, one model) in its lane; anything else (None from it) the general way
            result = None
            if lane is not None and not debug:
                result = await lane.predict(app_name, body, booleans, processor.finish_lane)
            if result is None:
                ticket = QueryTicket(booleans=booleans, ends=invocation_ends())  # read here, on the loop
                processor.admit(app_name, body, ticket)
                if processor.can_inline(ticket):  # fast, bounded dependencies: on the loop, no thread held
                    result = await processor.predict_async(app_name, body, ticket)
                else:
                    future = self.submit(processor.predict, app_name, body, ticket)
                    result = await self._within_deadline(future, ticket)
        except ClipperError as e:
            return self._error_answer(e)
        except RecursionError:
            return error(400, "invalid input", "input: expected a list of values, got a list nested too deeply")
        if self._observe is not None:
            self._observe(app_name, result, time.perf_counter() - started)
        headers: tuple[tuple[bytes, bytes], ...] = (JSON_HEADER,)
        if result.predictions:
            headers += ((b"x-clipper-query-id", str(result.predictions[0].query_id).encode()),)
        return HttpAnswer(200, orjson.dumps(result.as_dict(debug)), headers)

    async def _within_deadline(self, future: Future[QueryResult], ticket: QueryTicket) -> QueryResult:
        """The query's result, or, when it is still running ``WATCHDOG_GRACE_S`` past its deadline, the
        default answer naming the stage it is held up in (it goes on in the background; its result is dropped)."""
        waited = asyncio.wrap_future(future)
        clock = self.processor.clock
        while True:
            deadline = ticket.deadline
            timeout = 0.05 if deadline is None else deadline + WATCHDOG_GRACE_S - clock.now()
            if deadline is not None and timeout <= 0 and ticket.app is not None:
                ticket.abandoned = True
                return self.processor.late(ticket)
            done, _ = await asyncio.wait({waited}, timeout=max(0.0, timeout))
            if done:
                return waited.result()

    async def update(self, app_name: str, raw: bytes, content_type: str | None) -> HttpAnswer:
        if self._feedback is None:
            return error(503, "service unavailable", "feedback is not configured on this frontend")
        body = self.parse(raw, content_type, UPDATE_FIELDS)
        if isinstance(body, HttpAnswer):
            return body
        if not possible_app_name(app_name):
            return no_such_name(app_name)
        try:
            accepted = await asyncio.wrap_future(self.submit(self._feedback.accept, app_name, body))
        except FeedbackNotQueued as e:  # maybe queued: the key to send it again with, applied once either way
            cause = {"error": "service unavailable", "cause": str(e), "retry_feedback_id": e.key}
            return HttpAnswer(503, orjson.dumps(cause))
        except ClipperError as e:
            return self._error_answer(e)
        except RecursionError:
            return error(400, "invalid input", "input: expected a list of values, got a list nested too deeply")
        return HttpAnswer(200, orjson.dumps(accepted))

    @staticmethod
    def _error_answer(e: ClipperError) -> HttpAnswer:
        """The project's errors as Clipper's error bodies (a failing model never gets here: it is a default)."""
        if isinstance(e, NotFound):
            return error(404, "unknown application", str(e))
        if isinstance(e, InvalidInput):
            return error(400, "invalid input", str(e))
        if isinstance(e, Unavailable):
            return error(503, "service unavailable", str(e))
        return error(500, "internal error", str(e))
