"""Compact binary encoding of numeric tensors (.npy) used between frontend, batcher and endpoint.

The common case (a C-ordered array of an allowed dtype) is read and written without ``np.load`` /
``np.save``, whose header handling (``ast.literal_eval``) cost ~100 us a message in the batcher; anything
else falls back to numpy's own reader. The bytes are exactly what ``np.save`` writes (format 1.0).
"""

from __future__ import annotations

import io
import math
import re
from typing import Any

import numpy as np

from clipper.errors import MalformedMessage

ALLOWED_DTYPES = frozenset({"int32", "int64", "float32", "float64", "uint8", "bool"})
_MAGIC = b"\x93NUMPY"
_MAGIC_V1 = _MAGIC + b"\x01\x00"
_HEADER = re.compile(
    rb"^\{'descr': '([<>|=]?[a-z]\d+)', 'fortran_order': False, 'shape': \(((?:\d+, ?)*\d*)\), \} *\n$"
)


def encode_npy(array: np.ndarray) -> bytes:
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)  # (it would also turn a 0-d array into a 1-d one)
    shape = array.shape
    shape_text = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = f"{{'descr': '{array.dtype.str}', 'fortran_order': False, 'shape': {shape_text}, }}"
    pad = 64 - (10 + len(header) + 1) % 64  # total header length a multiple of 64, as numpy aligns it
    header_bytes = (header + " " * (pad % 64) + "\n").encode("latin1")
    if len(header_bytes) > 65535:
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        return buf.getvalue()
    prefix = _MAGIC_V1 + len(header_bytes).to_bytes(2, "little") + header_bytes
    return b"".join((prefix, array.data))  # one copy of the data (tobytes and + would make two)


# Parsed headers, keyed by their bytes: a stream of messages repeats a handful of headers (one row of the
# same model input), so the regex, the dtype and the shape are worked out once each. Bounded: cleared when full.
_HEADERS: dict[bytes, tuple[np.dtype[Any], tuple[int, ...], int] | None] = {}
_MAX_HEADERS = 256


def _parse_header(header: bytes) -> tuple[np.dtype[Any], tuple[int, ...], int] | None:
    """(dtype, shape, data bytes) of a header numpy writes, or None for anything else (numpy's reader then)."""
    match = _HEADER.match(header)
    if match is None:
        return None
    try:
        dtype = np.dtype(match.group(1).decode())
    except TypeError as e:
        raise MalformedMessage(f"not a .npy tensor: {e}") from e
    if dtype.name not in ALLOWED_DTYPES:
        raise MalformedMessage(f"unsupported tensor dtype {dtype}")
    shape = tuple(int(d) for d in match.group(2).decode().replace(" ", "").split(",") if d)
    return dtype, shape, math.prod(shape) * dtype.itemsize


def _fast_decode(data: bytes) -> np.ndarray | None:
    if data[:8] != _MAGIC_V1:
        return None
    end = 10 + int.from_bytes(data[8:10], "little")
    header = data[10:end]
    try:
        parsed = _HEADERS[header]
    except KeyError:
        parsed = _parse_header(header)
        if len(_HEADERS) >= _MAX_HEADERS:
            _HEADERS.clear()
        _HEADERS[header] = parsed
    if parsed is None:
        return None
    dtype, shape, size = parsed
    if len(data) - end != size:
        raise MalformedMessage("truncated .npy tensor")
    return np.frombuffer(data, dtype=dtype, offset=end).reshape(shape)


def decode_npy(data: bytes) -> np.ndarray:
    try:
        array = _fast_decode(data)
        if array is not None:
            return array  # its dtype was checked when its header was first parsed
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError, TypeError) as e:
        raise MalformedMessage(f"not a .npy tensor: {e}") from e
    if not isinstance(array, np.ndarray) or array.dtype.name not in ALLOWED_DTYPES:
        raise MalformedMessage(f"unsupported tensor dtype {getattr(array, 'dtype', '?')}")
    return array
