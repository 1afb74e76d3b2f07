"""The local stack's gateway: the admin API and the frontend in one process, so a change made through the admin
API reaches the frontend's registry copy at once (``infra.local.routing.invalidating``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.admin.api import create_admin_app
from clipper.admin.service import AdminService
from clipper.batching.core import Batcher
from clipper.core.registry_cache import CachedRegistry
from clipper.frontend.api import create_app
from clipper.frontend.query import QueryProcessor
from infra.local.routing import gateway, invalidating
from tests.fakes import FakeEndpoint, FakeResolver, InMemoryReplies, digits_app, model_version
from tests.services import free_port, wait_for_port
from tests.unit.test_query_processor import InlineQueue

pytestmark = pytest.mark.integration
TOKEN = "gateway-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def serve(app: Any) -> tuple[str, Any, threading.Thread]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port(port)
    return f"http://127.0.0.1:{port}", server, thread


@pytest.fixture
def stack(aws) -> Iterator[dict[str, Any]]:
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app(latency_slo_micros=2_000_000))
    registry.put_version(model_version("mlp", "1"), activate=True)
    registry.link("digits", "mlp")
    admin = create_admin_app(AdminService(registry), "token", TOKEN)
    clock, replies = SystemClock(), InMemoryReplies()
    cached = CachedRegistry(registry, clock, ttl_s=60)  # a copy that would hold a deleted app for a minute
    queue = InlineQueue(batcher=Batcher(FakeResolver(FakeEndpoint()), replies, clock))
    frontend = create_app(QueryProcessor(cached, queue, replies, clock, lambda: 1 << 16), 1 << 20)
    forgets: list[int] = []

    def forget() -> None:
        forgets.append(1)
        cached.invalidate()

    url, server, thread = serve(gateway(invalidating(admin, forget), frontend))
    yield {"url": url, "forgets": forgets}
    server.should_exit = True
    thread.join(10)


def test_a_change_through_the_admin_api_reaches_the_frontends_copy_at_once(stack):
    url, body = stack["url"], {"input": [0.0] * 64}
    with requests.Session() as http:

        def post(path: str, payload: dict[str, Any], **kw: Any) -> requests.Response:
            return http.post(url + path, json=payload, timeout=10, **kw)

        assert post("/digits/predict", body).status_code == 200  # the copy holds digits now
        assert post("/admin/get_application", {"name": "digits"}, headers=AUTH).status_code == 200
        assert stack["forgets"] == []  # a read changes nothing
        assert post("/admin/delete_app", {"name": "nope"}, headers=AUTH).status_code == 404
        assert stack["forgets"] == []  # nor does a refused change
        assert post("/admin/delete_app", {"name": "digits"}, headers=AUTH).status_code == 200
        assert stack["forgets"] == [1]
        gone = post("/digits/predict", body)
        assert gone.status_code == 404, gone.text  # not answered from the copy for its TTL
