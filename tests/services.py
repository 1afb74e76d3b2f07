"""Real services the integration and e2e tests start for themselves: a private redis-server on a free
loopback port (installed by `make test`/.ci/run when the machine lacks it)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: run `make test` (it installs it) or apt-get install redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory",
            "64mb",
            "--maxmemory-policy",
            "allkeys-lru",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


REPO = __import__("pathlib").Path(__file__).resolve().parent.parent


def start_endpoint(model_path: str, port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start the ONNX Runtime endpoint server (model-images/onnx-runtime) as a process; returns its URL."""
    import os
    import sys
    import urllib.request

    port = port or free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "model-images" / "onnx-runtime"), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clipper_endpoint",
            "--model-path",
            model_path,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"endpoint server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/ping", timeout=0.5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise TimeoutError("endpoint server did not answer /ping")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class AtomicRequests:
    """A boto3 client whose every request runs alone, as one DynamoDB request does. moto, a test double,
    interleaves the check and the write of concurrent conditional requests; DynamoDB does not."""

    _lock = threading.Lock()

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        method = getattr(self._client, name)

        def call(*args, **kwargs):
            with self._lock:
                return method(*args, **kwargs)

        return call


class LocalStackProcess:
    """The local stack (``make run`` or ``infra/local/run.py``) started as a user starts it: in a session of
    its own, with AWS/Clipper variables of the test environment left out; its output lines are collected,
    ``wait_ready`` waits for its ready line and ``interrupt`` stops it as Ctrl-C does."""

    def __init__(self, command: list[str], extra_env: dict[str, str]) -> None:
        import os

        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CLIPPER_", "REDIS_URL"))}
        env.update(extra_env)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own session, like a terminal's foreground job
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if "local stack ready" in line:
                self._ready.set()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_ready(self, timeout_s: float = 240) -> None:
        assert self._ready.wait(timeout_s), "no ready line:\n" + "".join(self.lines[-30:])

    def interrupt(self, timeout_s: float = 60) -> None:
        import os
        import signal

        os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        self._reader.join(timeout=5)
