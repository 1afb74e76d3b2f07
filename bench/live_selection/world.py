"""The running local stack as this benchmark uses it: started as ``make run`` starts it (``infra/local/run.py``,
Redis Streams transport) on a free port with a state folder of its own, emptied first
(``build/bench-live-selection/state``, ``state-quick`` for --quick); the benchmark's applications registered
and linked through the admin API; the best model's broken version deployed beside the good one (registered,
served, not active) and made active, or the good one again, with ``set_model_version``: the admin API's roll
forward and back."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from bench.frontdoor.stack import LocalStack
from bench.live_selection.config import PROBE_APP, SLO_MS, WORK_DIR, Experiment, log
from bench.live_selection.driver import Client
from bench.live_selection.streams import tagged

PROBE_SERIAL = 900_000  # the probes' tags: beyond every stream's
SWITCH_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 300.0


class World:
    def __init__(self, state: str = "state") -> None:
        self.stack = LocalStack("redis", core=None)
        self.stack.state_dir = WORK_DIR / state
        self.env: dict[str, str] = {}
        self.conn: Any = None
        self._probes = 0

    def start(self) -> None:
        from clipper.client import ClipperConnection

        self.stack.start()
        self.env = json.loads((self.stack.state_dir / "env.json").read_text())
        self.conn = ClipperConnection(self.stack.url, self.stack.token, timeout_s=60)
        import boto3

        self._sqs = boto3.client(
            "sqs",
            endpoint_url=self.env["AWS_ENDPOINT_URL"],
            region_name=self.env.get("AWS_DEFAULT_REGION", "us-east-1"),
            aws_access_key_id=self.env.get("AWS_ACCESS_KEY_ID", "local"),
            aws_secret_access_key=self.env.get("AWS_SECRET_ACCESS_KEY", "local"),
        )

    def feedback_backlog(self) -> int:
        """Feedback messages accepted and not yet applied (waiting in the feedback queue, or being applied)."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        got = self._sqs.get_queue_attributes(QueueUrl=self.env["CLIPPER_FEEDBACK_QUEUE_URL"], AttributeNames=names)
        return sum(int(got["Attributes"].get(n, 0)) for n in names)

    def hold(self, bound: int, timeout_s: float = DRAIN_TIMEOUT_S) -> float:
        """Wait while more than ``bound`` feedback messages wait to be applied; returns the seconds waited."""
        from botocore.exceptions import BotoCoreError, ClientError

        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            try:
                if self.feedback_backlog() <= bound:
                    break
            except (BotoCoreError, ClientError) as e:  # the emulator restarting (the supervisor brings it back)
                log(f"  the feedback queue's depth is unknown for now: {type(e).__name__}")
                time.sleep(1.0)
            time.sleep(0.2)
        return time.monotonic() - started

    @property
    def url(self) -> str:
        return self.stack.url

    @property
    def redis_url(self) -> str:
        return self.env["REDIS_URL"]

    def register(self, experiment: Experiment, models: list[str]) -> list[str]:
        """The application, linked to ``models`` in that order; returns its links as the registry orders them."""
        app = experiment.app
        self.conn.register_application(app, "floats", "-1", SLO_MS * 1000, [64], policy=experiment.policy)
        for m in models:
            self.conn.link_model_to_app(app, m)
        linked: list[str] = self.conn.get_linked_models(app)
        log(f"registered {app} ({experiment.policy}, SLO {SLO_MS} ms) over {linked}")
        return linked

    def deploy_inactive(self, model: str, version: str, path: Any) -> None:
        self.conn.deploy_onnx_model(model, version, path, promote=False, progress=lambda m: log(f"  deploy: {m}"))

    def switch(self, client: Client, model: str, version: str) -> float:
        """Make ``version`` of ``model`` the active one, and wait until the frontend answers from it (probes to
        the demo's single-model application on it: the frontend's registry copy holds one active version per
        model, whichever application asks). Returns the seconds from the switch to the first such answer."""
        started = time.monotonic()
        self.conn.set_model_version(model, version)
        while time.monotonic() - started < SWITCH_TIMEOUT_S:
            row = tagged(np.zeros((1, 64), np.float32), PROBE_SERIAL + self._probes)[0]
            self._probes += 1
            status, answer = client.post(f"/{PROBE_APP}/predict?debug=true", {"input": row.tolist()})
            if status == 200 and (answer.get("debug") or {}).get("version") == version:
                return time.monotonic() - started
            time.sleep(0.1)
        raise TimeoutError(f"the frontend did not answer from {model}:{version} within {SWITCH_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        self.stack.stop()
