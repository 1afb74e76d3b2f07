"""Build the benchmark CNN: a small VGG-style convolutional network on 3x32x32 images, as ONNX.

The batching benchmark needs a model whose cost is compute, not serving overhead (the digits models take
tens of microseconds a call). This one spends roughly 5-10 ms an image on one ONNX Runtime CPU thread:

    input  float32 [N, 3, 32, 32]
    3 x (Conv 3x3 + Relu, Conv 3x3 + Relu, MaxPool 2x2)     channels 80, 160, 320; 32x32 -> 4x4
    Flatten, Gemm 5120 -> 256, Relu, Gemm 256 -> 10          scores
    outputs ``label`` int64 [N] (ArgMax of the scores), ``scores`` float32 [N, 10] (Softmax)

The weights are fixed-seed random (He initialisation, so activations stay finite): the model is about the
cost of a real CNN, not about accuracy. The graph is built with ``onnx.helper`` (no deep-learning framework)
at opset 15, so any ONNX Runtime from 1.12 on loads it, and the bytes are the same on every run.

Run ``python infra/demo/cnn_model.py [--out build/models] [--force] [--time]``; without ``--force`` an
existing model made by this recipe is left alone. Code calls :func:`ensure_cnn`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import numpy as np

if __package__:
    from infra.demo.train_models import write_atomic
else:  # run as a script: python infra/demo/cnn_model.py
    from train_models import write_atomic  # type: ignore[no-redef]

NAME = "cnn"
VERSION = "1"
INPUT_NAME = "input"
INPUT_SHAPE = (3, 32, 32)
N_CLASSES = 10
OPSET = 15
SEED = 0
# Output channels of the three conv blocks (two 3x3 convolutions each, then a 2x2 max pool).
CHANNELS = (80, 160, 320)
HIDDEN = 256


def recipe_fingerprint() -> str:
    """A short hash of everything that decides the model's bytes (kept in the model's metadata)."""
    text = repr((VERSION, INPUT_SHAPE, N_CLASSES, OPSET, SEED, CHANNELS, HIDDEN))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_relpath() -> str:
    return f"{NAME}/{VERSION}/model.onnx"


def build_cnn() -> bytes:
    """The serialised ONNX model (deterministic: the same bytes on every call)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(SEED)
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, shape: tuple[int, ...], fan_in: int) -> str:
        values = rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        initializers.append(numpy_helper.from_array(values, name))
        return name

    def bias(name: str, size: int) -> str:
        initializers.append(numpy_helper.from_array(np.zeros(size, np.float32), name))
        return name

    x, in_ch = INPUT_NAME, INPUT_SHAPE[0]
    for block, out_ch in enumerate(CHANNELS, start=1):
        for conv in (1, 2):
            prefix = f"conv{block}_{conv}"
            w = weight(f"{prefix}_w", (out_ch, in_ch, 3, 3), in_ch * 9)
            b = bias(f"{prefix}_b", out_ch)
            nodes.append(helper.make_node("Conv", [x, w, b], [prefix], name=prefix, pads=[1, 1, 1, 1]))
            nodes.append(helper.make_node("Relu", [prefix], [f"{prefix}_relu"], name=f"{prefix}_relu"))
            x, in_ch = f"{prefix}_relu", out_ch
        pool = f"pool{block}"
        nodes.append(helper.make_node("MaxPool", [x], [pool], name=pool, kernel_shape=[2, 2], strides=[2, 2]))
        x = pool
    side = INPUT_SHAPE[1] // 2 ** len(CHANNELS)
    flat_size = in_ch * side * side
    nodes.append(helper.make_node("Flatten", [x], ["flat"], name="flatten", axis=1))
    w1 = weight("fc1_w", (flat_size, HIDDEN), flat_size)
    nodes.append(helper.make_node("Gemm", ["flat", w1, bias("fc1_b", HIDDEN)], ["fc1"], name="fc1"))
    nodes.append(helper.make_node("Relu", ["fc1"], ["fc1_relu"], name="fc1_relu"))
    w2 = weight("fc2_w", (HIDDEN, N_CLASSES), HIDDEN)
    nodes.append(helper.make_node("Gemm", ["fc1_relu", w2, bias("fc2_b", N_CLASSES)], ["logits"], name="fc2"))
    nodes.append(helper.make_node("ArgMax", ["logits"], ["label"], name="argmax", axis=1, keepdims=0))
    nodes.append(helper.make_node("Softmax", ["logits"], ["scores"], name="softmax", axis=1))

    graph = helper.make_graph(
        nodes,
        "clipper_bench_cnn",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", *INPUT_SHAPE])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", N_CLASSES]),
        ],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="clipper-bench", ir_version=8
    )
    helper.set_model_props(model, {"recipe": recipe_fingerprint()})
    onnx.checker.check_model(model, full_check=True)
    return bytes(model.SerializeToString())


def _is_current(path: Path) -> bool:
    """Whether ``path`` holds a model made by this recipe."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # a truncated or foreign file: rebuild it
        return False
    return {p.key: p.value for p in model.metadata_props}.get("recipe") == recipe_fingerprint()


def ensure_cnn(out_dir: str | os.PathLike[str] = "build/models", force: bool = False) -> Path:
    """The path of ``<out_dir>/cnn/1/model.onnx``, written only when missing or made by another recipe
    (or with ``force``)."""
    path = Path(out_dir) / model_relpath()
    if force or not path.is_file() or not _is_current(path):
        write_atomic(path, build_cnn())
    return path


def time_per_image(path: str | os.PathLike[str], batch: int = 1, calls: int = 20) -> float:
    """Median seconds an image for batches of ``batch`` random images, on one ONNX Runtime CPU thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((batch, *INPUT_SHAPE)).astype(np.float32)
    session.run(None, {INPUT_NAME: x})
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        session.run(None, {INPUT_NAME: x})
        times.append(time.perf_counter() - started)
    return float(np.median(times)) / batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="build/models", help="models folder (default: build/models)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the model exists")
    parser.add_argument("--time", action="store_true", help="also time it on one ONNX Runtime thread")
    args = parser.parse_args(argv)
    path = ensure_cnn(args.out, force=args.force)
    print(f"cnn model: {path} ({path.stat().st_size} bytes)", flush=True)
    if args.time:
        for batch in (1, 8):
            print(f"batch {batch}: {time_per_image(path, batch) * 1000:.2f} ms an image (one thread)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
