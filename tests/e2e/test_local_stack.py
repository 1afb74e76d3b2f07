"""`make run` as a user runs it: start it, wait for its ready line, run the curl line it prints, Ctrl-C,
and check that nothing it started is left running."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from tests.services import REPO, LocalStackProcess, free_port

pytestmark = pytest.mark.e2e


def session_processes(sid: int) -> list[int]:
    """PIDs of live processes in session ``sid`` (read from /proc: field 6 of stat is the session)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def test_make_run_serves_the_demo_app_and_stops_cleanly(demo_models):
    port = free_port()
    local = LocalStackProcess(["make", "--no-print-directory", "run"], {"PORT": str(port)})
    try:
        local.wait_ready()
        time.sleep(0.5)  # the curl line follows the ready line
        curl = next(line.strip() for line in local.lines if line.strip().startswith("curl "))
        assert f"127.0.0.1:{port}/digits/predict" in curl
        out = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=30, check=True).stdout
        answer = json.loads(out)
        assert answer["default"] is False and isinstance(answer["output"], int), answer
        assert re.search(r"sample query answered: .*'default': False", local.output)
        manage_as_a_user(port, local.output, answer["output"])
    finally:
        local.interrupt()
    deadline = time.monotonic() + 10
    while session_processes(local.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session_processes(local.proc.pid) == [], "left running after Ctrl-C"
    assert "all processes stopped" in local.output


def manage_as_a_user(port: int, output: str, label: int) -> None:
    """The management CLI and Python client against the running stack, with the token it printed."""
    token = re.search(r"CLIPPER_ADMIN_TOKEN=(\S+)", output).group(1)
    env = dict(os.environ, CLIPPER_URL=f"http://127.0.0.1:{port}", CLIPPER_ADMIN_TOKEN=token)
    cli = str(REPO / ".venv" / "bin" / "clipper")
    denied = subprocess.run([cli, "--token", "wrong", "apps"], env=env, capture_output=True, text=True, timeout=30)
    assert denied.returncode == 2 and "403" in denied.stderr
    apps = json.loads(subprocess.run([cli, "apps"], env=env, capture_output=True, text=True, check=True).stdout)
    assert {"digits", "digits-exp3", "digits-exp4"} <= set(apps)

    from clipper.client import ClipperConnection

    conn = ClipperConnection(f"http://127.0.0.1:{port}", token)
    conn.deploy_model("mlp", "2", "floats", [64], labels=["canary"], activate=False)
    assert conn.get_model_info("mlp", "1")["is_current_version"]
    conn.set_model_version("mlp", "2")
    assert conn.get_model_info("mlp", "2")["is_current_version"]
    assert conn.rollback_model("mlp")["active_version"] == "1"
    state = conn.inspect_instance()
    assert state["models"]["mlp"]["active_version"] == "1" and "2" in state["models"]["mlp"]["versions"]
