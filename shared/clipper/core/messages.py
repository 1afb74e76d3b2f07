"""Wire formats between the frontend and the batcher: the query message (SQS) and the reply.

A query message carries the rows of one request for one model version. Numeric rows travel as a
base64 ``.npy`` tensor, strings as a JSON list, bytes as base64 strings; inputs too large for SQS travel
through S3 (a claim check: the message carries the object key instead of the rows).
"""

from __future__ import annotations

import base64
import math
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clipper.core.domain import InputType
from clipper.core.tensors import decode_npy, encode_npy
from clipper.core.validation import Rows
from clipper.errors import MalformedMessage

# SQS accepts 256 KiB by default; leave room for the envelope and attributes (the cache keys of 1,000 rows, the
# most a query holds, are 43 KB of it). The limit applies to the payload as it travels: base64 for .npy.
MAX_INLINE_PAYLOAD = 200 * 1024


def sqs_text(body: str) -> str:
    """A JSON text as SQS takes it. SQS refuses a message with a character outside #x9, #xA, #xD, #x20-#xD7FF,
    #xE000-#xFFFD and #x10000-#x10FFFF (InvalidMessageContents); a JSON encoder escapes the control characters
    and leaves U+FFFE and U+FFFF raw, which can only stand inside a string: written as their escapes there, the
    text decodes to the same value. (moto takes them, so only a test of this function says it.)"""
    if "\ufffe" in body:
        body = body.replace("\ufffe", "\\ufffe")
    if "\uffff" in body:
        body = body.replace("\uffff", "\\uffff")
    return body


class Payload(BaseModel):
    """Exactly one of the fields is set."""

    model_config = ConfigDict(extra="forbid")

    npy: str | None = None
    strings: list[str] | None = None
    b64: list[str] | None = None
    s3_key: str | None = None


class QueryMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    v: Literal[1] = 1
    query_id: int
    app: str
    model: str
    version: str
    input_type: InputType
    rows: int = Field(ge=1)
    payload: Payload
    deadline_ms: int
    sent_ms: int
    reply_to: str
    # The rows' prediction cache keys (``clipper.core.cache_keys.row_keys``) when the frontend computed them for
    # its lookup: the batcher fills the cache under them instead of hashing the rows again. Absent: it hashes.
    cache_keys: list[str] | None = None

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @staticmethod
    def encode(
        query_id: int,
        app: str,
        model: str,
        version: str,
        input_type: InputType,
        rows: int,
        payload: Payload,
        deadline_ms: int,
        sent_ms: int,
        reply_to: str,
        cache_keys: list[str] | None = None,
    ) -> str:
        """``QueryMessage(...).to_json()`` for the frontend's hot path: the same JSON from values it already
        validated, without building and validating a model (one orjson dump)."""
        fields = {"npy": payload.npy, "strings": payload.strings, "b64": payload.b64, "s3_key": payload.s3_key}
        message: dict[str, Any] = {
            "v": 1,
            "query_id": query_id,
            "app": app,
            "model": model,
            "version": version,
            "input_type": input_type.value,
            "rows": rows,
            "payload": {k: v for k, v in fields.items() if v is not None},
            "deadline_ms": deadline_ms,
            "sent_ms": sent_ms,
            "reply_to": reply_to,
        }
        if cache_keys is not None:
            message["cache_keys"] = cache_keys
        return orjson.dumps(message).decode()

    @classmethod
    def from_json(cls, body: str | bytes) -> QueryMessage:
        try:
            return cls.model_validate_json(body)
        except ValidationError as e:
            raise MalformedMessage(f"not a query message: {e.error_count()} problem(s): {e.errors()[0]}") from e


def encode_rows(rows: Rows) -> tuple[Payload, bytes | None]:
    """Encode rows inline; returns ``(payload, None)``, or ``(empty payload, blob)`` when the rows are too
    large for a message and must go through S3 as a claim check."""
    if isinstance(rows, np.ndarray):
        blob = encode_npy(rows)
        if 4 * ((len(blob) + 2) // 3) > MAX_INLINE_PAYLOAD:  # its base64 length
            return Payload(), blob
        return Payload(npy=base64.b64encode(blob).decode("ascii")), None
    if rows and isinstance(rows[0], bytes):
        payload = Payload(b64=[base64.b64encode(r).decode("ascii") for r in rows])
    else:
        payload = Payload(strings=list(rows))  # type: ignore[arg-type]
    encoded = sqs_text(payload.model_dump_json(exclude_none=True)).encode()  # SQS counts bytes (UTF-8) as sent
    if len(encoded) > MAX_INLINE_PAYLOAD:
        return Payload(), encoded
    return payload, None


def decode_rows(payload: Payload, claimed: bytes | None = None) -> Rows:
    """Rows of a message; ``claimed`` is the S3 object's bytes when the payload is a claim check."""
    if payload.s3_key is not None:
        if claimed is None:
            raise MalformedMessage("claim-check payload without its object")
        if claimed[:6] == b"\x93NUMPY":
            return decode_npy(claimed)
        try:
            payload = Payload.model_validate_json(claimed)
        except ValidationError as e:
            raise MalformedMessage("claim-check object is neither .npy nor a payload") from e
    if payload.npy is not None:
        try:
            return decode_npy(base64.b64decode(payload.npy, validate=True))
        except ValueError as e:
            raise MalformedMessage("npy payload is not base64") from e
    if payload.strings is not None:
        return payload.strings
    if payload.b64 is not None:
        try:
            return [base64.b64decode(s, validate=True) for s in payload.b64]
        except ValueError as e:
            raise MalformedMessage("bytes payload is not base64") from e
    raise MalformedMessage("message payload is empty")


class Reply(BaseModel):
    """A model's answer to one query message: one output per row, or an error that explains why not."""

    model_config = ConfigDict(extra="ignore")

    query_id: int
    model: str
    version: str
    outputs: list[Any] | None = None
    error: str | None = None
    error_kind: Literal["endpoint", "invalid", "expired"] | None = None
    timings: dict[str, float] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.outputs is not None

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def from_json(cls, body: str | bytes) -> Reply:
        try:
            return cls.model_validate_json(body)
        except ValidationError as e:
            raise MalformedMessage(f"not a reply: {e.errors()[0]}") from e


def output_value(value: Any) -> Any:
    """A model output as Clipper returns it: a scalar as is, a vector as a list."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def no_answer(output: Any) -> bool:
    """Whether a model's output for a row answers nothing: ``null``, or a score that is not a finite number (NaN
    and infinities, which JSON carries as ``null``). Such a row is the model's failure, not its prediction."""
    return output is None or (isinstance(output, float) and not math.isfinite(output))


__all__ = ["MAX_INLINE_PAYLOAD", "Payload", "QueryMessage", "Reply", "decode_rows", "encode_rows", "no_answer"]
