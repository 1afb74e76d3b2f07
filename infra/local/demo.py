"""The demo of the local stack: the digits models (``infra/demo/train_models.py``) served by model servers and
batchers, and the applications that use them, registered when missing (a user's changes to them are kept)."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path
from typing import Any

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from infra.local.serving import ProcessHost, batcher_command, endpoint_command
from infra.local.supervisor import Stage

logger = logging.getLogger("clipper.local")

APP = "digits"
MODEL = "mlp"


def start_models(
    host: ProcessHost, models: list[dict[str, Any]], queues: dict[str, dict[str, str]], folder: Path, slo_ms: float
) -> dict[str, str]:
    """A model server and a batcher per demo model (version 1); returns the servers' URLs by model."""
    endpoints = {}
    for m in models:
        name = m["name"]
        port = host.port(f"endpoint-{name}")
        endpoints[name] = f"http://127.0.0.1:{port}"
        server = host.spawn(f"endpoint-{name}", endpoint_command(folder / m["path"], port), Stage.SERVERS)
        host.wait_ready(endpoints[name] + "/ping", server, f"endpoint server for {name}")
        command = batcher_command(queues[name]["QueueUrl"], endpoints[name], slo_ms, name, "1")
        host.spawn(f"batcher-{name}", command, Stage.BATCHERS)
        logger.info("model %s (held-out accuracy %.3f) served at %s", name, m["accuracy"], endpoints[name])
    return endpoints


def seed(
    registry: DynamoDBRegistry,
    models: list[dict[str, Any]],
    queues: dict[str, dict[str, str]],
    endpoints: dict[str, str],
    slo_ms: float,
) -> list[str]:
    """Register each demo model and application that is missing (with its links); what exists stays as it is
    (a rollback, an app's policy, its links). Returns what was registered."""
    from clipper.core.domain import Application, InputType, ModelVersion, new_incarnation
    from clipper.errors import Conflict, NotFound

    slo = int(slo_ms * 1000)
    apps = [  # each a new incarnation when registered (a demo app deleted and registered again starts afresh)
        Application(APP, InputType.FLOATS, "-1", slo, (64,), incarnation=new_incarnation()),
        Application(f"{APP}-exp3", InputType.FLOATS, "-1", slo, (64,), policy="exp3", incarnation=new_incarnation()),
        Application(
            f"{APP}-exp4",
            InputType.FLOATS,
            "-1",
            slo,
            (64,),
            policy="exp4",
            confidence_threshold=0.75,
            incarnation=new_incarnation(),
        ),
    ]
    added = []
    for m in models:
        try:
            registry.model_record(m["name"])
            continue
        except NotFound:
            pass
        queue_url = queues[m["name"]]["QueueUrl"]
        version = ModelVersion(m["name"], "1", InputType.FLOATS, queue_url, endpoints[m["name"]], (64,), ("demo",))
        registry.put_version(version, activate=True)
        added.append(m["name"])
    for app in apps:
        try:
            registry.put_app(app)
        except Conflict:
            continue
        added.append(app.name)
        for model in [MODEL] if app.name == APP else [m["name"] for m in models]:
            registry.link(app.name, model)
    if added:
        logger.info("registered %s", ", ".join(added))
    logger.info(
        "application '%s' (SLO %g ms) answers from '%s'; '%s-exp3' and '%s-exp4' select among all demo models "
        "and learn from POST /<app>/update",
        APP,
        slo_ms,
        MODEL,
        APP,
        APP,
    )
    return added


def sample_query(folder: Path, manifest: dict[str, Any]) -> tuple[str, int]:
    """A request body of the held-out set, and its label."""
    import numpy as np

    holdout = np.load(folder / manifest["dataset"]["holdout"])
    return json.dumps({"input": [int(v) for v in holdout["X"][0]]}), int(holdout["y"][0])


def query(url: str, app: str, body: str) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(f"{url}/{app}/predict", data=body.encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        result: dict[str, Any] = json.loads(r.read())
    return result
