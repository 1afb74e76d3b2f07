"""Canary rollout from live feedback on the local stack (``make run``), as a user drives it: a model deployed, a
second version deployed with ``canary=50``, queries and feedback through the HTTP API. A canary that is always
wrong is rolled back by the feedback worker's reviewer; a canary equal to the current version is promoted. No query
gets a 5xx or is answered without a model. Bounded in queries (a few thousand at most) and time."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from tests.e2e.test_local_stack import make_run, post
from tests.services import free_port

pytestmark = pytest.mark.e2e


def drive(url: str, conn: Any, model: str, app: str, x: np.ndarray, y: np.ndarray, offset: float, budget: int) -> Any:
    """Queries and feedback on distinct inputs until the model's canary is decided (or ``budget`` queries)."""
    for i in range(budget):
        row = (x[i % len(x)] + np.float32(offset + i // len(x))).tolist()  # never a cached answer
        code, body = post(f"{url}/{app}/predict", {"input": row})
        assert code == 200 and not body["default"], body  # every query answered by a model
        conn.update(app, row, int(y[i % len(y)]))
        if i % 50 == 49 and conn.get_canary(model)["canary"] is None:
            break
    deadline = time.monotonic() + 30  # the last feedback reaches the worker, the reviewer looks each second
    while conn.get_canary(model)["canary"] is not None:
        assert time.monotonic() < deadline, conn.get_canary(model)
        time.sleep(0.5)
    return conn.get_canary(model)


def test_a_worse_canary_is_rolled_back_and_an_equal_one_promoted(demo_models, tmp_path):
    holdout = np.load(Path(demo_models["out_dir"]) / demo_models["dataset"]["holdout"])
    x, y = holdout["X"].astype(np.float32), holdout["y"]
    good = LogisticRegression(max_iter=300).fit(x[100:], y[100:])
    wrong = LogisticRegression(max_iter=300).fit(x[100:], (y[100:] + 3) % 10)  # always wrong
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    local = make_run(port, tmp_path / "state")
    try:
        local.wait_ready()
        from clipper.client import ClipperConnection

        conn = ClipperConnection(url, re.search(r"CLIPPER_ADMIN_TOKEN=(\S+)", local.output).group(1))
        conn.register_application("canaried", "floats", "-1", 2_000_000, input_shape=[64])
        conn.deploy_sklearn_model("lr", "1", good, "floats", x[:2])
        conn.link_model_to_app("canaried", "lr")

        conn.deploy_sklearn_model("lr", "2", wrong, "floats", x[:2], canary=50)
        ended = drive(url, conn, "lr", "canaried", x[:100], y[:100], 0.0, 1000)
        assert ended["active_version"] == "1"
        decision = ended["events"][0]
        assert (decision["kind"], decision["who"], decision["rule"]) == ("rollback", "reviewer", "loss-sprt")
        assert decision["evidence"]["canary"]["queries"] > 0  # the frontend counted what users got

        conn.deploy_sklearn_model("lr", "3", good, "floats", x[:2], canary=50)
        ended = drive(url, conn, "lr", "canaried", x[:100], y[:100], 1000.0, 3000)
        assert ended["active_version"] == "3"
        assert (ended["events"][0]["kind"], ended["events"][0]["who"]) == ("promote", "reviewer")
    finally:
        local.ctrl_c()
        local.close()
