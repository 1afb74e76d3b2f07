"""Validation of an uploaded ONNX model before it is registered.

:func:`validate_model` takes the file's bytes and the applications the model is linked to, and answers a
:class:`ValidationResult`: ``ok``, the :class:`Signature` it found (when the file loaded) and, when not ok,
the reasons, each naming what is wrong (and the application, for a mismatch with one). A bad file is a
result, never an exception; this module does no I/O.

The checks, in the order they run:
1. the bytes load in ONNX Runtime (CPU provider, one thread);
2. the model has exactly one input (the endpoint feeds one), a tensor of a type the endpoint can feed, with a
   free first (batch) dimension: the batcher sends any number of rows;
3. for each linked application, the input's element type suits its input type (``integers``: int32 or
   int64; ``floats``: float32; ``doubles``: float64; ``strings``: string; ``bytes``: string, as the endpoint gets
   a bytes input: one value a row, not a uint8 tensor) and its
   ``input_shape``, when set, has the rank of the model's rows and equals every fixed dimension of them;
4. ``SAMPLE_ROWS`` rows of zeros run through the model, and its first output (the one the endpoint serves)
   has exactly one row per input row. ``before_sample_run``, when given, is called with the signature and the
   reasons found so far just before the run: a caller that stops a run taking too long
   (``clipper.models.isolated``) still knows them.

onnxruntime is imported when a model is validated, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clipper.core.domain import Application, InputType

SAMPLE_ROWS = 2

# ONNX Runtime's type names of the tensors the endpoint can feed, as element type names.
_ELEMENT_TYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "string",
}
# Element types each input type may feed, the preferred one first.
ACCEPTED_ELEMENT_TYPES: dict[InputType, tuple[str, ...]] = {
    InputType.INTEGERS: ("int32", "int64"),
    InputType.FLOATS: ("float32",),
    InputType.DOUBLES: ("float64",),
    InputType.STRINGS: ("string",),
    InputType.BYTES: ("string",),  # a row's bytes reach the model as one value, not a uint8 tensor of a fixed width
}

Dim = int | str | None  # a fixed size, a symbolic dimension's name, or unknown


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, element type (``float32``... or ONNX's text for a non-tensor, e.g.
    ``seq(map(int64,tensor(float)))``) and shape (ints fixed, names or ``None`` free)."""

    name: str
    element_type: str
    shape: tuple[Dim, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "element_type": self.element_type, "shape": list(self.shape)}


@dataclass(frozen=True)
class Signature:
    """A model's first input and its outputs."""

    input: TensorSpec
    outputs: tuple[TensorSpec, ...]
    input_count: int = 1

    @property
    def row_dims(self) -> tuple[Dim, ...]:
        """The input's dimensions after the batch dimension."""
        return self.input.shape[1:]

    @property
    def fixed_row_shape(self) -> tuple[int, ...] | None:
        """The shape of one input row when every dimension of it is fixed, else None."""
        dims = self.row_dims
        return tuple(d for d in dims if isinstance(d, int)) if all(isinstance(d, int) for d in dims) else None

    def input_type(self, preferred: Sequence[InputType] = ()) -> InputType | None:
        """The first of ``preferred`` that can feed this input, else the input type it implies, else None."""
        for t in preferred:
            if self.input.element_type in ACCEPTED_ELEMENT_TYPES[t]:
                return t
        # none preferred (a new model, linked to no application yet): the first type that takes it (int64:
        # integers, as the deployers convert a scikit-learn model for an integers application; string: strings)
        return next((t for t, types in ACCEPTED_ELEMENT_TYPES.items() if self.input.element_type in types), None)

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input.to_dict(), "outputs": [o.to_dict() for o in self.outputs]}


@dataclass(frozen=True)
class ValidationResult:
    ok: bool
    signature: Signature | None
    reasons: tuple[str, ...] = ()


