"""What the deployers do before an upload: convert a framework model to ONNX and check it on a sample input.

    ClipperError
    └── DeployError    the model cannot be converted, fails its sample input, or was rejected (``reasons``)

numpy, onnxruntime, skl2onnx and torch are imported when called, so the client stays cheap to import; torch
is optional (``deploy_pytorch_model`` says how to install it when it is missing).
"""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clipper.core.domain import InputType
from clipper.errors import ClipperError

INPUT_NAME = "input"
TARGET_OPSET = {"": 15, "ai.onnx.ml": 3}


class DeployError(ClipperError):
    def __init__(self, message: str, reasons: Sequence[str] = ()) -> None:
        self.reasons = tuple(reasons) or (message,)
        super().__init__(message if not reasons else f"{message}: {'; '.join(reasons)}")


@dataclass(frozen=True)
class SampleCheck:
    rows: int
    outputs: list[Any]  # the first output, one per row (what the endpoint serves)


def as_sample(sample_input: Any, input_type: str) -> np.ndarray:
    """The sample as an array of rows in the input type's dtype (one row becomes a batch of one)."""
    dtype = InputType(input_type).numpy_dtype
    if dtype == "object":
        raise DeployError(f"input type {input_type}: the deployers convert numeric models only")
    try:
        sample = np.asarray(sample_input, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as e:  # text, ragged rows, None: a CLI traceback before
        raise DeployError(f"the sample input is not {input_type} rows ({e})") from e
    return sample[None, ...] if sample.ndim == 1 else sample


def sklearn_to_onnx(model: Any, sample: np.ndarray, name: str) -> bytes:
    """A fitted scikit-learn estimator (or pipeline) as ONNX with one input ``input`` of the sample's row shape
    (any number of rows); a classifier answers labels first, then probabilities as a plain tensor."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import DoubleTensorType, FloatTensorType, Int32TensorType, Int64TensorType
    from sklearn.base import is_classifier

    # an integers application: int64 first (what skl2onnx's converters take; int32 is refused by most, the
    # linear models and trees among them), then int32; the endpoint casts the app's int32 rows to the model's
    tensors = {
        "float32": [FloatTensorType],
        "float64": [DoubleTensorType],
        "int32": [Int64TensorType, Int32TensorType],
    }[sample.dtype.name]
    failures: list[Exception] = []
    for tensor in tensors:
        try:
            onx = convert_sklearn(
                model,
                initial_types=[(INPUT_NAME, tensor([None, *sample.shape[1:]]))],
                options={"zipmap": False} if is_classifier(model) else None,
                target_opset=TARGET_OPSET,
                name=f"clipper_{name}",
            )
            if not is_classifier(model):
                _flatten_single_output(onx)
            return bytes(onx.SerializeToString())
        except Exception as e:  # skl2onnx raises many types for what it cannot convert
            failures.append(e)
    first = failures[0]
    raise DeployError(
        f"scikit-learn model not convertible to ONNX ({type(first).__name__})", [str(e) for e in failures]
    ) from first


def _flatten_single_output(onx: Any) -> None:
    """A regressor of one target answers ``[N, 1]`` from skl2onnx: reshaped to ``[N]``, so each query's output
    is its number (a score the combiners average and a number label's feedback is judged against), not a list of
    one. Other shapes (several targets) are left as they are."""
    from onnx import TensorProto, helper

    graph = onx.graph
    out = graph.output[0]
    dims = out.type.tensor_type.shape.dim
    if len(dims) != 2 or not dims[1].HasField("dim_value") or dims[1].dim_value != 1:
        return
    # a new output fed by a Reshape of the old one (whatever else reads or makes it stays as it was)
    flat, shape = f"{out.name}_flat", f"{out.name}_flat_shape"
    graph.initializer.append(helper.make_tensor(shape, TensorProto.INT64, [1], [-1]))
    graph.node.append(helper.make_node("Reshape", [out.name, shape], [flat], name=f"{out.name}_flatten"))
    batch = dims[0].dim_param if dims[0].HasField("dim_param") else None
    graph.output[0].CopyFrom(helper.make_tensor_value_info(flat, out.type.tensor_type.elem_type, [batch]))


def pytorch_to_onnx(model: Any, sample: np.ndarray) -> bytes:
    """A torch.nn.Module as ONNX (``torch.onnx.export``) with a dynamic batch dimension."""
    if importlib.util.find_spec("torch") is None:
        raise DeployError("deploy_pytorch_model needs PyTorch: pip install torch (then call it again)")
    import torch

    buffer = io.BytesIO()
    model.eval()
    try:
        torch.onnx.export(
            model,
            (torch.from_numpy(sample),),
            buffer,
            input_names=[INPUT_NAME],
            output_names=["output"],
            dynamic_axes={INPUT_NAME: {0: "batch"}, "output": {0: "batch"}},
        )
    except Exception as e:  # torch raises many types for what it cannot export
        raise DeployError(f"PyTorch model not exportable to ONNX ({type(e).__name__})", [str(e)]) from e
    return buffer.getvalue()


def check_on_sample(data: bytes, sample: np.ndarray | None) -> SampleCheck:
    """Load the model in ONNX Runtime and run the sample (default: two rows of zeros of the input's fixed row
    shape); the first output must have one row per input row, as the endpoint serves it."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's load errors have no common base
        raise DeployError("the file does not load in ONNX Runtime", [str(e).splitlines()[0][:300]]) from e
    (spec, *others) = session.get_inputs()
    if others:
        raise DeployError(f"the model has {1 + len(others)} inputs; the endpoint feeds exactly one")
    dtypes = {
        "tensor(float)": np.float32,
        "tensor(double)": np.float64,
        "tensor(int32)": np.int32,
        "tensor(int64)": np.int64,
    }
    dtype = dtypes.get(spec.type)
    if sample is None:
        dims = spec.shape[1:]
        if not all(isinstance(d, int) for d in dims):
            raise DeployError(f"give a sample input: the model's rows have free dimensions {dims}")
        if dtype is None:
            raise DeployError(f"give a sample input for a model taking {spec.type}")
        sample = np.zeros((2, *dims), dtype=dtype)
    elif dtype is not None and sample.dtype != dtype and np.can_cast(sample.dtype, dtype, "safe"):
        sample = sample.astype(dtype)  # as the endpoint casts an application's rows (int32 to an int64 model)
    try:
        first = session.run(None, {spec.name: sample})[0]
    except Exception as e:  # onnxruntime's run errors have no common base
        raise DeployError("the model fails on the sample input", [str(e).splitlines()[0][:300]]) from e
    if len(first) != len(sample):
        raise DeployError(f"the model answered {len(first)} rows for {len(sample)} sample rows")
    return SampleCheck(len(sample), np.asarray(first).tolist())
