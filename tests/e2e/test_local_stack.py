"""`make run` as a user runs it: start it, wait for its ready line, run the curl line it prints, Ctrl-C,
and check that nothing it started is left running."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.services import REPO, free_port

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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CLIPPER_", "REDIS_URL"))}
    env["PORT"] = str(port)
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "run"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own session, like a terminal's foreground job
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "local stack ready" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(240), "no ready line:\n" + "".join(lines[-30:])
        time.sleep(0.5)  # the curl line follows the ready line
        curl = next(line.strip() for line in lines if line.strip().startswith("curl "))
        assert f"127.0.0.1:{port}/digits/predict" in curl
        out = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=30, check=True).stdout
        answer = json.loads(out)
        assert answer["default"] is False and isinstance(answer["output"], int), answer
        assert re.search(r"sample query answered: .*'default': False", "".join(lines))
        manage_as_a_user(port, "".join(lines), answer["output"])
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        reader.join(timeout=5)
    deadline = time.monotonic() + 10
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session_processes(proc.pid) == [], "left running after Ctrl-C"
    assert "all processes stopped" in "".join(lines)


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
