"""The local stack's stand-in for API Gateway's routing: /admin/... goes to the admin function's app,
everything else to the frontend's, both the same FastAPI objects their Lambda handlers wrap."""

from __future__ import annotations

from typing import Any

from functions.admin.app import app as admin
from functions.frontend.app import app as frontend


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    target = admin if scope["type"] == "http" and scope["path"].startswith("/admin") else frontend
    await target(scope, receive, send)
