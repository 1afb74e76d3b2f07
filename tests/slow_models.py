"""ONNX models whose sample run takes as long as a test wants, built with the onnx package: input ``x`` float
[N, 64] -> output ``y`` float [N, 64], so they pass every check of validation but the time its run takes."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

ENDLESS = 10**15  # trips of the loop: at ~0.5 us a trip, years


def looping_model(trips: int = ENDLESS) -> bytes:
    """``y = x + trips``, one addition a trip of a Loop node: ``trips`` of 10**5 take ~0.1 s, the default never ends
    (and ONNX Runtime's ``run`` cannot be stopped from another thread)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]), helper.make_node("Add", ["v", "one"], ["v_out"])],
        "trip",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, ["N", 64]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["N", 64]),
        ],
        initializer=[helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body)],
        "looping",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
        initializer=[
            helper.make_tensor("trips", TensorProto.INT64, [], [trips]),
            helper.make_tensor("go", TensorProto.BOOL, [], [True]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data
