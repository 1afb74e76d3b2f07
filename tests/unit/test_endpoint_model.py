"""The model endpoint's session wrapper (clipper_endpoint.model) and its .npy codec, in process."""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from clipper_endpoint import npy
from clipper_endpoint.model import (
    CPU,
    CUDA,
    InputError,
    ModelLoadError,
    OnnxModel,
    PredictionError,
    default_providers,
    gpu_present,
    resolve_model_file,
)

pytestmark = pytest.mark.unit


# --- fixtures: the demo digits models, and tiny hand-made graphs for the cases they lack --------------------


@pytest.fixture(scope="module")
def models_dir(demo_models: dict[str, Any]) -> Path:
    return Path(demo_models["out_dir"])


@pytest.fixture(scope="module")
def holdout(demo_models: dict[str, Any], models_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    data = np.load(models_dir / demo_models["dataset"]["holdout"])
    return data["X"], data["y"]


@pytest.fixture(scope="module")
def mlp(models_dir: Path) -> OnnxModel:
    return OnnxModel.load(models_dir / "mlp" / "1")


def _save(path: Path, graph: onnx.GraphProto) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path / "model.onnx"))
    return path


def identity_model(path: Path, elem_type: int, shape: list[Any]) -> Path:
    """input ``x`` of ``elem_type`` and ``shape`` -> output ``y`` = x."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", elem_type, shape)],
        [helper.make_tensor_value_info("y", elem_type, shape)],
    )
    return _save(path, graph)


def collapsing_model(path: Path) -> Path:
    """float [N, 4] -> the column sums, [1, 4]: one output row whatever the number of input rows."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
        "collapsing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[axes],
    )
    return _save(path, graph)


def two_input_model(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        "two_inputs",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 2]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
    )
    return _save(path, graph)


# --- loading -------------------------------------------------------------------------------------------------


def test_loads_a_folder_or_a_file_and_describes_the_signature(models_dir: Path, mlp: OnnxModel) -> None:
    from_file = OnnxModel.load(models_dir / "mlp" / "1" / "model.onnx", warmup=False)
    for model in (mlp, from_file):
        assert model.path == models_dir / "mlp" / "1" / "model.onnx"
        assert model.input_name == "input"
        assert model.dtype == np.float32
        assert model.input_shape == (None, 64)
        assert model.output_names == ["label", "probabilities"]
        assert model.output_name == "label"
        assert model.providers == [CPU]
    meta = mlp.describe()
    assert meta["input"] == {"name": "input", "dtype": "float32", "shape": [None, 64]}
    assert meta["output_names"] == ["label", "probabilities"]
    assert meta["outputs"][1] == {"name": "probabilities", "type": "tensor(float)", "shape": [None, 10]}
    assert meta["providers"] == [CPU]
    assert meta["model_path"].endswith("model.onnx")


def test_a_folder_with_one_other_onnx_file_is_accepted(tmp_path: Path) -> None:
    identity_model(tmp_path / "m", TensorProto.FLOAT, ["N", 2])
    (tmp_path / "m" / "model.onnx").rename(tmp_path / "m" / "classifier.onnx")
    assert resolve_model_file(tmp_path / "m") == tmp_path / "m" / "classifier.onnx"


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "missing"


def _empty_folder(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _junk_file(tmp_path: Path) -> Path:
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    return tmp_path / "junk.onnx"


@pytest.mark.parametrize(
    ("make_path", "message"),
    [
        (_missing, "does not exist"),
        (_empty_folder, "no model.onnx in folder"),
        (_junk_file, "cannot load model"),
        (two_input_model, "has 2 inputs"),
    ],
)
def test_unusable_models_fail_to_load_with_a_clear_error(tmp_path: Path, make_path: Any, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        OnnxModel.load(make_path(tmp_path))


def test_an_unknown_output_name_or_provider_fails_to_load(models_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"no output 'score'.*\['label', 'probabilities'\]"):
        OnnxModel.load(models_dir / "tree" / "1", output_name="score")
    with pytest.raises(ModelLoadError, match="NoSuchExecutionProvider"):
        OnnxModel.load(models_dir / "tree" / "1", providers=["NoSuchExecutionProvider"])


def test_cuda_comes_first_when_onnxruntime_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_providers() == ([CUDA, CPU] if CUDA in ort.get_available_providers() else [CPU])
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["AzureExecutionProvider", CUDA, CPU])
    assert default_providers() == [CUDA, CPU]
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CPU])
    assert default_providers() == [CPU]


