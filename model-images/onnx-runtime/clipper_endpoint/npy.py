"""The ``.npy`` wire format, decoded and encoded without a file object on the hot path.

:func:`decode` reads the header that numpy writes with a regular expression and wraps the data with
``np.frombuffer`` (no copy); any other valid header (other writers, structured dtypes) goes through
``np.load``. Object arrays are refused: they would need pickle. :func:`encode` writes a version 1.0 file,
exactly as ``np.save`` does, in one copy of the data.
"""

from __future__ import annotations

import functools
import io
import re
import struct
from typing import Any

import numpy as np

from clipper_endpoint.model import InputError

MAGIC = b"\x93NUMPY"
_ALIGN = 64
_HEADER = re.compile(r"\{'descr': '([^']+)', 'fortran_order': (True|False), 'shape': \(((?:\d+, ?)*\d*)\), \}[ \n]*\Z")


@functools.lru_cache(maxsize=64)
def _dtype(descr: str) -> np.dtype[Any]:
    return np.dtype(descr)


def decode(body: bytes) -> np.ndarray:
    """The array in a ``.npy`` body (read-only, it shares ``body``'s memory); InputError when malformed."""
    if body[:6] != MAGIC or len(body) < 10:
        raise InputError("body is not a .npy array (no \\x93NUMPY magic)")
    major = body[6]
    if major == 1:
        (header_len,) = struct.unpack_from("<H", body, 8)
        start = 10
    elif major in (2, 3):
        if len(body) < 12:
            raise InputError("malformed .npy header: the body ends inside it")
        (header_len,) = struct.unpack_from("<I", body, 8)
        start = 12
    else:
        raise InputError(f"unsupported .npy format version {major}")
    offset = start + header_len
    try:
        header = body[start:offset].decode("utf-8" if major == 3 else "latin1")
    except UnicodeDecodeError as e:
        raise InputError(f"malformed .npy header: {e}") from e
    match = _HEADER.match(header)
    if match is None:
        return _load(body)
    descr, fortran, shape_text = match.groups()
    try:
        dtype = _dtype(descr)
    except (TypeError, ValueError) as e:
        raise InputError(f"malformed .npy header: unknown dtype {descr!r}") from e
    if dtype.hasobject:
        raise InputError("object arrays are not accepted (they need pickle); send numbers or fixed-width strings")
    if dtype.shape or dtype.names:
        raise InputError(f"malformed .npy header: a dtype of plain values is expected, got {descr!r}")
    shape = tuple(int(d) for d in shape_text.split(",") if d.strip())
    count = 1
    for d in shape:
        count *= d
    if len(body) - offset != count * dtype.itemsize:
        raise InputError(
            f".npy body holds {len(body) - offset} data bytes, its header says shape {list(shape)} "
            f"{dtype} ({count * dtype.itemsize} bytes)"
        )
    try:
        array = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
        return np.reshape(array, shape, order="F" if fortran == "True" else "C")
    except ValueError as e:  # a shape numpy cannot make (a dimension past its limits)
        raise InputError(f"malformed .npy header: shape {list(shape)}: {e}") from e


def _load(body: bytes) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError, SyntaxError) as e:
        raise InputError(f"body is not a valid .npy array: {e}") from e
    if not isinstance(array, np.ndarray):  # an .npz archive
        raise InputError("body is an .npz archive; send one .npy array")
    return array


@functools.lru_cache(maxsize=64)
def _descr(dtype: np.dtype[Any]) -> str:
    return str(np.lib.format.dtype_to_descr(dtype))


def header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """The version 1.0 ``.npy`` header (magic included) for a C-ordered array of ``dtype`` and ``shape``."""
    text = f"{{'descr': {_descr(dtype)!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    pad = _ALIGN - (10 + len(text) + 1) % _ALIGN
    encoded = (text + " " * pad + "\n").encode("latin1")
    return MAGIC + b"\x01\x00" + struct.pack("<H", len(encoded)) + encoded


def encode(array: np.ndarray) -> bytes:
    """``array`` as ``.npy`` bytes, C order; arrays of strings (object dtype) become fixed-width unicode.

    TypeError for what ``.npy`` cannot hold without pickle (objects other than strings).
    """
    if array.dtype.hasobject:
        if array.dtype != object or not all(isinstance(v, str) for v in array.flat):
            raise TypeError(f"an array of {array.dtype} values cannot be sent as .npy without pickle")
        array = array.astype(str)
    if array.dtype.fields is not None or array.ndim == 0 or array.ndim > 64:
        buf = io.BytesIO()  # rare shapes: let numpy write the header
        np.save(buf, array, allow_pickle=False)
        return buf.getvalue()
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return b"".join((header(array.dtype, array.shape), array.data))
