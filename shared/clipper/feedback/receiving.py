"""The frontend's side of feedback (``POST /<app>/update``): the label and the client's idempotency key
checked, the feedback message built and measured as it travels, and put on the feedback queue; answered at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from clipper.core.cache_keys import record_keys
from clipper.core.messages import MAX_INLINE_PAYLOAD, Payload, encode_rows, sqs_text
from clipper.core.registry_cache import held_app, reread_app
from clipper.core.validation import QueryInput, fit_models, json_kind, validate_query
from clipper.errors import ClipperError, InvalidInput, MalformedMessage, NotFound, Unavailable
from clipper.ports import PredictionCache, Registry, RequestQueue

logger = logging.getLogger(__name__)


class FeedbackMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    v: Literal[1] = 1
    feedback_id: str
    app: str
    user: str | None = None
    payload: Payload
    label: float | int | str
    # the query's record (``rec:`` key) as the frontend read it when it accepted the feedback: the prediction the
    # label is for. Read by the worker at apply time instead, a query of the same input by the same user in
    # between (its record replaces the first's) had the label judge the later answer's model (a new user's run)
    record: dict[str, Any] | None = None

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def from_json(cls, body: str | bytes) -> FeedbackMessage:
        try:
            return cls.model_validate_json(body)
        except ValidationError as e:
            raise MalformedMessage(f"not a feedback message: {e.errors()[0]}") from e


def validate_label(body: dict[str, Any]) -> float | int | str:
    if "label" not in body:
        raise InvalidInput("label", "the true output for the input (a number or a string)")
    label = body["label"]
    if isinstance(label, bool) or not isinstance(label, int | float | str):
        raise InvalidInput("label", "a number or a string", json_kind(label))
    if isinstance(label, float) and not math.isfinite(label):
        raise InvalidInput("label", "a finite number", str(label))
    if isinstance(label, int) and not _fits_a_double(label):  # JSON has no bound; the loss compares as floats
        raise InvalidInput("label", "a number within a double's range", f"an integer of {len(str(abs(label)))} digits")
    if isinstance(label, str) and _json_bytes(label) - 2 > MAX_LABEL_BYTES:  # as it travels: escapes count
        raise InvalidInput(
            "label",
            f"a string of at most {MAX_LABEL_BYTES} bytes as JSON (UTF-8; a control character's escape is 6)",
            f"{_json_bytes(label) - 2} bytes",
        )
    return label


_CLIENT_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def _shown_key(key: object) -> str:
    """What is wrong with a client's feedback id: its type, its length, or its first character out of the set."""
    if not isinstance(key, str):
        return json_kind(key)
    if not 1 <= len(key) <= 128:
        return f"{len(key)} characters"
    bad = next(i for i, c in enumerate(key) if not _CLIENT_KEY.fullmatch(c))
    return f"{key[bad]!r} at position {bad}"


def feedback_key_and_id(
    app: str, user: str | None, body: dict[str, Any], incarnation: int = 0, content: str = ""
) -> tuple[str, str]:
    """The feedback's idempotency key (the client's ``feedback_id``, or a new one) and the id derived from it: a
    feedback whose send failed ambiguously (a timeout: it may be queued all the same) is answered with its key,
    and the same feedback sent again with that key is the same feedback, applied once. An application deleted
    and added again under the name (another ``incarnation``) is another application: its keys are its own (a
    client numbering its feedbacks 1, 2, 3... had the new application's first ones taken for the old one's).
    A key sent again with another input or label (``content``) is another feedback: it was answered "accepted"
    and then dropped by the worker as a duplicate of the first."""
    key = body.get("feedback_id")
    if key is None:
        key = uuid.uuid4().hex
    elif not isinstance(key, str) or not _CLIENT_KEY.fullmatch(key):
        raise InvalidInput("feedback_id", "1 to 128 letters, digits, '_', '.', ':' or '-'", _shown_key(key))
    # the same key of another app (or incarnation of it) or user is another feedback; an application registered
    # before incarnations existed (0) keeps the ids it had
    scope = json.dumps([app, user, key] if not incarnation else [app, incarnation, user, key])
    if content:
        scope += "\n" + content
    return key, "k" + hashlib.sha256(scope.encode("utf-8", "surrogatepass")).hexdigest()[:31]


