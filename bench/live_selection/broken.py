"""The broken version of the best model: the same trained ONNX graph with its label mapped through a fixed
derangement of the ten classes (class ``c`` answers ``(c + SHIFT) % 10``), so wherever the model was right it
is now wrong. Its first output (the one the endpoint serves) is the permuted label; the probabilities are
dropped. Built with onnx from the demo model's own file, so nothing is retrained."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SHIFT = 3
CLASSES = 10


def permutation() -> np.ndarray:
    return (np.arange(CLASSES) + SHIFT) % CLASSES


def broken_model(source: Path, target: Path) -> Path:
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    label = graph.output[0]
    if label.type.tensor_type.elem_type != onnx.TensorProto.INT64:
        raise ValueError(f"{source}: its first output {label.name!r} is not an int64 label")
    inner = f"{label.name}_before_permutation"
    for node in graph.node:
        node.output[:] = [inner if o == label.name else o for o in node.output]
    table = numpy_helper.from_array(permutation().astype(np.int64), name="clipper_bench_permutation")
    graph.initializer.append(table)
    graph.node.append(helper.make_node("Gather", [table.name, inner], [label.name], name="permute_label", axis=0))
    del graph.output[1:]
    onnx.checker.check_model(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(target))
    return target
