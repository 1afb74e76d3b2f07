"""Distinct request bodies: every query of a run carries an input no earlier query had, so no prediction
cache can answer it.

A body is a base row (a held-out digits row for the MLP; a fixed-seed random 3x32x32 image for the CNN, flat,
values to 3 decimals) whose element 0 is replaced by ``n * 2**-20`` for the query's serial number ``n``: exact
in float32 for the first 2**24 queries of a run, and between 0 and 16 (pixel 0 of every digits image is blank,
so the digit stays what it was). The rest of each base row is encoded to JSON once; a request is assembled from
it before its trial starts, so the generator does no encoding while it sends.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.frontdoor.config import MODELS_DIR, SEED, ModelCase

STEP = 2.0**-20
_CNN_BASE_ROWS = 64


def base_rows(case: ModelCase) -> np.ndarray:
    """The base rows of a model case, flat float32 (one row per query input)."""
    if case.name == "cnn" or len(case.input_shape) > 1:
        rng = np.random.default_rng(SEED)
        size = int(np.prod(case.input_shape))
        return np.round(rng.random((_CNN_BASE_ROWS, size)), 3).astype(np.float32)
    from infra.demo.train_models import ensure_models

    manifest = ensure_models(MODELS_DIR, log=lambda line: None)
    holdout = np.load(Path(manifest["out_dir"]) / manifest["dataset"]["holdout"])
    return np.ascontiguousarray(holdout["X"], dtype=np.float32)


class Bodies:
    """JSON bodies ``{"input": [...]}`` and whole HTTP requests for ``POST /<app>/predict``."""

    def __init__(self, rows: np.ndarray, app: str, host: str = "127.0.0.1") -> None:
        self._tails = [("," + ",".join(_number(v) for v in row[1:]) + "]}").encode() for row in rows]
        self._head = (
            f"POST /{app}/predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: "
        ).encode()
        self.path = f"/{app}/predict"

    def body(self, serial: int) -> bytes:
        return b'{"input":[' + repr(serial * STEP).encode() + self._tails[serial % len(self._tails)]

    def request(self, serial: int) -> bytes:
        body = self.body(serial)
        return self._head + str(len(body)).encode() + b"\r\n\r\n" + body


class Serials:
    """The run's query serial numbers: each is handed out once."""

    def __init__(self, first: int = 1) -> None:
        self.next = first

    def take(self, count: int) -> range:
        out = range(self.next, self.next + count)
        self.next += count
        return out


def _number(value: np.float32) -> str:
    text = str(value)  # numpy's shortest text that reads back as the same float32
    return text[:-2] if text.endswith(".0") else text
