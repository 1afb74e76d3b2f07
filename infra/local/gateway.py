"""The local stack's front door (``uvicorn infra.local.gateway:app``): the admin function's and the frontend
function's FastAPI apps, the same objects their Lambda handlers wrap, behind API Gateway's routing
(``infra/local/routing.py``). With ``CLIPPER_LOCAL_PROCESSES_FILE`` set (the local stack sets it), ``GET /metrics``
also lists the stack's processes as the supervisor reports them; with ``CLIPPER_LOCAL_REQUEST_LOG``, every request
is logged there (``infra/local/requestlog.py``). On AWS neither exists: API Gateway routes, CloudWatch logs. A change
made through the admin API here reaches the frontend's registry copy at once (``infra.local.routing.invalidating``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from functions.admin.app import app as admin
from functions.frontend.app import app as frontend
from functions.frontend.app import processor
from infra.local.requestlog import RequestLog, logged
from infra.local.routing import gateway, invalidating

PROCESSES = os.environ.get("CLIPPER_LOCAL_PROCESSES_FILE", "")

# the frontend's registry copy (also its feedback's) forgets what each change made here names
copy: Any = processor.registry
admin_app: Any = invalidating(admin, copy) if hasattr(copy, "forget") else admin
app: Any = gateway(admin_app, frontend, Path(PROCESSES) if PROCESSES else None)
if os.environ.get("CLIPPER_LOCAL_REQUEST_LOG"):
    request_log = RequestLog(Path(os.environ["CLIPPER_LOCAL_REQUEST_LOG"]))
    request_log.start()
    app = logged(app, request_log)