class FeedbackNotQueued(Unavailable):
    """The feedback queue did not confirm the send; it may hold the feedback all the same (a timeout). ``key``:
    the feedback's idempotency key, to send it again with, so that it is applied once either way."""

    def __init__(self, cause: str, key: str) -> None:
        super().__init__(
            f"{cause}; the feedback may have been queued all the same: send it again with "
            f'"feedback_id": "{key}" to have it applied once'
        )
        self.key = key


# A label travels in the feedback's queue message beside the input (at most MAX_INLINE_PAYLOAD): together they
# stay under SQS's 256 KiB.
MAX_LABEL_BYTES = 16 * 1024
MAX_MESSAGE_BYTES = 256 * 1024  # SQS's limit on a message


def _json_bytes(text: str) -> int:
    return len(sqs_text(json.dumps(text, ensure_ascii=False)).encode("utf-8", "surrogatepass"))


def _fits_a_double(n: int) -> bool:
    try:
        return math.isfinite(float(n))
    except OverflowError:
        return False


# The time a feedback's accept gives the read of its query's record, and how many such reads may be in flight
RECORD_READ_S = 0.25
MAX_RECORD_READS = 8
_readers: ThreadPoolExecutor | None = None
_readers_lock = threading.Lock()


def _record_readers() -> ThreadPoolExecutor:
    global _readers
    with _readers_lock:
        if _readers is None:
            _readers = ThreadPoolExecutor(MAX_RECORD_READS, thread_name_prefix="clipper-feedback-record")
        return _readers