# --- predicting ----------------------------------------------------------------------------------------------


def test_predictions_match_onnxruntime_and_the_recorded_accuracy(
    demo_models: dict[str, Any], models_dir: Path, holdout: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = holdout
    for entry in demo_models["models"]:
        model = OnnxModel.load(models_dir / entry["path"])
        labels = model.predict(x)
        assert labels.shape == (len(x),)
        assert labels.dtype == np.int64
        direct = ort.InferenceSession(str(models_dir / entry["path"]), providers=[CPU]).run(["label"], {"input": x})
        np.testing.assert_array_equal(labels, direct[0])
        assert float(np.mean(labels == y)) == pytest.approx(entry["accuracy"], abs=1e-6)


@pytest.mark.parametrize("rows", [1, 2, 7, 64, 540])
def test_one_output_row_per_input_row(mlp: OnnxModel, holdout: tuple[np.ndarray, np.ndarray], rows: int) -> None:
    x, _ = holdout
    labels = mlp.predict(x[:rows])
    assert labels.shape == (rows,)
    np.testing.assert_array_equal(labels, mlp.predict(x)[:rows])


def test_a_chosen_output_is_served(models_dir: Path, holdout: tuple[np.ndarray, np.ndarray]) -> None:
    x, _ = holdout
    model = OnnxModel.load(models_dir / "logreg" / "1", output_name="probabilities")
    proba = model.predict(x[:5])
    assert proba.shape == (5, 10)
    assert proba.dtype == np.float32
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32, np.uint8, np.float16])
def test_numeric_input_is_cast_to_the_model_dtype(
    mlp: OnnxModel, holdout: tuple[np.ndarray, np.ndarray], dtype: type
) -> None:
    x, _ = holdout  # the digits are whole numbers 0..16, exact in every one of these dtypes
    prepared = mlp.prepare(x[:20].astype(dtype))
    assert prepared.dtype == np.float32
    assert prepared.flags.c_contiguous
    np.testing.assert_array_equal(mlp.predict(x[:20].astype(dtype)), mlp.predict(x[:20]))


def test_fortran_ordered_and_big_endian_input_is_accepted(mlp: OnnxModel, holdout: tuple[np.ndarray, Any]) -> None:
    x, _ = holdout
    expected = mlp.predict(x[:10])
    np.testing.assert_array_equal(mlp.predict(np.asfortranarray(x[:10])), expected)
    np.testing.assert_array_equal(mlp.predict(x[:10].astype(">f4")), expected)


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (np.zeros((3, 63), np.float32), r"expected shape \[N, 64\] float32, got shape \[3, 63\] float32"),
        (np.zeros(64, np.float32), r"expected shape \[N, 64\] float32, got shape \[64\] float32"),
        (np.zeros((2, 8, 8), np.float32), r"expected shape \[N, 64\] float32, got shape \[2, 8, 8\]"),
        (np.zeros((0, 64), np.float32), r"expected shape \[N, 64\] float32 with at least one row, got none"),
        (np.full((2, 64), "1"), r"expected shape \[N, 64\] float32, got string values"),
        (np.zeros((2, 64), np.complex64), r"expected shape \[N, 64\] float32, got complex64 values"),
        (np.array([[1, "a"]], dtype=object), r"expected shape \[N, 64\] float32, got shape \[1, 2\]"),
    ],
)
def test_a_batch_that_does_not_fit_is_refused(mlp: OnnxModel, batch: np.ndarray, message: str) -> None:
    with pytest.raises(InputError, match=message):
        mlp.predict(batch)


