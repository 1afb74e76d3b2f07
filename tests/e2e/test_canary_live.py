"""Canary rollout from live feedback on the local stack (``make run``), as a user drives it: a model deployed, a
second version deployed with ``canary=50``, queries and feedback through the HTTP API. The demo models (built from
digits, held-out accuracy in build/models/manifest.json): over the MLP (0.98), the decision tree (0.58) as a canary
is rolled back by the feedback worker's reviewer; then the logistic regression (0.97, as good within the test's
margin) is promoted. No query gets a 5xx or is answered without a model. Bounded in queries (a few thousand at
most) and time."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.test_local_stack import make_run, post
from tests.services import free_port

pytestmark = pytest.mark.e2e


def drive(
    url: str, conn: Any, model: str, app: str, x: np.ndarray, y: np.ndarray, offset: float, budget: int
) -> tuple[Any, dict[str, int]]:
    """Queries and feedback on distinct inputs until the model's canary is decided (or ``budget`` queries); the
    final canary state and how many queries each version answered."""
    answered: dict[str, int] = {}
    for i in range(budget):
        # a pass over the rows again is nudged by 1e-4 (answers unchanged, never a cached one)
        row = (x[i % len(x)] + np.float32(1e-4 * (offset + i // len(x)))).tolist()
        code, body = post(f"{url}/{app}/predict?debug=true", {"input": row})
        assert code == 200 and not body["default"], body  # every query answered by a model
        answered[body["debug"]["version"]] = answered.get(body["debug"]["version"], 0) + 1
        conn.update(app, row, int(y[i % len(y)]))
        if i % 50 == 49 and conn.get_canary(model)["canary"] is None:
            break
    deadline = time.monotonic() + 30  # the last feedback reaches the worker, the reviewer looks each second
    while conn.get_canary(model)["canary"] is not None:
        assert time.monotonic() < deadline, conn.get_canary(model)
        time.sleep(0.5)
    return conn.get_canary(model), answered


def test_a_worse_canary_is_rolled_back_and_an_equal_one_promoted(demo_models, tmp_path):
    models = Path(demo_models["out_dir"])
    holdout = np.load(models / demo_models["dataset"]["holdout"])
    x, y = holdout["X"].astype(np.float32), holdout["y"]  # rows the demo models were not trained on
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    local = make_run(port, tmp_path / "state")
    try:
        local.wait_ready()
        from clipper.client import ClipperConnection

        conn = ClipperConnection(url, re.search(r"CLIPPER_ADMIN_TOKEN=(\S+)", local.output).group(1))
        conn.register_application("canaried", "floats", "-1", 2_000_000, input_shape=[64])
        conn.deploy_onnx_model("digits", "1", models / "mlp" / "1" / "model.onnx", x[:2])
        conn.link_model_to_app("canaried", "digits")

        # 200 labels each before the loss test speaks: the decision comes seconds after the trial's first query,
        # past the frontend's tally flush (each second), on however fast a machine
        tree = models / "tree" / "1" / "model.onnx"
        conn.deploy_onnx_model("digits", "2", tree, x[:2], canary=50, canary_params={"min_feedback": 200})
        ended, answered = drive(url, conn, "digits", "canaried", x, y, 0.0, 1500)
        assert ended["active_version"] == "1"
        assert answered.get("2", 0) > 20 and answered.get("1", 0) > 20, answered  # both served their share
        decision = ended["events"][0]
        assert (decision["kind"], decision["who"], decision["rule"]) == ("rollback", "reviewer", "loss-sprt")
        assert decision["evidence"]["canary"]["queries"] > 0  # the frontend counted what users got

        conn.deploy_onnx_model("digits", "3", models / "logreg" / "1" / "model.onnx", x[:2], canary=50)
        ended, answered = drive(url, conn, "digits", "canaried", x, y, 10.0, 3000)
        assert ended["active_version"] == "3"
        assert answered.get("3", 0) > 20, answered
        assert (ended["events"][0]["kind"], ended["events"][0]["who"]) == ("promote", "reviewer")
    finally:
        local.ctrl_c()
        local.close()
