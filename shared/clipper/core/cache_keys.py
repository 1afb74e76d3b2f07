"""Prediction cache keys: a digest of (model, version, input type, input bytes), one per input row.

The version is part of the key, so a version switch can never return the old version's predictions;
the dtype and shape are part of it, so the same bytes read as another tensor never collide.
"""

from __future__ import annotations

import hashlib

import numpy as np

from clipper.core.validation import Rows


def row_keys(model: str, version: str, rows: Rows) -> list[str]:
    prefix = hashlib.sha256(f"{model}\x00{version}\x00".encode()).digest()
    keys = []
    if isinstance(rows, np.ndarray):
        tag = f"{rows.dtype.str}{rows.shape[1:]}".encode()
        contiguous = np.ascontiguousarray(rows)
        for i in range(len(contiguous)):
            h = hashlib.blake2b(prefix + tag, digest_size=20)
            h.update(contiguous[i].tobytes())
            keys.append(h.hexdigest())
        return keys
    for row in rows:
        h = hashlib.blake2b(prefix, digest_size=20)
        h.update(b"b" if isinstance(row, bytes) else b"s")
        h.update(row if isinstance(row, bytes) else row.encode())
        keys.append(h.hexdigest())
    return keys


def record_keys(app: str, user: str | None, rows: Rows) -> list[str]:
    """Keys of the query records that feedback joins with: (app, user, input), whatever the models."""
    return ["rec:" + k for k in row_keys(f"app\x00{app}", user or "", rows)]
