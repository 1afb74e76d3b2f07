"""The local gateway's routing (API Gateway's stand-in): the admin API's segment, and nothing more."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from infra.local.routing import gateway

pytestmark = pytest.mark.unit


def test_only_the_admin_segment_goes_to_the_admin_api():
    """It routed every path beginning /admin to the admin API, so an application named administrator (or
    admin-tools) could never be queried locally, while on AWS it can."""
    seen: list[tuple[str, str]] = []

    def app(name: str) -> Any:
        async def answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
            seen.append((name, scope["path"]))

        return answer

    route = gateway(app("admin"), app("frontend"))
    for path in ("/admin", "/admin/add_app", "/administrator/predict", "/admin-tools/predict", "/digits/predict"):
        asyncio.run(route({"type": "http", "method": "POST", "path": path}, None, None))
    assert seen == [
        ("admin", "/admin"),
        ("admin", "/admin/add_app"),
        ("frontend", "/administrator/predict"),
        ("frontend", "/admin-tools/predict"),
        ("frontend", "/digits/predict"),
    ]
