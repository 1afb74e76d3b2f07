"""The local stack's stand-in for API Gateway's routing: /admin/... goes to the admin function's app,
everything else to the frontend's, both the same FastAPI objects their Lambda handlers wrap. With
``CLIPPER_LOCAL_REQUEST_LOG`` set (the local stack sets it), every request is logged there
(``infra/local/requestlog.py``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from functions.admin.app import app as admin
from functions.frontend.app import app as frontend
from infra.local.requestlog import RequestLog, logged


async def route(scope: dict[str, Any], receive: Any, send: Any) -> None:
    target = admin if scope["type"] == "http" and scope["path"].startswith("/admin") else frontend
    await target(scope, receive, send)


app: Any = route
if os.environ.get("CLIPPER_LOCAL_REQUEST_LOG"):
    request_log = RequestLog(Path(os.environ["CLIPPER_LOCAL_REQUEST_LOG"]))
    request_log.start()
    app = logged(route, request_log)
