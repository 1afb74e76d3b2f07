"""A batching setting changed through the admin API reaches the running long-poll batcher of the local stack,
without a restart: `clipper batching mlp --controller fixed --batch-size 3` on a running `make run`, then

- the batcher process (same pid, never restarted) logs the configuration it switched to (its ConfigFollower
  reads the registry every CLIPPER_CONFIG_TTL_S, 2 s in the local stack), and
- the controller it batches with is the new one: the state it saves to the registry (after a batch, every 5 s,
  ``MODEL#mlp`` / ``BATCHER#1``) is the fixed controller's, of size 3.

One start-up of the stack (a minute or two of CPU on a small machine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest

from tests.e2e.test_local_stack import eventually, make_run, post, processes, stopped_cleanly
from tests.services import free_port

pytestmark = pytest.mark.e2e

SIZE = 3


def test_a_changed_batching_setting_reaches_the_running_batcher(demo_models, tmp_path):
    holdout = np.load(Path(demo_models["out_dir"]) / demo_models["dataset"]["holdout"])
    rows = iter(holdout["X"].astype(np.float32))  # distinct inputs: the cache cannot answer them
    state, port = tmp_path / "state", free_port()
    url = f"http://127.0.0.1:{port}"
    local = make_run(port, state)
    try:
        local.wait_ready()
        token = re.search(r"CLIPPER_ADMIN_TOKEN=(\S+)", local.output).group(1)
        log = state / "logs" / "batcher-mlp.log"
        before = processes(state)["batcher-mlp"]
        assert re.search(r"batching: aimd ", log.read_text()), log.read_text()[-2000:]  # the default at start
        assert controller_state(state) != {"kind": "fixed", "size": SIZE}

        changed = clipper(url, token, "batching", "mlp", "--controller", "fixed", "--batch-size", str(SIZE))
        assert changed["batching"]["controller"] == "fixed" and changed["batching"]["batch_size"] == SIZE, changed
        assert changed["versions_without_lambda_batcher"] == ["1"]  # the local stack runs long-poll batchers

        within(
            lambda: re.search(rf"batching: fixed \(size {SIZE}\)", log.read_text()),
            lambda: f"the running batcher did not switch to a fixed size {SIZE}:\n{log.read_text()[-2000:]}",
            30,
        )

        saved: list[dict[str, Any] | None] = []

        def saved_fixed() -> bool:  # queries make batches; a batch saves the controller's state every 5 s
            status, answer = post(f"{url}/digits/predict", {"input": next(rows).tolist()})
            assert status == 200 and not answer["default"], answer
            saved.append(controller_state(state))
            return saved[-1] == {"kind": "fixed", "size": SIZE}

        within(saved_fixed, lambda: f"the batcher's controller is not the fixed one: it saved {saved[-1]}", 60)
        after = processes(state)["batcher-mlp"]
        assert after["pid"] == before["pid"] and after["restarts"] == 0, after  # the same process, not a new one
        stopped_cleanly(local)
    finally:
        local.close()


def within(check: Callable[[], Any], what: Callable[[], str], seconds: float) -> None:
    """``eventually``, with a failure message made when it fails (the log, the state as they are then)."""
    try:
        eventually(check, "", seconds)
    except AssertionError:
        raise AssertionError(what()) from None


def clipper(url: str, token: str, *args: str) -> Any:
    env = dict(os.environ, CLIPPER_URL=url, CLIPPER_ADMIN_TOKEN=token)
    done = subprocess.run(
        [sys.executable, "-m", "clipper.cli", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def controller_state(state: Path) -> dict[str, Any] | None:
    """The mlp:1 batcher's saved controller state, read from the stack's registry table in its moto server."""
    moto = json.loads((state / "ports.json").read_text())["moto"]
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=f"http://127.0.0.1:{moto}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    tables = [t for t in dynamodb.list_tables()["TableNames"] if t.endswith("-RegistryTable")]
    assert len(tables) == 1, tables
    item = dynamodb.get_item(TableName=tables[0], Key={"pk": {"S": "MODEL#mlp"}, "sk": {"S": "BATCHER#1"}})
    return json.loads(item["Item"]["state"]["S"]) if "Item" in item else None
