"""Queries from Python (``ClipperConnection.predict`` / ``update``, and ``clipper predict`` / ``clipper update``):
the query API's JSON, with inputs made of what users have at hand.

- numbers: a list, or a numpy array (one row: a query; a 2-D array of rows: an ``input_batch``);
- strings: a ``str``; bytes: ``bytes``, sent base64-encoded as Clipper's bytes input type expects;
- ``batch([...])``: several inputs in one request.

Errors (all ``ClipperError``)::

    ApiError            an API refused a call, or nothing answered
     +-- QueryError     the query API refused a query or a feedback (4xx, 5xx)
          +-- QueryUnanswered   no answer came (status 0): refused or broken connection, or the timeout

A ``QueryError`` of an ``update`` whose feedback may have been taken all the same (no answer, a 5xx) carries the
feedback's ``feedback_id``: ``update(..., feedback_id=e.feedback_id)`` sends it again, applied once either way.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clipper.errors import ClipperError

RETRY_PAUSE_S = 0.5  # before a feedback is sent again (update)


class ApiError(ClipperError):
    """An API refused a call (``status``: the HTTP status, ``cause``: Clipper's cause, naming the problem), or
    nothing answered (``status`` 0)."""

    def __init__(self, status: int, error: str, cause: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(cause if status == 0 else f"{status} {error}: {cause}")
        self.status = status
        self.cause = cause
        self.detail = detail or {}  # the whole error body (a feedback's 503 carries its retry_feedback_id)


class QueryError(ApiError):
    """The query API refused a query (4xx: its cause names the field) or could not take it (5xx).

    ``feedback_id``: for an ``update`` that may have been taken all the same (no answer came, or a 5xx after the
    client's one retry), the key it was sent with: sent again with it (``update(..., feedback_id=e.feedback_id)``),
    the feedback is applied once, whether the lost try reached the server or not. None otherwise."""

    feedback_id: str | None = None


class QueryUnanswered(QueryError):
    """No answer came (``status`` 0): the connection was refused or broke, or no answer within the client's
    timeout. The request may have been taken all the same (a timeout): a query is safe to send again; a feedback
    is, with its ``feedback_id``. A subclass of ``QueryError``, so ``except QueryError`` still catches it."""


def json_answer(
    req: urllib.request.Request,
    timeout_s: float,
    error: type[ApiError],
    where: str,
    unanswered: type[ApiError] | None = None,
) -> Any:
    """The JSON answer to ``req``; a refusal raises ``error`` with Clipper's error body, no answer ``unanswered``
    (default ``error``), status 0, naming ``where``."""
    none = unanswered or error
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as e:
        try:
            detail = json.loads(e.read())
        except ValueError:
            detail = None
        if not isinstance(detail, dict):  # not Clipper's error body
            detail = {"error": e.reason, "cause": ""}
        raise error(e.code, detail.get("error", ""), detail.get("cause", ""), detail) from e
    except urllib.error.URLError as e:
        raise none(0, "unreachable", f"no Clipper API answers at {where} ({e.reason})") from e
    except TimeoutError as e:  # connected, but no answer within timeout_s
        raise none(0, "unreachable", f"no answer from {where} within {timeout_s:g} s") from e
    except (OSError, http.client.HTTPException) as e:  # the connection broke, or what came back was not HTTP
        raise none(0, "unreachable", f"no Clipper API answers at {where} ({type(e).__name__}: {e})") from e
    try:
        return json.loads(body)
    except ValueError as e:  # a proxy's page, another server on that port
        start = body[:80].decode(errors="replace")
        raise error(status, "not JSON", f"{where} answered {status} with no JSON (it starts: {start!r})") from e


@dataclass(frozen=True)
class batch:  # lower case: reads as a function at the call site, predict(app, batch(rows))
    inputs: list[Any]


def shaped(value: Any, input_shape: Sequence[int] | None) -> Any:
    """Numbers as given (a nested list or a numpy array) as one input or a ``batch``, by the application's
    declared ``input_shape``: an array of that shape (or of its flat values) is one input, one more leading
    dimension makes a batch of them; without a declared shape (inputs are flat) a 2-D array is a batch of rows.
    Anything else is one input as given, for the query API to accept or to refuse naming the field."""
    import numpy as np

    try:
        arr = np.asarray(value)
    except ValueError:  # ragged: the API says what it expects
        return value
    if arr.dtype.kind not in "iuf" or arr.ndim == 0:
        return value
    rows = list(value) if isinstance(value, list) else list(arr)
    one = value if isinstance(value, list) else arr.tolist()  # a list: never taken for a batch of rows
    if not input_shape:
        return batch(rows) if arr.ndim == 2 else one
    shape, size = tuple(input_shape), math.prod(input_shape)
    if arr.shape == shape or (arr.ndim == 1 and arr.size == size):
        return one
    if arr.shape[1:] == shape or (arr.ndim == 2 and arr.shape[1] == size):
        return batch(rows)
    return one  # one input, as a list: the API names its shape (an array of 2-D was sent as input_batch)


def json_value(value: Any) -> Any:
    """``json.dumps``'s ``default``: a numpy number as its Python number (a label ``y[i]``, a uid, the items of a
    list built from an array), a numpy array as its lists; anything else is not JSON (``TypeError``, as
    without it)."""
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return value.tolist()  # a numpy scalar's tolist() is its Python number
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def encode_input(value: Any) -> Any:
    """One input as JSON: numpy arrays as lists, bytes as base64 text, the rest as given."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def query_body(value: Any, uid: int | str | None = None) -> dict[str, Any]:
    if isinstance(value, batch):
        body: dict[str, Any] = {"input_batch": [encode_input(v) for v in value.inputs]}
    elif hasattr(value, "ndim") and value.ndim == 2:
        body = {"input_batch": value.tolist()}
    else:
        body = {"input": encode_input(value)}
    if uid is not None:
        body["uid"] = uid
    return body


def post(url: str, body: dict[str, Any], timeout_s: float) -> Any:
    req = urllib.request.Request(
        url, json.dumps(body, default=json_value).encode(), {"Content-Type": "application/json"}
    )
    return json_answer(req, timeout_s, QueryError, url, QueryUnanswered)


def predict(base: str, app: str, value: Any, uid: int | str | None, debug: bool, timeout_s: float) -> Any:
    suffix = "?debug=true" if debug else ""
    return post(f"{base}/{app}/predict{suffix}", query_body(value, uid), timeout_s)


def update(
    base: str, app: str, value: Any, label: Any, uid: int | str | None, timeout_s: float, feedback_id: str | None = None
) -> Any:
    """One feedback, with the caller's idempotency key or a new one, so that it is sent again once, safely, when
    its answer does not come or is a 5xx (the server may hold it all the same: with the same key it is the same
    feedback, applied once). When the second try is unanswered too (or a 5xx), the error carries the key as its
    ``feedback_id``, for the caller to send it again with later."""
    key = feedback_id or uuid.uuid4().hex
    body = {**query_body(value, uid), "label": label, "feedback_id": key}
    if "input_batch" in body:
        raise QueryError(0, "invalid input", "update: one input per feedback (not a batch)")
    url = f"{base}/{app}/update"
    try:
        return post(url, body, timeout_s)
    except QueryError as e:
        if not _maybe_taken(e):
            raise  # refused: sent again, it would be refused again
    time.sleep(RETRY_PAUSE_S)
    try:
        return post(url, body, timeout_s)
    except QueryError as e:
        if _maybe_taken(e):
            e.feedback_id = key  # taken or not, unknown: sent again with the key, it is applied once
        raise


def _maybe_taken(e: QueryError) -> bool:
    """Whether the feedback may have been taken all the same: no answer came (0: QueryUnanswered's), or a 5xx: the
    queue did not confirm it (503), or the frontend failed or timed out after sending it (API Gateway's 502 and 504,
    a 500). With its key, a feedback sent again is applied once."""
    return e.status == 0 or e.status >= 500