def test_an_integer_model_refuses_floats_and_takes_narrower_integers(tmp_path: Path) -> None:
    model = OnnxModel.load(identity_model(tmp_path / "ints", TensorProto.INT64, ["batch", 3]))
    assert model.input_shape == (None, 3)
    out = model.predict(np.array([[1, 2, 3]], dtype=np.int32))
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [[1, 2, 3]])
    np.testing.assert_array_equal(model.predict(np.array([[True, False, True]])), [[1, 0, 1]])
    with pytest.raises(InputError, match=r"expected shape \[N, 3\] int64, got float64 values"):
        model.predict(np.array([[1.0, 2.0, 3.0]]))


def test_a_cast_that_makes_a_finite_value_infinite_is_refused(tmp_path: Path) -> None:
    """float64 to float32 (1e300), and integers to float16 (70000, past its 65504): not a safe cast, a 400; what
    fits is cast, and NaN or infinity as sent reach the model."""
    half = OnnxModel.load(identity_model(tmp_path / "half", TensorProto.FLOAT16, ["batch", 2]))
    with pytest.raises(InputError, match=r"got a value out of float16's range \(\+-6\.55e\+04\)"):
        half.predict(np.array([[70000, 1]], dtype=np.int64))
    np.testing.assert_array_equal(half.predict(np.array([[60000, 1]], dtype=np.int64)), [[60000, 1]])
    single = OnnxModel.load(identity_model(tmp_path / "single", TensorProto.FLOAT, ["batch", 2]))
    with pytest.raises(InputError, match=r"got a value out of float32's range"):
        single.predict(np.array([[1e300, 0.0]]))
    out = single.predict(np.array([[np.nan, np.inf]]))
    assert np.isnan(out[0, 0]) and np.isinf(out[0, 1])


def test_a_string_model_takes_object_or_unicode_arrays(tmp_path: Path) -> None:
    model = OnnxModel.load(identity_model(tmp_path / "text", TensorProto.STRING, [None, 1]))
    assert model.dtype == object
    assert model.describe()["input"] == {"name": "x", "dtype": "string", "shape": [None, 1]}
    out = model.predict(np.array(["good", "bad", "ünïcode"]))  # bare values: one a row
    assert out.shape == (3, 1)
    assert out[:, 0].tolist() == ["good", "bad", "ünïcode"]
    assert model.predict(np.array([["x"], ["y"]], dtype=object))[:, 0].tolist() == ["x", "y"]
    assert model.predict(np.array([[b"raw"]]))[0, 0] == "raw"
    with pytest.raises(InputError, match=r"expected shape \[N, 1\] string, got int64 values"):
        model.predict(np.array([[1], [2]]))
    with pytest.raises(InputError, match="not all strings"):
        model.predict(np.array([["a"], [3]], dtype=object))


def test_a_model_that_breaks_one_row_out_per_row_in_fails_the_batch(tmp_path: Path) -> None:
    model = OnnxModel.load(collapsing_model(tmp_path / "collapsing"))
    assert model.predict(np.ones((1, 4), np.float32)).shape == (1, 4)  # one row in, one row out: fine
    with pytest.raises(PredictionError, match=r"returned 1 rows of output 'y' for 3 input rows"):
        model.predict(np.ones((3, 4), np.float32))


def test_a_failing_session_is_a_prediction_error(mlp: OnnxModel) -> None:
    with pytest.raises(PredictionError, match=r"model failed on a batch of shape \[2, 64\]"):
        mlp.run(np.zeros((2, 64), np.float64))  # skips prepare(): ONNX Runtime rejects the dtype


# --- the .npy codec ------------------------------------------------------------------------------------------


