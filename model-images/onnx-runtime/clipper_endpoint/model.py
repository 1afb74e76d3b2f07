"""One ONNX model in one ONNX Runtime session: load it, check a batch against its input, run it.

The session is used by one caller at a time (the server runs every batch either on its event loop, ``inline``,
or on one worker thread, ``thread``; ``auto`` picks inline for a light model on the CPU, else the thread). A batch is
rows first: its first dimension is the number of rows, and :meth:`OnnxModel.predict` returns exactly one
output row per input row or raises.

Errors (drawn in the package docstring)::

    EndpointError
    ├── ModelLoadError       the model file is missing or unusable
    ├── InputError           the batch does not fit the model's input (a client error)
    └── PredictionError      the model failed on a batch that fits (a server error)
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

logger = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

# ONNX tensor element types this server feeds, as numpy dtypes (strings travel as object arrays).
_ONNX_DTYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(string)": np.dtype(object),
}
# Which kinds of input array may be cast to which kind of model input (numpy kind letters).
_CASTABLE_KINDS = {"f": "biuf", "i": "biu", "u": "biu", "b": "b", "O": "OUS"}


class EndpointError(Exception):
    """Base of the model endpoint's errors."""


class ModelLoadError(EndpointError):
    """The model file is missing, unreadable, or has a signature this server cannot feed."""


class InputError(EndpointError):
    """A batch does not fit the model's input; the message names the expectation."""


class PredictionError(EndpointError):
    """The model failed on a batch that fits its input, or broke the one-row-out-per-row-in rule."""


def default_providers() -> list[str]:
    """CUDA first when this ONNX Runtime build has it, then the CPU."""
    return [CUDA, CPU] if CUDA in ort.get_available_providers() else [CPU]


