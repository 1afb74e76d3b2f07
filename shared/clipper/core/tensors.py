"""Compact binary encoding of numeric tensors (.npy) used between frontend, batcher and endpoint."""

from __future__ import annotations

import io

import numpy as np

from clipper.errors import MalformedMessage

ALLOWED_DTYPES = frozenset({"int32", "int64", "float32", "float64", "uint8", "bool"})


def encode_npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def decode_npy(data: bytes) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise MalformedMessage(f"not a .npy tensor: {e}") from e
    if not isinstance(array, np.ndarray) or array.dtype.name not in ALLOWED_DTYPES:
        raise MalformedMessage(f"unsupported tensor dtype {getattr(array, 'dtype', '?')}")
    return array
