"""What the deployers do before they upload: convert a scikit-learn model, check a model on a sample input, and
say what to install when torch is missing. (The whole deployment, upload and registration included, runs
against the local stack in tests/e2e/test_model_lifecycle.py.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression, Ridge

from clipper.client import ClipperConnection
from clipper.models.convert import DeployError, as_sample, check_on_sample, sklearn_to_onnx
from clipper.models.validation import validate_model
from tests.fakes import digits_app

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    return x.astype(np.float32), y


def test_a_scikit_learn_classifier_converts_to_what_the_updater_accepts(digits):
    x, y = digits
    model = LogisticRegression(max_iter=500).fit(x[:500], y[:500])
    data = sklearn_to_onnx(model, as_sample(x[:3], "floats"), "digits")
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    labels = session.run(None, {"input": x[500:600]})[0]
    assert (labels == model.predict(x[500:600])).all()
    assert validate_model(data, [digits_app()]).ok
    check = check_on_sample(data, as_sample(x[0], "floats"))  # one row is a batch of one
    assert check.rows == 1 and check.outputs == [int(model.predict(x[:1])[0])]


def test_a_regressor_converts_too_and_doubles_stay_doubles(digits):
    x, y = digits
    model = Ridge().fit(x[:200].astype(np.float64), y[:200])
    data = sklearn_to_onnx(model, as_sample(x[:2], "doubles"), "ridge")
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(double)"
    # one number a row, not a list of one (skl2onnx answers [N, 1]: found by a new user, whose regressors' outputs
    # were lists, combined by vote, and whose number labels were all skipped as of another kind)
    out = session.run(None, {"input": x[200:205].astype(np.float64)})[0]
    assert out.shape == (5,) and np.allclose(out, model.predict(x[200:205].astype(np.float64)))
    assert len(session.get_outputs()[0].shape) == 1
    assert check_on_sample(data, as_sample(x[0].astype(np.float64), "doubles")).outputs == [
        pytest.approx(float(model.predict(x[:1].astype(np.float64))[0]))
    ]
    from sklearn.linear_model import LinearRegression

    two = LinearRegression().fit(x[:200].astype(np.float64), np.stack([y[:200], -y[:200]], axis=1))
    pairs = ort.InferenceSession(
        sklearn_to_onnx(two, as_sample(x[:2], "doubles"), "two"), providers=["CPUExecutionProvider"]
    )
    assert pairs.run(None, {"input": x[:3].astype(np.float64)})[0].shape == (3, 2)  # two targets: rows of two


def test_scikit_learn_models_convert_for_an_integers_application(digits):
    """skl2onnx refuses int32 inputs for most estimators ("wrong type"): an integers application's models could
    not be deployed at all. They convert with int64 inputs, which the updater takes for integers."""
    from sklearn.tree import DecisionTreeClassifier

    from clipper.core.domain import InputType

    x, y = digits
    xi = x.astype(np.int32)  # digits' pixels are whole numbers 0-16
    app = digits_app(input_type=InputType.INTEGERS)
    for model in (LogisticRegression(max_iter=500), DecisionTreeClassifier(random_state=0)):
        model.fit(xi[:500], y[:500])
        data = sklearn_to_onnx(model, as_sample(xi[:3], "integers"), "digits")
        assert validate_model(data, [app]).ok
        check = check_on_sample(data, as_sample(xi[0], "integers"))
        assert check.outputs == [int(model.predict(xi[:1])[0])]


def test_a_model_that_fails_its_sample_is_not_uploaded(digits, demo_models):
    mlp = (Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx").read_bytes()
    assert check_on_sample(mlp, None).rows == 2  # zeros of its fixed row shape
    with pytest.raises(DeployError, match="fails on the sample input"):
        check_on_sample(mlp, np.zeros((2, 10), dtype=np.float32))
    with pytest.raises(DeployError, match="does not load"):
        check_on_sample(b"not onnx", None)
    with pytest.raises(DeployError, match="numeric models only"):
        as_sample(["a"], "strings")


def test_a_model_that_cannot_be_converted_says_why(digits):
    x, _ = digits
    with pytest.raises(DeployError, match="not convertible"):
        sklearn_to_onnx(object(), as_sample(x[:2], "floats"), "nothing")


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_deploy_pytorch_model_without_torch_says_to_install_it(digits):
    x, _ = digits
    conn = ClipperConnection("http://127.0.0.1:9", token="unused")  # nothing is called: it fails first
    with pytest.raises(DeployError, match="pip install torch"):
        conn.deploy_pytorch_model("net", "1", object(), "floats", x[:2])