def gpu_present(devices: str | Path = "/dev", visible: str | None = None) -> bool:
    """Whether an NVIDIA GPU is visible to this process: the driver's device files (``/dev/nvidia0``...), which the
    NVIDIA container runtime (SageMaker's GPU instances, ``docker run --gpus``) puts in the container, unless
    ``CUDA_VISIBLE_DEVICES`` (``visible``; default: the environment's) hides every one ("", "-1", "none")."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip().lower() in ("", "-1", "none", "void"):
        return False
    return any(Path(devices).glob("nvidia[0-9]*"))


def resolve_model_file(model_path: str | Path) -> Path:
    """``model_path`` itself when it is a file; else ``model.onnx`` in that folder (or its only ``.onnx``)."""
    path = Path(model_path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise ModelLoadError(f"model path {str(path)!r} does not exist")
    if (path / MODEL_FILE).is_file():
        return path / MODEL_FILE
    candidates = sorted(path.glob("*.onnx"))
    if len(candidates) == 1:
        return candidates[0]
    raise ModelLoadError(f"no {MODEL_FILE} in folder {str(path)!r} (found {[c.name for c in candidates]})")


def _why_not_cuda(wanted: Sequence[str]) -> str:
    if CUDA not in ort.get_available_providers():
        return (
            f"this ONNX Runtime build has no {CUDA} (it has {ort.get_available_providers()}; the GPU build is the "
            "onnxruntime-gpu package)"
        )
    if CUDA not in wanted:
        return f"the providers asked for, {list(wanted)}, leave out {CUDA}"
    return (
        f"ONNX Runtime could not start its {CUDA} (its error above names the library: usually a CUDA or cuDNN "
        "version other than the one this onnxruntime-gpu build was made for)"
    )


def _dim(d: Any) -> int | None:
    return d if isinstance(d, int) and d >= 0 else None


class OnnxModel:
    """An ONNX model with one input, ready to predict batches of rows.

    Attributes: ``path``, ``input_name``, ``input_type`` (ONNX type, e.g. ``tensor(float)``), ``dtype`` (numpy
    dtype fed to the session), ``input_shape`` (``None`` for free dimensions), ``output_names``,
    ``output_name`` (the one output :meth:`predict` returns) and ``providers`` (those the session uses).
    """

    def __init__(self, session: ort.InferenceSession, path: Path, output_name: str | None = None) -> None:
        inputs = session.get_inputs()
        if len(inputs) != 1:
            raise ModelLoadError(
                f"model {str(path)!r} has {len(inputs)} inputs {[i.name for i in inputs]}; "
                "this server feeds models with exactly one input"
            )
        (inp,) = inputs
        if inp.type not in _ONNX_DTYPES:
            raise ModelLoadError(f"model input {inp.name!r} has type {inp.type}, which this server cannot feed")
        self.session = session
        self.path = path
        self.input_name: str = inp.name
        self.input_type: str = inp.type
        self.dtype: np.dtype[Any] = _ONNX_DTYPES[inp.type]
        self.input_shape: tuple[int | None, ...] = tuple(_dim(d) for d in inp.shape)
        self.output_names: list[str] = [o.name for o in session.get_outputs()]
        if output_name is None:
            output_name = self.output_names[0]
        elif output_name not in self.output_names:
            raise ModelLoadError(f"model has no output {output_name!r}; its outputs are {self.output_names}")
        self.output_name: str = output_name
        self.providers: list[str] = list(session.get_providers())
        if not self.input_shape:
            raise ModelLoadError(f"model input {inp.name!r} is a scalar; this server feeds batches of rows")
        self._batch_dim = self.input_shape[0]
        self._row_shape = self.input_shape[1:]
        self.row_seconds: float | None = None  # one row's time in the warm-up; None: not warmed up

    @classmethod
    def load(
        cls,
        model_path: str | Path,
        *,
        output_name: str | None = None,
        threads: int = 1,
        providers: Sequence[str] | None = None,
        warmup: bool = True,
        sha256: str = "",
        require_cuda: bool = False,
    ) -> OnnxModel:
        """Open ``model_path`` (a file, or a folder holding ``model.onnx``) in a new session.

        ``threads`` is ONNX Runtime's intra-op thread count; ``providers`` defaults to CUDA (when available)
        then CPU. With ``warmup`` a zero row is run, so the first request does not pay lazy initialisation (and
        ``row_seconds`` says how long a row takes).
        With ``sha256`` (the digest of the file the model updater validated), a file with another digest is
        refused, and the session is made from exactly the bytes checked. With ``require_cuda``, a session that
        does not run on the CUDA provider is refused (ONNX Runtime falls back to the CPU silently, with a log
        line, when its CUDA or cuDNN libraries do not load: a GPU endpoint serving from its CPU).
        """
        path = resolve_model_file(model_path)
        source: str | bytes = str(path)
        if sha256:
            source = path.read_bytes()
            digest = hashlib.sha256(source).hexdigest()
            if digest != sha256.lower():
                raise ModelLoadError(
                    f"model {str(path)!r} has sha256 {digest}, not the validated {sha256}: it was replaced after "
                    "validation, and is not served"
                )
        wanted = list(providers) if providers else default_providers()
        unknown = [p for p in wanted if p not in ort.get_available_providers()]
        if unknown:
            raise ModelLoadError(f"providers {unknown} are not available; have {ort.get_available_providers()}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            session = ort.InferenceSession(source, options, providers=wanted)
        except Exception as e:  # ONNX Runtime raises its own exception classes, all plain Exceptions
            raise ModelLoadError(f"cannot load model {str(path)!r}: {e}") from e
        model = cls(session, path, output_name)
        if require_cuda and CUDA not in model.providers:
            raise ModelLoadError(
                f"model {str(path)!r} would run on {model.providers}, not on the GPU: {_why_not_cuda(wanted)}"
            )
        if CUDA in wanted and CUDA not in model.providers:
            logger.warning("CUDA provider requested but unavailable, running on %s", model.providers)
        logger.info(
            "loaded model %s: input %s %s %s, outputs %s (serving %r), providers %s",
            path,
            model.input_name,
            model.dtype_name,
            model.shape_text,
            model.output_names,
            model.output_name,
            model.providers,
        )
        if warmup:
            model.warmup()
        return model

    @property
    def dtype_name(self) -> str:
        return "string" if self.dtype.kind == "O" else self.dtype.name

    @property
    def shape_text(self) -> str:
        """The input shape as a user reads it: ``[N, 64]``, free inner dimensions as ``*``."""
        dims = ["N" if self._batch_dim is None else str(self._batch_dim)]
        dims += ["*" if d is None else str(d) for d in self._row_shape]
        return "[" + ", ".join(dims) + "]"

    @property
    def row_shape_text(self) -> str:
        """The shape of one row (the input shape without its first dimension)."""
        return "[" + ", ".join("*" if d is None else str(d) for d in self._row_shape) + "]"

    @property
    def expectation(self) -> str:
        return f"expected shape {self.shape_text} {self.dtype_name}"

    def describe(self) -> dict[str, Any]:
        """What ``GET /metadata`` answers."""
        return {
            "model_path": str(self.path),
            "input": {"name": self.input_name, "dtype": self.dtype_name, "shape": list(self.input_shape)},
            "outputs": [
                {"name": o.name, "type": o.type, "shape": [_dim(d) for d in o.shape]}
                for o in self.session.get_outputs()
            ],
            "output_names": self.output_names,
            "output_name": self.output_name,
            "providers": self.providers,
        }

    def prepare(self, batch: np.ndarray) -> np.ndarray:
        """Check ``batch`` against the model's input and cast it to the model's dtype; raise InputError.

        A model whose rows are ``[..., 1]`` (e.g. a text model taking ``[N, 1]`` strings) also takes rows
        without that last axis.
        """
        rank = len(self.input_shape)
        if rank >= 2 and batch.ndim + 1 == rank and self.input_shape[-1] == 1:
            batch = batch.reshape((*batch.shape, 1))  # one value a row for a model that wants [N, 1]
        if batch.ndim >= 1 and batch.shape[0] == 0:
            raise InputError(f"{self.expectation} with at least one row, got none")
        if batch.ndim != rank or not all(
            d is None or d == n for d, n in zip(self._row_shape, batch.shape[1:], strict=True)
        ):
            raise InputError(f"{self.expectation}, got shape {list(batch.shape)} {self._dtype_text(batch)}")
        rows = batch.shape[0]
        if self._batch_dim is not None and rows != self._batch_dim:
            raise InputError(f"{self.expectation} (the model takes exactly {self._batch_dim} rows), got {rows}")
        if batch.dtype.kind not in _CASTABLE_KINDS[self.dtype.kind]:
            raise InputError(f"{self.expectation}, got {self._dtype_text(batch)} values")
        if self.dtype.kind == "O":
            if batch.dtype.kind == "S":
                try:
                    batch = np.char.decode(batch, "utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(f"{self.expectation}, got bytes that are not UTF-8: {e}") from e
            elif batch.dtype.kind == "O" and not all(isinstance(v, str) for v in batch.flat):
                raise InputError(f"{self.expectation}, got values that are not all strings")
            return np.ascontiguousarray(batch, dtype=object)
        if self.dtype.kind != "f" or np.can_cast(batch.dtype, self.dtype):
            return np.ascontiguousarray(batch, dtype=self.dtype)
        with np.errstate(over="ignore"):  # float64 or int64 to float32, ...: an overflow is looked for below
            cast = np.ascontiguousarray(batch, dtype=self.dtype)
        overflowed = ~np.isfinite(cast)  # finite as sent (1e300; 70000 for float16), infinite once cast
        if overflowed.any() and np.isfinite(batch[overflowed]).any():
            limit = float(np.finfo(self.dtype).max)
            raise InputError(f"{self.expectation}, got a value out of {self.dtype_name}'s range (+-{limit:.4g})")
        return cast

    @staticmethod
    def _dtype_text(batch: np.ndarray) -> str:
        kind = batch.dtype.kind
        return {"U": "string", "S": "bytes", "O": "mixed or non-numeric"}.get(kind, batch.dtype.name)

    def run(self, batch: np.ndarray) -> Any:
        """Run a prepared batch; return the selected output, checked to hold one row per input row."""
        try:
            (out,) = self.session.run([self.output_name], {self.input_name: batch})
        except Exception as e:  # ONNX Runtime raises its own exception classes, all plain Exceptions
            raise PredictionError(f"model failed on a batch of shape {list(batch.shape)}: {e}") from e
        rows = len(batch)
        if isinstance(out, np.ndarray) and out.ndim == 0:
            raise PredictionError(f"model returned a scalar as output {self.output_name!r} for {rows} input rows")
        got = len(out)
        if got != rows:
            raise PredictionError(f"model returned {got} rows of output {self.output_name!r} for {rows} input rows")
        return out

    def predict(self, batch: np.ndarray) -> Any:
        """Check, cast and run ``batch``; one output row per input row (an ndarray for tensor outputs)."""
        return self.run(self.prepare(batch))

    def _zeros(self) -> np.ndarray | None:
        """A batch of zero rows of the model's input (None when an inner dimension is free)."""
        if any(d is None for d in self._row_shape):
            return None
        rows = self._batch_dim or 1
        shape = (rows, *(d for d in self._row_shape if d is not None))
        return np.full(shape, "" if self.dtype.kind == "O" else 0, dtype=self.dtype)

    def warmup(self) -> None:
        """Run a batch of zeros (the first run pays ONNX Runtime's lazy initialisation), then time three more:
        their median is ``row_seconds``. A model with a free inner dimension has no batch to make, and is not
        warmed up."""
        batch = self._zeros()
        if batch is None:
            return
        try:
            self.run(batch)
            times = []
            for _ in range(3):
                started = time.perf_counter()
                self.run(batch)
                times.append(time.perf_counter() - started)
            self.row_seconds = sorted(times)[1] / len(batch)
        except PredictionError as e:
            logger.warning("warm-up batch of zeros failed (serving anyway): %s", e)

    def probe(self) -> bool | None:
        """Whether the model still runs a batch of zeros (None: it has none to run); for the health check."""
        batch = self._zeros()
        if batch is None:
            return None
        try:
            self.run(batch)
        except PredictionError as e:
            logger.error("a batch of zeros fails too: %s", e)
            return False
        return True
