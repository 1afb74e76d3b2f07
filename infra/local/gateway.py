"""The local stack's stand-in for API Gateway's routing: /admin/... goes to the admin function's app,
everything else to the frontend's, both the same FastAPI objects their Lambda handlers wrap. With
``CLIPPER_LOCAL_REQUEST_LOG`` set (the local stack sets it), every request is logged there
(``infra/local/requestlog.py``); with ``CLIPPER_LOCAL_PROCESSES_FILE``, ``GET /metrics`` also lists the stack's
processes as the supervisor reports them (status, restarts), under ``processes``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from functions.admin.app import app as admin
from functions.frontend.app import app as frontend
from infra.local.requestlog import RequestLog, logged

PROCESSES = os.environ.get("CLIPPER_LOCAL_PROCESSES_FILE", "")


async def route(scope: dict[str, Any], receive: Any, send: Any) -> None:
    target = admin if scope["type"] == "http" and scope["path"].startswith("/admin") else frontend
    if PROCESSES and scope["type"] == "http" and scope["path"] == "/metrics" and scope["method"] == "GET":
        await with_processes(target, scope, receive, send)
        return
    await target(scope, receive, send)


async def with_processes(target: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The frontend's /metrics with the supervisor's processes added."""
    start: dict[str, Any] = {}
    body = bytearray()

    async def collect(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            body.extend(message.get("body", b""))

    await target(scope, receive, collect)
    try:
        report = json.loads(body)
        report["processes"] = json.loads(Path(PROCESSES).read_text())["processes"]
        body[:] = json.dumps(report).encode()
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not yet written, or not JSON: the frontend's answer as it is
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": start.get("status", 200), "headers": headers})
    await send({"type": "http.response.body", "body": bytes(body)})


app: Any = route
if os.environ.get("CLIPPER_LOCAL_REQUEST_LOG"):
    request_log = RequestLog(Path(os.environ["CLIPPER_LOCAL_REQUEST_LOG"]))
    request_log.start()
    app = logged(route, request_log)
