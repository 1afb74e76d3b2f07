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
from infra.local.routing import gateway, invalidating, named_in
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


class CountingRegistry(DynamoDBRegistry):
    """The frontend's registry, counting its reads of applications (the admin API has a registry of its own)."""

    reads = 0

    def app_and_links(self, name: str) -> tuple[Any, list[str]]:
        CountingRegistry.reads += 1
        return super().app_and_links(name)


class RecordingCopy(CachedRegistry):
    """The frontend's registry copy, saying what it was told to forget."""

    told: list[object]

    def forget(self, names: Any) -> None:
        self.told.append(sorted(names))
        super().forget(names)

    def invalidate(self) -> None:
        self.told.append("everything")
        super().invalidate()


@pytest.fixture
def stack(aws) -> Iterator[dict[str, Any]]:
    registry = CountingRegistry(aws.dynamodb, aws.registry_table)
    for app in ("digits", "other"):
        registry.put_app(digits_app(name=app, latency_slo_micros=2_000_000))
    registry.put_version(model_version("mlp", "1"), activate=True)
    for app in ("digits", "other"):
        registry.link(app, "mlp")
    admin = create_admin_app(AdminService(DynamoDBRegistry(aws.dynamodb, aws.registry_table)), "token", TOKEN)
    clock, replies = SystemClock(), InMemoryReplies()
    cached = RecordingCopy(registry, clock, ttl_s=60)  # a copy that would hold a deleted app for a minute
    cached.told = []
    queue = InlineQueue(batcher=Batcher(FakeResolver(FakeEndpoint()), replies, clock))
    frontend = create_app(QueryProcessor(cached, queue, replies, clock, lambda: 1 << 16), 1 << 20)
    url, server, thread = serve(gateway(invalidating(admin, cached), frontend))
    yield {"url": url, "told": cached.told}
    server.should_exit = True
    thread.join(10)


def test_a_change_through_the_admin_api_reaches_the_frontends_copy_at_once(stack):
    url, body = stack["url"], {"input": [0.0] * 64}
    with requests.Session() as http:

        def post(path: str, payload: Any, **kw: Any) -> requests.Response:
            return http.post(url + path, json=payload, timeout=10, **kw)

        for app in ("digits", "other"):
            assert post(f"/{app}/predict", body).status_code == 200  # the copy holds both now
        assert post("/admin/get_application", {"name": "digits"}, headers=AUTH).status_code == 200
        assert stack["told"] == []  # a read changes nothing
        assert post("/admin/delete_app", {"name": "nope"}, headers=AUTH).status_code == 404
        assert stack["told"] == []  # nor does a refused change
        reads = CountingRegistry.reads
        assert post("/admin/delete_app", {"name": "digits"}, headers=AUTH).status_code == 200
        assert stack["told"] == [["digits"]]  # what the change named, not everything
        gone = post("/digits/predict", body)
        assert gone.status_code == 404, gone.text  # not answered from the copy for its TTL
        assert post("/other/predict", body).status_code == 200
        assert CountingRegistry.reads == reads + 1  # digits read again; other still answered from the copy
        links = {"app_name": "other", "model_names": ["mlp"]}
        assert post("/admin/delete_model_links", links, headers=AUTH).status_code == 200
        assert stack["told"][-1] == ["mlp", "other"]


def test_the_names_a_change_names():
    assert named_in(b'{"name": "a", "policy": "exp3"}') == {"a"}
    assert named_in(b'{"app_name": "a", "model_names": ["m", "n", 3]}') == {"a", "m", "n"}
    assert named_in(b'{"model_name": "m", "version": "2"}') == {"m"}
    assert named_in(b'{"verbose": true}') is None and named_in(b"[1]") is None and named_in(b"{nope") is None
