from __future__ import annotations

import json

import numpy as np
import pytest

from clipper.core.domain import InputType
from clipper.core.messages import MAX_INLINE_PAYLOAD, Payload, QueryMessage, Reply, decode_rows, encode_rows
from clipper.errors import MalformedMessage

pytestmark = pytest.mark.unit


def _message(payload, rows):
    return QueryMessage(
        query_id=7,
        app="digits",
        model="mlp",
        version="1",
        input_type=InputType.FLOATS,
        rows=rows,
        payload=payload,
        deadline_ms=10,
        sent_ms=1,
        reply_to="7",
    )


@pytest.mark.parametrize(
    "rows",
    [
        np.arange(128, dtype=np.float32).reshape(2, 64),
        np.arange(6, dtype=np.int32).reshape(1, 2, 3),
        ["hello", "wörld"],
        [b"\x00\xff", b""],
    ],
)
def test_rows_round_trip_through_a_message(rows):
    payload, blob = encode_rows(rows)
    assert blob is None
    back = QueryMessage.from_json(_message(payload, len(rows)).to_json())
    decoded = decode_rows(back.payload)
    if isinstance(rows, np.ndarray):
        assert decoded.dtype == rows.dtype and np.array_equal(decoded, rows)
    else:
        assert decoded == rows


def test_large_numeric_input_becomes_a_claim_check():
    rows = np.zeros((1, MAX_INLINE_PAYLOAD // 4 + 10), dtype=np.float32)
    payload, blob = encode_rows(rows)
    assert blob is not None and payload.npy is None
    payload.s3_key = "claims/1"
    assert np.array_equal(decode_rows(payload, blob), rows)
    with pytest.raises(MalformedMessage):
        decode_rows(payload, None)


def test_large_string_input_becomes_a_claim_check():
    rows = ["x" * (MAX_INLINE_PAYLOAD + 1)]
    payload, blob = encode_rows(rows)
    assert blob is not None
    payload.s3_key = "claims/2"
    assert decode_rows(payload, blob) == rows


@pytest.mark.parametrize("body", ["", "{}", "not json", '{"v": 2}', '{"query_id": "x"}'])
def test_malformed_messages_are_rejected(body):
    with pytest.raises(MalformedMessage):
        QueryMessage.from_json(body)


def test_pickled_or_foreign_tensors_are_rejected():
    import base64

    from clipper.core.messages import Payload

    with pytest.raises(MalformedMessage):
        decode_rows(Payload(npy=base64.b64encode(b"garbage").decode()))
    with pytest.raises(MalformedMessage):
        decode_rows(Payload())


def test_reply_round_trip():
    r = Reply(query_id=1, model="m", version="1", outputs=[3, 4], timings={"inference_ms": 1.5})
    assert Reply.from_json(r.to_json()) == r and r.ok
    e = Reply(query_id=1, model="m", version="1", error="boom", error_kind="endpoint")
    assert not Reply.from_json(e.to_json()).ok


@pytest.mark.parametrize(
    "array",
    [
        np.arange(64, dtype=np.float32).reshape(1, 64),
        np.zeros((3,), np.int32),
        np.ones((2, 3, 4, 4), np.float64),
        np.array(5, dtype=np.int64),
        np.zeros((0, 8), np.float32),
        np.array([True, False]),
    ],
)
def test_npy_codec_writes_numpys_bytes_and_reads_them_back(array):
    import io

    from clipper.core.tensors import decode_npy, encode_npy

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    assert encode_npy(array) == buf.getvalue()
    back = decode_npy(buf.getvalue())
    assert back.dtype == array.dtype and back.shape == array.shape and np.array_equal(back, array)


def test_npy_codec_falls_back_for_fortran_order_and_rejects_truncation():
    import io

    from clipper.core.tensors import decode_npy, encode_npy

    f = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    buf = io.BytesIO()
    np.save(buf, f)
    assert np.array_equal(decode_npy(buf.getvalue()), f)
    with pytest.raises(MalformedMessage, match="truncated"):
        decode_npy(encode_npy(np.zeros((2, 64), np.float32))[:-4])
    with pytest.raises(MalformedMessage, match="dtype"):
        decode_npy(encode_npy(np.zeros(3, np.complex64)))


def test_npy_header_cache_keeps_checking_every_body():
    """A header seen before is not parsed again, but each body is still checked against it."""
    from clipper.core.tensors import decode_npy, encode_npy

    good = encode_npy(np.arange(64, dtype=np.float32).reshape(1, 64))
    for _ in range(2):
        assert np.array_equal(decode_npy(good), np.arange(64, dtype=np.float32).reshape(1, 64))
        with pytest.raises(MalformedMessage, match="truncated"):
            decode_npy(good[:-4])
        with pytest.raises(MalformedMessage, match="truncated"):
            decode_npy(good + b"\0\0\0\0")
        with pytest.raises(MalformedMessage, match="dtype"):
            decode_npy(encode_npy(np.zeros(3, np.complex64)))
    other = encode_npy(np.ones((2, 64), np.float64))
    assert decode_npy(other).shape == (2, 64) and decode_npy(other).dtype == np.float64


@pytest.mark.parametrize(
    "payload",
    [Payload(npy="AAAA"), Payload(strings=["a", "b"]), Payload(b64=["AA=="]), Payload(s3_key="claims/x")],
)
def test_the_hot_paths_encoding_is_the_models_json(payload):
    from clipper.core.domain import InputType

    values = dict(
        query_id=7 << 16,
        app="digits",
        model="mlp",
        version="2",
        input_type=InputType.FLOATS,
        rows=3,
        payload=payload,
        deadline_ms=1_700_000_000_123,
        sent_ms=1_700_000_000_003,
        reply_to="inbox.0123",
    )
    encoded = QueryMessage.encode(**values)
    assert json.loads(encoded) == json.loads(QueryMessage(**values).to_json())
    assert QueryMessage.from_json(encoded) == QueryMessage(**values)


def test_a_numeric_input_is_inline_only_while_its_base64_fits_the_limit():
    from clipper.core.tensors import encode_npy

    header = len(encode_npy(np.zeros((1, 1), dtype=np.uint8))) - 1
    fits = (MAX_INLINE_PAYLOAD * 3) // 4 - header  # bytes whose .npy encodes to the limit's base64 length or less
    for n, inline in ((fits, True), (fits + 3, False), (MAX_INLINE_PAYLOAD - header - 10, False)):
        rows = np.zeros((1, n), dtype=np.uint8)
        payload, blob = encode_rows(rows)
        assert (blob is None) is inline, n
        if inline:
            assert payload.npy is not None and len(payload.npy) <= MAX_INLINE_PAYLOAD
