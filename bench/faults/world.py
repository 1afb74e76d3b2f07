"""The running local stack as the fault suite sees it: its processes (the supervisor's processes.json), its
environment (env.json: Redis, tables, the AWS emulator), the demo model's queue, and the extra model the suite
registers behind a fault proxy (``faulty``: the demo MLP's server behind ``FaultProxy``, its own queue on Redis
Streams and a real batcher process started with the stack's environment)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.faults.proxy import FaultProxy
from bench.frontdoor.procs import free_port
from bench.frontdoor.stack import LocalStack

FAULTY_APP, FAULTY_MODEL = "faults", "faulty"
FAULTY_SLO_MS = 100
FAULTY_QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/bench-faults-faulty"


@dataclass
class World:
    stack: LocalStack
    env: dict[str, str] = field(default_factory=dict)
    proxy: FaultProxy | None = None
    batcher: subprocess.Popen[bytes] | None = None

    @property
    def state(self) -> Path:
        return self.stack.state_dir

    def processes(self) -> dict[str, dict[str, Any]]:
        from clipper.cli.local import processes

        return {p["name"]: p for p in processes(self.state) or []}

    def restarts(self) -> dict[str, int]:
        """How often the supervisor has restarted each process so far."""
        return {name: int(p.get("restarts") or 0) for name, p in self.processes().items()}

    def kill(self, name: str, sig: int = signal.SIGKILL) -> dict[str, Any]:
        before = self.processes()[name]
        os.kill(before["pid"], sig)
        return before

    def wait_restarted(self, name: str, before: dict[str, Any], timeout_s: float = 60.0) -> float:
        """Seconds until the supervisor reports ``name`` running again under another pid."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            p = self.processes().get(name, {})
            if p.get("status") == "running" and p.get("pid") != before["pid"]:
                return time.monotonic() - started
            time.sleep(0.1)
        raise TimeoutError(f"{name} was not restarted within {timeout_s:.0f} s")

    def redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.env["REDIS_URL"], socket_timeout=5)

    def frontend_rss_kb(self) -> int:
        pid = self.processes()["frontend"]["pid"]
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def setup_faulty(self) -> None:
        """The ``faults`` app and ``faulty`` model behind the proxy, with a batcher process of its own."""
        from clipper.client import ClipperConnection

        self.env = json.loads((self.state / "env.json").read_text())
        port = json.loads((self.state / "ports.json").read_text())["endpoint-mlp"]
        self.proxy = FaultProxy(f"http://127.0.0.1:{port}", free_port())
        self.proxy.start()
        conn = ClipperConnection(self.stack.url, self.stack.token)
        conn.register_application(FAULTY_APP, "floats", "-1", FAULTY_SLO_MS * 1000, input_shape=[64])
        conn.deploy_model(FAULTY_MODEL, "1", "floats", [64], queue_url=FAULTY_QUEUE, endpoint=self.proxy.url)
        conn.link_model_to_app(FAULTY_APP, FAULTY_MODEL)
        env = {**os.environ, **self.env, "CLIPPER_QUEUE_TRANSPORT": "redis", "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "clipper.entrypoints.batcher", "--queue-url", FAULTY_QUEUE]
        command += ["--endpoint-url", self.proxy.url, "--model", FAULTY_MODEL, "--version", "1"]
        log = open(self.stack.state_dir.parent / "faulty-batcher.log", "w")  # noqa: SIM115 (closed with the process)
        self.batcher = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(3)  # the frontend's configuration refresh (2 s) sees the new app

    def teardown(self) -> None:
        if self.batcher is not None:
            self.batcher.send_signal(signal.SIGTERM)
            try:
                self.batcher.wait(15)
            except subprocess.TimeoutExpired:
                self.batcher.kill()
        if self.proxy is not None:
            self.proxy.stop()


def pings(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False