def validate_model(
    data: bytes,
    apps: Sequence[Application] = (),
    before_sample_run: Callable[[Signature, Sequence[str]], None] | None = None,
) -> ValidationResult:
    """Whether the ONNX model in ``data`` can serve every application in ``apps`` (see the module doc)."""
    try:
        session = _load(data)
        inputs = session.get_inputs()
        outputs = session.get_outputs()
    except Exception as e:  # ONNX Runtime raises its own classes, all plain Exceptions
        return ValidationResult(False, None, (f"the file is not a loadable ONNX model: {_brief(e)}",))
    if not inputs or not outputs:
        return ValidationResult(False, None, (f"the model has {len(inputs)} inputs and {len(outputs)} outputs",))
    signature = Signature(_spec(inputs[0]), tuple(_spec(o) for o in outputs), len(inputs))
    unfeedable = _feedable(signature)
    reasons = list(unfeedable)
    for app in apps:
        reasons.extend(_app_mismatches(signature, app))
    if not unfeedable:
        if before_sample_run is not None:
            before_sample_run(signature, tuple(reasons))
        reasons.extend(_sample_run(session, signature, apps))
    return ValidationResult(not reasons, signature, tuple(reasons))


def _load(data: bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: a rejected file is reported in the result, not on stderr
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _brief(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _spec(arg: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, int | str) else None for d in (arg.shape or ()))
    return TensorSpec(arg.name, _ELEMENT_TYPES.get(arg.type, arg.type), shape)


def _shape_text(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else "*" for d in dims) + "]"


def _feedable(sig: Signature) -> list[str]:
    """Why the endpoint could not feed this model batches of rows (empty when it can)."""
    reasons = []
    inp = sig.input
    if sig.input_count != 1:
        reasons.append(f"the model has {sig.input_count} inputs; the endpoint feeds models with exactly one")
    if inp.element_type not in _ELEMENT_TYPES.values():
        reasons.append(f"input {inp.name!r} is {inp.element_type}, which the endpoint cannot feed")
    if not inp.shape:
        reasons.append(f"input {inp.name!r} is a scalar; the endpoint feeds batches of rows")
    elif isinstance(inp.shape[0], int):
        reasons.append(
            f"input {inp.name!r} has a fixed batch dimension {_shape_text(inp.shape)}; "
            "the batcher sends any number of rows"
        )
    return reasons


def _app_mismatches(sig: Signature, app: Application) -> list[str]:
    reasons = []
    inp = sig.input
    accepted = ACCEPTED_ELEMENT_TYPES[app.input_type]
    if inp.element_type not in accepted:
        reasons.append(
            f"application {app.name!r} takes {app.input_type.value} ({' or '.join(accepted)} tensors); "
            f"the model's input {inp.name!r} is {inp.element_type}"
        )
    if app.input_shape is not None and inp.shape:
        rows = sig.row_dims
        fits = len(rows) == len(app.input_shape) and all(
            not isinstance(m, int) or m == a for m, a in zip(rows, app.input_shape, strict=True)
        )
        if not fits:
            reasons.append(
                f"application {app.name!r} has input shape {list(app.input_shape)}; "
                f"the model's input {inp.name!r} takes rows of shape {_shape_text(rows)}"
            )
    return reasons


def _sample_shape(sig: Signature, apps: Sequence[Application]) -> tuple[int, ...]:
    """Rows of the model's fixed dimensions; a free one takes an application's size there, else 1."""
    shapes = [a.input_shape for a in apps if a.input_shape is not None and len(a.input_shape) == len(sig.row_dims)]
    dims = []
    for i, d in enumerate(sig.row_dims):
        dims.append(d if isinstance(d, int) else (shapes[0][i] if shapes else 1))
    return (SAMPLE_ROWS, *dims)


def describe_sample(sig: Signature, apps: Sequence[Application]) -> str:
    """The sample the model is run on, in words (``a sample of 2 zero rows, shape [2, 64] float32``)."""
    return f"a sample of {SAMPLE_ROWS} zero rows, shape {list(_sample_shape(sig, apps))} {sig.input.element_type}"


def _sample_run(session: Any, sig: Signature, apps: Sequence[Application]) -> list[str]:
    shape = _sample_shape(sig, apps)
    element = sig.input.element_type
    sample = np.full(shape, "", dtype=object) if element == "string" else np.zeros(shape, dtype=element)
    first = sig.outputs[0]
    where = describe_sample(sig, apps)
    try:
        (out,) = session.run([first.name], {sig.input.name: sample})
    except Exception as e:  # ONNX Runtime's own exception classes
        return [f"the model fails on {where}: {_brief(e)}"]
    rows = len(out) if isinstance(out, list) else (out.shape[0] if getattr(out, "ndim", 0) else 0)
    if rows != SAMPLE_ROWS:
        return [
            f"the model answers {rows} rows in output {first.name!r} for {where}; "
            "it must answer exactly one row per input row"
        ]
    return []
