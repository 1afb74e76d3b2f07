"""Validation of uploaded ONNX models (clipper.models.validation): the demo models, hand-made graphs, garbage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from clipper.core.domain import InputType
from clipper.models.validation import ValidationResult, validate_model
from tests.fakes import digits_app

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def mlp_bytes(demo_models: dict[str, Any]) -> bytes:
    entry = next(m for m in demo_models["models"] if m["name"] == "mlp")
    data: bytes = (Path(demo_models["out_dir"]) / entry["path"]).read_bytes()
    return data


def _bytes(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data


def identity(elem_type: int, shape: list[Any]) -> bytes:
    """input ``x`` of ``elem_type`` and ``shape`` -> output ``y`` = x."""
    return _bytes(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "identity",
            [helper.make_tensor_value_info("x", elem_type, shape)],
            [helper.make_tensor_value_info("y", elem_type, shape)],
        )
    )


def collapsing() -> bytes:
    """float [N, 64] -> the column sums, [1, 64]: one output row whatever the number of input rows."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    return _bytes(
        helper.make_graph(
            [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
            "collapsing",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
            initializer=[axes],
        )
    )


def two_inputs() -> bytes:
    return _bytes(
        helper.make_graph(
            [helper.make_node("Add", ["a", "b"], ["y"])],
            "two_inputs",
            [
                helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 64]),
                helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 64]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
        )
    )


def _only_reason(result: ValidationResult) -> str:
    assert not result.ok
    assert len(result.reasons) == 1, result.reasons
    return result.reasons[0]


# --- models that pass ------------------------------------------------------------------------------------


def test_a_demo_model_passes_and_reports_its_signature(mlp_bytes: bytes) -> None:
    result = validate_model(mlp_bytes, [digits_app()])

    assert result.ok and result.reasons == ()
    sig = result.signature
    assert sig is not None
    assert sig.to_dict() == {
        "input": {"name": "input", "element_type": "float32", "shape": [None, 64]},
        "outputs": [
            {"name": "label", "element_type": "int64", "shape": [None]},
            {"name": "probabilities", "element_type": "float32", "shape": [None, 10]},
        ],
    }
    assert sig.fixed_row_shape == (64,)
    assert sig.input_type() is InputType.FLOATS


def test_a_model_linked_to_no_application_only_needs_to_load_and_answer_one_row_per_row(mlp_bytes: bytes) -> None:
    assert validate_model(mlp_bytes).ok


@pytest.mark.parametrize(
    ("input_type", "elem_type"),
    [
        (InputType.INTEGERS, TensorProto.INT32),
        (InputType.INTEGERS, TensorProto.INT64),
        (InputType.FLOATS, TensorProto.FLOAT),
        (InputType.DOUBLES, TensorProto.DOUBLE),
        (InputType.BYTES, TensorProto.STRING),
        (InputType.STRINGS, TensorProto.STRING),
    ],
)
def test_each_input_type_accepts_its_tensor_types(input_type: InputType, elem_type: int) -> None:
    result = validate_model(identity(elem_type, ["N", 64]), [digits_app(input_type=input_type)])

    assert result.ok, result.reasons
    assert result.signature is not None and result.signature.input_type([input_type]) is input_type


def test_a_new_models_input_type_is_the_first_that_takes_it_and_bytes_are_not_a_uint8_tensor() -> None:
    """Found by a new user: an int64 model (what the deployers make of a scikit-learn model for an integers
    application) linked to no application yet was rejected ("no input type suits"); a uint8 model was accepted for
    a bytes application whose every query then defaulted (a row's bytes reach the endpoint as one value)."""
    result = validate_model(identity(TensorProto.INT64, ["N", 64]))
    assert result.signature is not None and result.signature.input_type() is InputType.INTEGERS
    refused = validate_model(
        identity(TensorProto.UINT8, ["N", 4]), [digits_app(input_type=InputType.BYTES, input_shape=None)]
    )
    assert not refused.ok and any("bytes" in r for r in refused.reasons), refused.reasons


def test_free_row_dimensions_fit_any_application_shape_and_the_sample_takes_the_apps_sizes() -> None:
    result = validate_model(identity(TensorProto.FLOAT, ["N", "W"]), [digits_app(input_shape=(64,))])

    assert result.ok, result.reasons
    assert result.signature is not None and result.signature.fixed_row_shape is None


# --- models that fail, with a reason naming the application -------------------------------------------------


def test_an_input_width_other_than_the_applications_shape_fails_naming_the_app() -> None:
    reason = _only_reason(validate_model(identity(TensorProto.FLOAT, ["N", 32]), [digits_app()]))

    assert "application 'digits'" in reason
    assert "[64]" in reason and "[32]" in reason


def test_a_rank_other_than_the_applications_shape_fails(mlp_bytes: bytes) -> None:
    reason = _only_reason(validate_model(mlp_bytes, [digits_app(name="images", input_shape=(8, 8))]))

    assert "application 'images'" in reason and "[8, 8]" in reason


def test_a_dtype_that_does_not_match_the_input_type_fails_naming_the_app(mlp_bytes: bytes) -> None:
    reason = _only_reason(validate_model(mlp_bytes, [digits_app(name="precise", input_type=InputType.DOUBLES)]))

    assert "application 'precise'" in reason
    assert "doubles" in reason and "float32" in reason


def test_every_mismatched_application_gets_its_own_reason() -> None:
    result = validate_model(
        identity(TensorProto.DOUBLE, ["N", 32]),
        [digits_app(name="a"), digits_app(name="b", input_type=InputType.DOUBLES)],
    )

    assert not result.ok
    assert sum("application 'a'" in r for r in result.reasons) == 2  # its type and its shape
    assert sum("application 'b'" in r for r in result.reasons) == 1  # its shape only


# --- models the endpoint could not serve ---------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"not an onnx model at all", b"", bytes(range(256)) * 4])
def test_garbage_bytes_fail_with_a_reason_and_no_signature(data: bytes) -> None:
    result = validate_model(data, [digits_app()])

    assert "not a loadable ONNX model" in _only_reason(result)
    assert result.signature is None


def test_a_model_answering_fewer_rows_than_it_was_given_fails() -> None:
    reason = _only_reason(validate_model(collapsing(), [digits_app()]))

    assert "1 rows" in reason and "one row per input row" in reason


def test_a_fixed_batch_dimension_fails() -> None:
    reason = _only_reason(validate_model(identity(TensorProto.FLOAT, [1, 64]), [digits_app()]))

    assert "fixed batch dimension [1, 64]" in reason


def test_a_model_with_two_inputs_fails() -> None:
    reason = _only_reason(validate_model(two_inputs(), [digits_app()]))

    assert "2 inputs" in reason


def test_an_input_the_endpoint_cannot_feed_fails() -> None:
    sequence_length = _bytes(
        helper.make_graph(
            [helper.make_node("SequenceLength", ["x"], ["n"])],
            "sequence_input",
            [helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, ["N", 64])],
            [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        )
    )
    result = validate_model(sequence_length)

    assert not result.ok
    assert any("seq(tensor(float))" in r and "cannot feed" in r for r in result.reasons)
