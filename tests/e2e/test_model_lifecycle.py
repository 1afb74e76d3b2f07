"""The model lifecycle on the local stack, as a user runs it: register an application, deploy a model with the
Python client's deployer, query it, roll forward by uploading a new file (the S3 -> model updater dispatch
registers and auto-promotes it), query (answers come from the new version), roll back with the CLI, query
again; a bad file is rejected with its reason; replicas start and stop processes; a killed replica's model server
is started again on its port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier

from clipper.client import AdminError, ClipperConnection
from clipper.models.convert import DeployError, as_sample, sklearn_to_onnx
from tests.services import LocalStackProcess, free_port

pytestmark = pytest.mark.e2e

TOKEN = "lifecycle-token"
APP, MODEL = "lifecycle", "digits-lr"


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("local-stack")


@pytest.fixture(scope="module")
def stack(demo_models, state_dir) -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "infra/local/run.py", "--port", str(port), "--models", demo_models["out_dir"]]
    local = LocalStackProcess(command, {"CLIPPER_ADMIN_TOKEN": TOKEN, "CLIPPER_LOCAL_STATE_DIR": str(state_dir)})
    try:
        local.wait_ready()
        yield f"http://127.0.0.1:{port}"
    finally:
        local.interrupt()
    assert "all processes stopped" in local.output


def predict(url: str, rows: np.ndarray) -> list[Any]:
    outputs = []
    for row in rows:
        req = urllib.request.Request(
            f"{url}/{APP}/predict",
            data=json.dumps({"input": row.tolist()}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer = json.loads(resp.read())
        assert answer["default"] is False, answer
        outputs.append(answer["output"])
    return outputs


def answers_become(url: str, rows: np.ndarray, expected: list[int], within_s: float = 15.0) -> None:
    """Every frontend follows a version switch within its config refresh interval (2 s locally)."""
    deadline = time.monotonic() + within_s
    while (got := predict(url, rows)) != expected:
        assert time.monotonic() < deadline, f"answers {got}, expected {expected}"
        time.sleep(0.5)


def put(url: str, data: bytes) -> None:
    req = urllib.request.Request(url, data=data, method="PUT", headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def endpoint_processes(state_dir: Path, model: str, version: str) -> int:
    artifact = str(state_dir / "artifacts" / model / version / "model.onnx")
    count = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        count += b"clipper_endpoint" in args and artifact.encode() in args
    return count


def test_deploy_query_roll_forward_by_upload_roll_back(stack, demo_models, state_dir):
    holdout = np.load(Path(demo_models["out_dir"]) / demo_models["dataset"]["holdout"])
    x, y = holdout["X"].astype(np.float32), holdout["y"]
    rows = x[:8]
    v1 = LogisticRegression(max_iter=300).fit(x[100:], y[100:])
    v2 = LogisticRegression(max_iter=300).fit(x[100:], (y[100:] + 1) % 10)  # another model: labels shifted
    v1_answers, v2_answers = v1.predict(rows).tolist(), v2.predict(rows).tolist()
    assert v1_answers != v2_answers

    conn = ClipperConnection(stack, TOKEN)
    conn.register_application(APP, "floats", "-1", 2_000_000, input_shape=[64])
    steps: list[str] = []
    info = conn.deploy_sklearn_model(MODEL, "1", v1, "floats", rows[:2], progress=steps.append)
    assert info["is_current_version"] and info["status"] == "registered"
    assert any("uploading" in s for s in steps) and steps[-1].startswith(f"{MODEL}:1 active")
    conn.link_model_to_app(APP, MODEL)
    assert predict(stack, rows) == v1_answers

    # roll forward by uploading a new file: the updater registers v2 and, with auto_promote, makes it active
    conn.set_auto_promote(MODEL, True)
    target = conn.get_upload_url(MODEL, "2")
    put(target["url"], sklearn_to_onnx(v2, as_sample(rows, "floats"), "v2"))
    deadline = time.monotonic() + 30
    while not current(conn, "2"):
        assert time.monotonic() < deadline, "v2 was not registered and promoted"
        time.sleep(0.5)
    answers_become(stack, rows, v2_answers)

    cli = [sys.executable, "-m", "clipper.cli", "--url", stack, "--token", TOKEN]
    out = subprocess.run([*cli, "rollback", MODEL], capture_output=True, text=True, timeout=30, check=True)
    assert json.loads(out.stdout)["active_version"] == "1"
    answers_become(stack, rows, v1_answers)

    # a model that does not fit the linked application passes its own sample check, is uploaded, and is
    # rejected by the updater, which records why; the deployer reports it
    narrow = DecisionTreeClassifier(max_depth=4, random_state=0).fit(x[100:, :10], y[100:])
    with pytest.raises(DeployError, match=f"{MODEL}:3 was rejected") as rejected:
        conn.deploy_sklearn_model(MODEL, "3", narrow, "floats", rows[:2, :10], timeout_s=30)
    assert any(APP in reason for reason in rejected.value.reasons), rejected.value.reasons
    # a broken file uploaded by hand is rejected too, and never served
    put(conn.get_upload_url(MODEL, "4")["url"], b"not an onnx file")
    deadline = time.monotonic() + 30
    while not _rejected(conn, "4"):
        assert time.monotonic() < deadline, "the broken upload was not rejected"
        time.sleep(0.5)
    state = json.loads(subprocess.run([*cli, "inspect", "--json"], capture_output=True, text=True, check=True).stdout)
    model = state["models"][MODEL]
    assert model["active_version"] == "1" and set(model["versions"]) == {"1", "2"} and model["linked_apps"] == [APP]
    assert model["rejected"]["3"]["reasons"] == list(rejected.value.reasons)
    assert "not a loadable ONNX model" in model["rejected"]["4"]["reasons"][0]
    assert predict(stack, rows) == v1_answers

    # replicas: model-server + batcher pairs per version, started and stopped by the local stack
    assert conn.set_num_replicas(MODEL, 2)["scaled_versions"] == ["1", "2"]
    deadline = time.monotonic() + 30
    while endpoint_processes(state_dir, MODEL, "1") != 2:
        assert time.monotonic() < deadline, "the second replica did not start"
        time.sleep(0.5)
    assert predict(stack, rows) == v1_answers
    assert conn.get_num_replicas(MODEL) == 2
    # deleting the inactive version stops its processes (its stack goes with it)
    assert conn.stop_inactive_model_versions([MODEL]) == [{"deleted": [f"{MODEL}:2"]}]
    deadline = time.monotonic() + 30
    while endpoint_processes(state_dir, MODEL, "2") != 0:
        assert time.monotonic() < deadline, "the deleted version's model servers still run"
        time.sleep(0.5)
    assert endpoint_processes(state_dir, MODEL, "1") == 2 and predict(stack, rows) == v1_answers

    # a killed model server of an uploaded version comes back on its port; its queries are answered again
    name = f"endpoint-{MODEL}-1-0"
    before = _process(state_dir, name)
    os.kill(before["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (after := _process(state_dir, name))["pid"] in (None, before["pid"]):
        assert time.monotonic() < deadline, "the killed replica was not restarted"
        time.sleep(0.25)
    assert after["restarts"] == 1 and after["last_exit"] == -signal.SIGKILL
    assert endpoint_processes(state_dir, MODEL, "1") == 2
    port = json.loads((state_dir / "ports.json").read_text())[name]
    assert conn.get_model_info(MODEL, "1")["endpoint"] == f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:  # a query in flight when it died may have been answered with the default
        try:
            if predict(stack, rows) == v1_answers:
                break
        except AssertionError:
            pass
        assert time.monotonic() < deadline, "the restarted replica's version does not answer"
        time.sleep(0.5)


def _process(state_dir: Path, name: str) -> dict[str, Any]:
    listed = json.loads((state_dir / "processes.json").read_text())["processes"]
    return next(p for p in listed if p["name"] == name)


def current(conn: ClipperConnection, version: str) -> bool:
    try:
        return bool(conn.get_model_info(MODEL, version).get("is_current_version"))
    except AdminError as e:
        assert e.status == 404, e  # until the updater registered it
        return False


def _rejected(conn: ClipperConnection, version: str) -> bool:
    try:
        return bool(conn.get_model_info(MODEL, version).get("status") == "rejected")
    except AdminError as e:
        assert e.status == 404, e
        return False
