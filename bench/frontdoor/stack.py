"""The whole local stack as a user runs it (``infra/local/run.py``, what ``make run`` starts), pinned to one
core, and the two applications the benchmark registers through its admin API.

The stack starts on a free port in its own session with ``taskset -c <core>`` (moto, redis-server, the model
servers, the batchers, the frontend: every process it starts inherits the affinity), with ``--queue`` (and
``CLIPPER_QUEUE_TRANSPORT``) naming the request-queue transport, in a state folder of its own
(``build/bench-frontdoor/state-<transport>``, emptied first: ``--fresh``). When it prints its ``export CLIPPER_URL=...
CLIPPER_ADMIN_TOKEN=...`` line, the benchmark registers, as README's "A model's lifecycle" does:

- ``fd-mlp``: floats of shape [64], SLO 20 ms, linked to ``mlp`` (the demo MLP the stack already serves);
- ``fd-cnn``: floats of shape [3, 32, 32], SLO 100 ms, linked to ``cnn`` version 1, deployed with
  ``ClipperConnection.deploy_onnx_model`` (checked, uploaded to the model bucket, registered by the model
  updater, which starts its model server and batcher).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from bench.frontdoor.config import DEMO_SLO_MS, MODELS_DIR, ROOT, STACK_START_TIMEOUT_S, WORK_DIR, ModelCase, log
from bench.frontdoor.procs import Group, free_port

READY = "local stack ready"
EXPORT = re.compile(r"export CLIPPER_URL=(\S+) CLIPPER_ADMIN_TOKEN=(\S+)")


class LocalStack:
    def __init__(self, transport: str, core: int | None) -> None:
        self.transport = transport
        self.core = core
        self.port = free_port()
        self.url = ""
        self.token = ""
        self.ready_at = 0.0
        self.group: Group | None = None
        self.state_dir = WORK_DIR / f"state-{transport}"
        self._ready = False

    def _line(self, line: str) -> None:
        if match := EXPORT.search(line):
            self.url, self.token = match.group(1), match.group(2)
        if READY in line:
            self._ready = True
        if not self._ready or "exited" in line or "failed" in line:
            print(f"    {line}", flush=True)  # the stack's progress while it starts, its trouble after

    def start(self) -> None:
        started = time.monotonic()
        command = [sys.executable, str(ROOT / "infra" / "local" / "run.py"), "--port", str(self.port)]
        # Its own state folder, emptied first: nothing from a user's `make run` or an earlier run comes back.
        command += ["--queue", self.transport, "--state-dir", str(self.state_dir), "--fresh"]
        env = {"CLIPPER_QUEUE_TRANSPORT": self.transport, "CLIPPER_DEMO_SLO_MS": str(DEMO_SLO_MS)}
        log(f"starting the local stack (transport {self.transport}, port {self.port}, core {self.core})")
        self.group = Group(command, WORK_DIR / f"stack-{self.transport}.log", self.core, env, self._line)
        deadline = started + STACK_START_TIMEOUT_S
        while not (self._ready and self.url):
            if self.group.proc.poll() is not None:
                raise RuntimeError(f"the local stack exited while starting:\n{self.group.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the local stack was not ready within {STACK_START_TIMEOUT_S} s")
            time.sleep(0.2)
        self.ready_at = time.monotonic() - started
        log(f"local stack ready in {self.ready_at:.0f} s at {self.url}")
        self.check_transport()

    def check_transport(self) -> None:
        """The stack's processes take the transport from the environment it records in its state folder's
        env.json: make sure it is the one asked for (else the wrong transport would be measured under the right
        name)."""
        try:
            env = json.loads((self.state_dir / "env.json").read_text())
        except (OSError, ValueError) as e:
            raise RuntimeError(f"the stack's environment ({self.state_dir}/env.json) is unreadable: {e}") from e
        used = env.get("CLIPPER_QUEUE_TRANSPORT", "sqs")  # clipper.settings' default
        if used != self.transport:
            raise RuntimeError(f"asked for the {self.transport} transport, the stack runs {used}")

    def register(self, cases: list[ModelCase]) -> None:
        """Register each case's application and link its model; deploy the CNN as a model version."""
        from clipper.client import ClipperConnection

        conn = ClipperConnection(self.url, token=self.token, timeout_s=60)
        for case in cases:
            shape = list(case.input_shape)
            conn.register_application(case.app, "floats", "-1", int(case.slo_ms * 1000), shape)
            log(f"registered {case.app} (floats {shape}, SLO {case.slo_ms:g} ms)")
            if case.name == "cnn":
                conn.deploy_onnx_model("cnn", "1", cnn_path(), progress=lambda m: log(f"  deploy: {m}"))
            conn.link_model_to_app(case.app, case.name)
            log(f"linked {case.app} -> {case.name}")

    def stop(self) -> None:
        if self.group is None:
            return
        log(f"stopping the local stack (transport {self.transport})")
        killed = self.group.stop()
        if killed:
            log(f"warning: {len(killed)} process(es) of the stack had to be killed: {killed}")
        self.group = None


def cnn_path() -> Path:
    from infra.demo.cnn_model import ensure_cnn

    return ensure_cnn(MODELS_DIR)