class FeedbackReceiver:
    """The frontend's side: validate, enqueue, answer at once."""

    def __init__(
        self, registry: Registry, queue: RequestQueue, queue_url: str, cache: PredictionCache | None = None
    ) -> None:
        """``cache``: the prediction cache the query records are in; the record the feedback labels is read from it
        at once and travels in the message (``FeedbackMessage.record``)."""
        self._registry = registry
        self._queue = queue
        self._url = queue_url
        self._cache = cache
        self._reads = 0  # record reads in flight (``_record``)
        self._reads_lock = threading.Lock()

    def _record(self, app: str, user: str | None, rows: Any) -> dict[str, Any] | None:
        """The query's record for this input now, or None: none kept, or not read within ``RECORD_READ_S`` (the
        cache failing, slow or missing its table: the feedback is accepted all the same, and the worker reads the
        record when it applies it, as without a cache here). The read runs on its own thread, at most
        ``MAX_RECORD_READS`` at once (a hung cache holds those, not the feedback requests: a DynamoDB client's
        retries of a hung read outlast the frontend's timeout)."""
        if self._cache is None:
            return None
        (key,) = record_keys(app, user, rows)
        with self._reads_lock:
            if self._reads >= MAX_RECORD_READS:
                return None
            self._reads += 1
        try:
            future = _record_readers().submit(self._read_record, key)
        except RuntimeError:  # shut down (interpreter exit)
            self._read_done(None)
            return None
        future.add_done_callback(self._read_done)
        try:
            record = future.result(RECORD_READ_S)
        except Exception as e:  # the cache's failure or the budget past: the worker reads it
            logger.warning(
                "feedback: the query's record not read (%s): the worker reads it", str(e) or type(e).__name__
            )
            return None
        return record if isinstance(record, dict) else None

    def _check_fits_a_model(self, app: Any, query: QueryInput) -> None:
        """An application without a shape takes inputs of any length, but a model registered with a shape takes no
        other: an input that fits none of the versions a query of it could go to is refused, as the query is
        (``InvalidInput`` naming ``input`` and the shapes), not accepted and then skipped for having no record.
        Those versions: the first linked model's for the ``single`` policy, every linked model's otherwise; of
        each, the active version and a running canary's. A model with neither is left out; nothing is checked
        while the registry cannot be read (the worker reads it again)."""
        try:
            names = self._registry.linked_models(app.name)
            if app.policy == "single":
                names = names[:1]
            pool = []
            for name in names:
                with contextlib.suppress(NotFound):
                    pool.append(self._registry.active_version(name))
                canary = self._registry.canary(name)
                if canary is not None:
                    with contextlib.suppress(NotFound):
                        pool.append(self._registry.get_version(name, canary.version))
        except ClipperError:
            return
        if pool:
            fit_models(app, query, pool, pool)

    def _read_record(self, key: str) -> Any:
        assert self._cache is not None
        return self._cache.get_many([key], timeout=RECORD_READ_S).get(key)

    def _read_done(self, _future: Any) -> None:
        with self._reads_lock:
            self._reads -= 1

    def accept(self, app_name: str, body: Any) -> dict[str, Any]:
        from clipper.frontend.query import user_id

        # the application as the frontend's registry copy holds it, as a query would be answered, even while the
        # registry cannot be read (the worker reads it again to apply the feedback); read when never held, or held
        # past its staleness bound (deleted or changed while no query came: a 404, or the new policy's checks)
        app, current = held_app(self._registry, app_name)
        if app is None:
            app = self._registry.get_app(app_name)
        elif not current:
            with contextlib.suppress(Unavailable):  # else the held one stands: checked again when applied
                app = reread_app(self._registry, app_name)
        if not isinstance(body, dict):
            raise InvalidInput("body", 'a JSON object with "input" and "label"', json_kind(body))
        if "input_batch" in body:
            raise InvalidInput("input_batch", 'one "input" per feedback')
        if "input" not in body:
            raise InvalidInput("input", 'the input the label is for (a feedback is {"input": ..., "label": ...})')
        query = validate_query(app, {"input": body["input"]})
        if app.input_shape is None and isinstance(query.rows, np.ndarray):
            self._check_fits_a_model(app, query)
        label = validate_label(body)
        payload, blob = encode_rows(query.rows)
        if blob is not None:  # its size as sent: .npy in base64, or the strings' JSON
            sent = 4 * ((len(blob) + 2) // 3) if isinstance(query.rows, np.ndarray) else len(blob)
            limit = f"at most {MAX_INLINE_PAYLOAD // 1024} KiB as a queue message carries it"
            raise InvalidInput("input", f"an input of {limit}", f"{sent:,} bytes")
        user = user_id(body)
        content = json.dumps([payload.model_dump(exclude_none=True), label])  # what the feedback says
        key, fid = feedback_key_and_id(app.name, user, body, app.incarnation, content)
        record = self._record(app.name, user, query.rows)
        message = FeedbackMessage(feedback_id=fid, app=app.name, user=user, payload=payload, label=label, record=record)
        body = sqs_text(message.to_json())
        size = len(body.encode("utf-8", "surrogatepass"))
        if size > MAX_MESSAGE_BYTES and record is not None:  # a record too large to travel: the worker reads it
            message = message.model_copy(update={"record": None})
            body = sqs_text(message.to_json())
            size = len(body.encode("utf-8", "surrogatepass"))
        if size > MAX_MESSAGE_BYTES:  # the input's and the label's bounds keep it under; the queue would refuse it
            raise InvalidInput("input", "an input and a label that fit one queue message (256 KiB)", f"{size} bytes")
        if not self._url:
            raise Unavailable("no feedback queue is configured (CLIPPER_FEEDBACK_QUEUE_URL)")
        try:
            self._queue.send(self._url, body)
        except Unavailable as e:
            raise FeedbackNotQueued(str(e), key) from e
        return {"accepted": True, "feedback_id": message.feedback_id}