def _np_save(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize(
    "array",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.arange(5, dtype=np.int64),
        np.zeros((0, 64), np.float32),
        np.zeros((1, 3, 4, 4), np.float16),
        np.array([True, False]),
        np.array(["a", "bcd"]),
        np.array(2.5),
    ],
)
def test_npy_encode_writes_what_numpy_writes_and_decode_reads_it_back(array: np.ndarray) -> None:
    assert npy.encode(array) == _np_save(array)
    decoded = npy.decode(npy.encode(array))
    assert decoded.dtype == array.dtype
    assert decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


def test_npy_decode_reads_fortran_order_big_endian_and_other_header_versions() -> None:
    array = np.arange(12, dtype=">f8").reshape(3, 4)
    np.testing.assert_array_equal(npy.decode(_np_save(np.asfortranarray(array))), array)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=(2, 0))
    np.testing.assert_array_equal(npy.decode(buf.getvalue()), array)


def test_npy_encode_writes_string_objects_as_unicode_and_refuses_other_objects() -> None:
    decoded = npy.decode(npy.encode(np.array(["x", "yz"], dtype=object)))
    assert decoded.dtype == np.dtype("<U2")
    assert decoded.tolist() == ["x", "yz"]
    with pytest.raises(TypeError, match="without pickle"):
        npy.encode(np.array([{"a": 1}], dtype=object))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", r"not a \.npy array"),
        (b'{"instances": []}', r"not a \.npy array"),
        (_np_save(np.zeros((4, 64), np.float32))[:-10], r"holds 1014 data bytes, its header says shape \[4, 64\]"),
        (_np_save(np.zeros(3)) + b"extra", "holds 29 data bytes"),
        (b"\x93NUMPY\x09\x00" + b"\x00" * 8, r"unsupported \.npy format version 9"),
        (b"\x93NUMPY\x01\x00\x10\x00{'descr': 'zz9'}", r"not a valid \.npy array"),
    ],
)
def test_npy_decode_refuses_malformed_bodies(body: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        npy.decode(body)


def test_npy_decode_refuses_object_arrays_and_archives() -> None:
    header = b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    header += b" " * (64 - 10 - len(header) - 1) + b"\n"
    body = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\x00" * 8
    with pytest.raises(InputError, match="object arrays are not accepted"):
        npy.decode(body)
    buf = io.BytesIO()
    np.savez(buf, x=np.zeros(2))
    with pytest.raises(InputError, match=r"not a \.npy array"):
        npy.decode(buf.getvalue())


# --- the validated file, and only it ------------------------------------------------------------------------


def test_a_file_with_another_sha256_than_the_validated_one_is_refused(models_dir: Path, tmp_path: Path) -> None:
    """The model updater validated one file; a later PUT to its key (the same presigned URL) must not be served."""
    validated = (models_dir / "mlp" / "1" / "model.onnx").read_bytes()
    digest = hashlib.sha256(validated).hexdigest()
    folder = tmp_path / "mlp" / "2"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(validated)
    assert OnnxModel.load(folder, sha256=digest, warmup=False).input_shape == (None, 64)

    (folder / "model.onnx").write_bytes((models_dir / "logreg" / "1" / "model.onnx").read_bytes())  # replaced
    with pytest.raises(ModelLoadError, match=rf"not the validated {digest}: it was replaced after validation"):
        OnnxModel.load(folder, sha256=digest, warmup=False)
    assert OnnxModel.load(folder, warmup=False).path == folder / "model.onnx"  # no digest given: not checked


def test_the_server_exits_2_before_listening_when_the_file_is_not_the_validated_one(
    models_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from clipper_endpoint.__main__ import main

    monkeypatch.setenv("CLIPPER_MODEL_SHA256", "0" * 64)  # as the model stack's container environment sets it
    assert main(["--model-path", str(models_dir / "mlp" / "1"), "--port", "1"]) == 2
    assert "not the validated " + "0" * 64 in caplog.text


# --- a GPU endpoint serves from the GPU, or not at all -------------------------------------------------------


def test_a_gpu_is_seen_by_its_device_files(tmp_path: Path) -> None:
    assert not gpu_present(tmp_path)
    (tmp_path / "nvidiactl").touch()  # the driver's control device alone: no GPU given to this container
    assert not gpu_present(tmp_path)
    (tmp_path / "nvidia0").touch()
    assert gpu_present(tmp_path)


def test_a_session_off_the_gpu_is_refused_when_cuda_is_required(
    models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ONNX Runtime falls back to the CPU, with a warning, when its CUDA provider cannot start: required, that is
    a load error naming why, not a GPU endpoint quietly serving from its CPU."""
    folder = models_dir / "mlp" / "1"
    assert OnnxModel.load(folder, warmup=False).providers == [CPU]  # not required: served from the CPU
    if CUDA not in ort.get_available_providers():
        with pytest.raises(ModelLoadError, match=r"not on the GPU: this ONNX Runtime build has no CUDA"):
            OnnxModel.load(folder, warmup=False, require_cuda=True)
        # a GPU build whose CUDA libraries do not load: the session is made, on the CPU alone
        real = ort.get_available_providers()
        monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, *real])
        with (
            pytest.warns(UserWarning, match="CUDAExecutionProvider"),
            pytest.raises(
                ModelLoadError, match=r"would run on \['CPUExecutionProvider'\], not on the GPU: .*could not start"
            ),
        ):
            OnnxModel.load(folder, warmup=False, require_cuda=True)
    with pytest.raises(ModelLoadError, match=r"leave out CUDAExecutionProvider"):
        OnnxModel.load(folder, warmup=False, providers=[CPU], require_cuda=True)


@pytest.mark.parametrize(
    ("setting", "providers", "gpu", "cuda_build", "required"),
    [
        ("auto", None, True, True, True),
        ("auto", None, False, True, False),
        ("auto", None, True, False, False),  # a checkout's CPU build of ONNX Runtime on a machine with a GPU
        ("auto", [CUDA, CPU], True, True, True),
        ("auto", [CPU], True, True, False),  # a deliberate CPU run on a GPU machine
        ("yes", [CPU], False, False, True),
        ("no", None, True, True, False),
    ],
)
def test_cuda_is_required_where_a_gpu_is_present_unless_told(
    setting: str, providers: list[str] | None, gpu: bool, cuda_build: bool, required: bool
) -> None:
    from clipper_endpoint.__main__ import requires_cuda

    assert requires_cuda(setting, providers, gpu, cuda_build) is required


def test_the_options_sagemaker_cannot_pass_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """SageMaker runs ``serve`` with no arguments: the container's environment (the model stack's) sets them."""
    from clipper_endpoint.__main__ import parse_args

    args = parse_args([])
    assert (args.threads, args.providers, args.inference, args.require_cuda) == (1, "", "auto", "auto")
    monkeypatch.setenv("CLIPPER_THREADS", "4")
    monkeypatch.setenv("CLIPPER_PROVIDERS", CPU)
    monkeypatch.setenv("CLIPPER_INFERENCE", "Thread")
    monkeypatch.setenv("CLIPPER_REQUIRE_CUDA", "no")
    args = parse_args([])
    assert (args.threads, args.providers, args.inference, args.require_cuda) == (4, CPU, "thread", "no")
    assert (parse_args([]).output_name, parse_args([]).max_body_bytes) == (None, 64 * 1024 * 1024)
    monkeypatch.setenv("CLIPPER_OUTPUT_NAME", "probabilities")
    monkeypatch.setenv("CLIPPER_MAX_BODY_BYTES", "1048576")
    assert (parse_args([]).output_name, parse_args([]).max_body_bytes) == ("probabilities", 1048576)
    assert parse_args([]).unhealthy_after_s == 60.0
    monkeypatch.setenv("CLIPPER_UNHEALTHY_AFTER_S", "0")
    assert parse_args([]).unhealthy_after_s == 0.0
    assert parse_args(["--threads", "2", "--inference", "inline"]).threads == 2  # an argument wins


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("CLIPPER_THREADS", "0", r"--threads \(from \$CLIPPER_THREADS\) must be a whole number of at least 1"),
        ("CLIPPER_THREADS", "two", r"--threads \(from \$CLIPPER_THREADS\) must be a whole number"),
        ("CLIPPER_INFERENCE", "gpu", r"--inference \(from \$CLIPPER_INFERENCE\) must be one of auto, inline, thread"),
        ("CLIPPER_REQUIRE_CUDA", "maybe", r"--require-cuda \(from \$CLIPPER_REQUIRE_CUDA\) must be one of auto"),
        (
            "CLIPPER_UNHEALTHY_AFTER_S",
            "-5",
            r"--unhealthy-after-s \(from \$CLIPPER_UNHEALTHY_AFTER_S\) must be a number",
        ),
        ("CLIPPER_MAX_BODY_BYTES", "64M", r"--max-body-bytes \(from \$CLIPPER_MAX_BODY_BYTES\) must be a whole number"),
        ("CLIPPER_UNHEALTHY_AFTER_S", "soon", r"--unhealthy-after-s \(from \$CLIPPER_UNHEALTHY_AFTER_S\) must be a"),
    ],
)
def test_a_bad_setting_exits_2_naming_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, value: str, message: str
) -> None:
    from clipper_endpoint.__main__ import parse_args

    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exited:
        parse_args([])
    assert exited.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_the_server_exits_2_before_listening_when_cuda_is_required_and_unused(
    models_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import uvicorn

    import clipper_endpoint.model as model_module
    from clipper_endpoint.__main__ import main

    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)  # a model that loads is not served here
    monkeypatch.setattr(model_module, "gpu_present", lambda devices="/dev": True)  # as on a GPU instance
    real = ort.get_available_providers()
    # the GPU build of ONNX Runtime (its CUDA libraries, here absent, fail to load: the session is on the CPU)
    monkeypatch.setattr(ort, "get_available_providers", lambda: real if CUDA in real else [CUDA, *real])
    with pytest.warns(UserWarning, match=CUDA):  # ONNX Runtime's own, as the session falls back to the CPU
        assert main(["--model-path", str(models_dir / "mlp" / "1"), "--port", "1"]) == 2
    assert "not on the GPU" in caplog.text


def test_an_empty_variable_is_unset_and_a_bad_argument_is_named_as_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stack parameter left empty reaches the container as an empty variable: the default, not an exit 2."""
    from clipper_endpoint.__main__ import parse_args

    for variable in ("CLIPPER_THREADS", "CLIPPER_INFERENCE", "CLIPPER_REQUIRE_CUDA", "CLIPPER_UNHEALTHY_AFTER_S"):
        monkeypatch.setenv(variable, "")
    args = parse_args([])
    assert (args.threads, args.inference, args.require_cuda, args.unhealthy_after_s) == (1, "auto", "auto", 60.0)
    monkeypatch.setenv("CLIPPER_THREADS", "4")
    for argv in (["--threads=0"], ["--threads", "²"]):  # the option's own value; a digit int() cannot read
        with pytest.raises(SystemExit) as exited:
            parse_args(argv)
        assert exited.value.code == 2
        assert "error: --threads must be a whole number" in capsys.readouterr().err


def test_a_gpu_hidden_by_cuda_visible_devices_is_not_there(tmp_path: Path) -> None:
    (tmp_path / "nvidia0").touch()
    assert gpu_present(tmp_path, visible="0") and gpu_present(tmp_path, visible="GPU-1a2b")
    assert not any(gpu_present(tmp_path, visible=v) for v in ("", "-1", "none"))
