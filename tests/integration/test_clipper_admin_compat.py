"""Clipper's own client, clipper_admin 0.4.1 from PyPI, unchanged, against this stack's admin API (and the query
API's /metrics) over real HTTP, through ``clipper.compat.serverless_manager.ServerlessContainerManager``: every
ClipperConnection method that needs no Docker."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

clipper_admin = pytest.importorskip("clipper_admin")  # installed by the Makefile (make venv), without its pins

from clipper_admin import ClipperConnection  # noqa: E402
from clipper_admin.exceptions import ClipperException  # noqa: E402

from clipper.adapters.dynamodb_registry import DynamoDBRegistry  # noqa: E402
from clipper.admin.api import create_admin_app  # noqa: E402
from clipper.admin.service import AdminService  # noqa: E402
from clipper.compat.serverless_manager import ServerlessContainerManager  # noqa: E402
from clipper.frontend.api import create_app  # noqa: E402
from clipper.frontend.metrics import InProcessMetrics  # noqa: E402
from clipper.frontend.query import QueryProcessor  # noqa: E402
from tests.fakes import FakeClock, InMemoryReplies, ListQueue, model_version  # noqa: E402
from tests.services import free_port, wait_for_port  # noqa: E402

pytestmark = pytest.mark.integration
TOKEN = "compat-token"


@pytest.fixture
def api(aws, tmp_path) -> Iterator[str]:
    """The admin API and the query API (for /metrics) on one real HTTP port, as the local stack's gateway."""
    import uvicorn

    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url), activate=True)
    admin = create_admin_app(AdminService(registry), "token", TOKEN)
    metrics = InProcessMetrics()
    processor = QueryProcessor(registry, ListQueue(), InMemoryReplies(), FakeClock(), lambda: 1)
    frontend = create_app(processor, 1 << 20, metrics=metrics, observe=metrics)

    async def gateway(scope, receive, send):  # type: ignore[no-untyped-def]
        target = admin if scope["type"] == "http" and scope["path"].startswith("/admin") else frontend
        await target(scope, receive, send)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(gateway, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port(port)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def conn(api, tmp_path) -> ClipperConnection:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "frontend.log").write_text("started\n")
    (tmp_path / "requests.log").write_text("POST /shapes/predict 200\n")  # the gateway's, beside the folder
    c = ClipperConnection(ServerlessContainerManager(api, token=TOKEN, logs_dir=logs))
    c.connect()
    return c


def test_clippers_client_works_unchanged(conn, tmp_path):
    conn.register_application("shapes", "floats", "-1", 100000)
    assert "shapes" in conn.get_all_apps()
    info = conn.get_app_info("shapes")
    assert (info["name"], info["input_type"], info["latency_slo_micros"]) == ("shapes", "floats", 100000)
    assert [a["name"] for a in conn.get_all_apps(verbose=True)] == ["shapes"]

    # a second version of a served model (it shares the active version's queue and endpoint), Clipper's body
    conn.register_model("mlp", "2", "floats", labels=["candidate"])
    assert conn.get_current_model_version("mlp") == "2"  # Clipper's add_model makes it current
    versions = {(m["model_name"], m["model_version"]): m for m in conn.get_all_models(verbose=True)}
    assert versions[("mlp", "1")]["is_current_version"] is False and versions[("mlp", "2")]["labels"] == ["candidate"]
    assert sorted(conn.get_all_models()) == ["mlp:1", "mlp:2"]
    assert conn.get_model_info("mlp", "2")["container_name"] != "NO_CONTAINER"

    conn.link_model_to_app("shapes", "mlp")
    assert conn.get_linked_models("shapes") == ["mlp"]

    assert conn.get_num_replicas("mlp") == 1
    conn.set_num_replicas("mlp", 2)
    assert conn.get_num_replicas("mlp", "2") == 2
    replicas = conn.get_all_model_replicas()
    assert sorted(replicas) == ["mlp:1:0", "mlp:1:1", "mlp:2:0", "mlp:2:1"]
    assert conn.get_all_model_replicas(verbose=True)[0]["model_name"] == "mlp"
    one = conn.get_model_replica_info("mlp", "2", 1)
    assert (one["model_version"], one["model_replica_id"]) == ("2", 1)

    conn.set_model_version("mlp", "1")
    assert conn.get_current_model_version("mlp") == "1"
    conn.stop_inactive_model_versions(["mlp"])
    assert conn.get_all_models() == ["mlp:1"]

    # a new model described without serving resources, as Clipper registers one before its containers start
    conn.register_model("described", "1", "floats", batch_size=16)
    assert conn.get_model_info("described", "1")["batch_size"] == 16
    with pytest.raises(ClipperException, match="containerless"):
        conn.set_num_replicas("described", 1)

    assert set(conn.inspect_instance()) >= {"counters", "meters", "histograms"}  # Clipper's /metrics sections
    assert conn.get_query_addr() == conn.cm.get_query_addr()
    assert conn.get_metric_addr() == conn.cm.get_query_addr()
    copied = conn.get_clipper_logs(str(tmp_path / "copied"))
    assert [p.rsplit("/", 1)[-1] for p in copied] == ["frontend.log", "requests.log"]

    conn.unlink_model_from_app("shapes", "mlp")
    assert conn.get_linked_models("shapes") == []
    conn.delete_application("shapes")
    assert "shapes" not in conn.get_all_apps()


def test_stopping_versions_and_the_rest_of_clippers_docker_free_methods(conn):
    conn.register_model("mlp", "2", "floats")
    conn.register_model("mlp", "3", "floats")  # current: 3
    conn.stop_versioned_models({"mlp": ["1"]})  # an inactive version: deleted
    assert sorted(conn.get_all_models()) == ["mlp:2", "mlp:3"]
    # stop_models deletes every version; here the active one is refused (it serves the linked apps' queries),
    # before anything is deleted (mlp:2 went first, then the refusal came)
    with pytest.raises(ClipperException, match=r"mlp:3 is the active version.*nothing was stopped"):
        conn.stop_models(["mlp"])
    assert sorted(conn.get_all_models()) == ["mlp:2", "mlp:3"]
    with pytest.raises(ClipperException, match="mlp:3 is the active version"):
        conn.stop_versioned_models({"mlp": ["2", "3"]})
    assert sorted(conn.get_all_models()) == ["mlp:2", "mlp:3"]
    conn.stop_inactive_model_versions(["mlp"])
    assert conn.get_all_models() == ["mlp:3"]

    conn.register_application("gone", "floats", "-1", 100000)
    conn.unregister_application("gone")  # delete_application's older name
    assert conn.get_all_apps() == []

    # Clipper's local check of a predict function (cloudpickle >= 2 round trip; no server involved)
    checked = conn.test_predict_function({"input": [1.0, 2.0]}, lambda xs: [str(sum(x)) for x in xs], "doubles")
    assert checked == ["3.0"]


def test_a_wrong_token_or_no_server_is_a_clear_clipper_exception(api):
    with pytest.raises(ClipperException, match="refused the token"):
        ClipperConnection(ServerlessContainerManager(api, token="wrong")).connect()
    with pytest.raises(ClipperException, match="is `make run` up"):
        ClipperConnection(ServerlessContainerManager(f"http://127.0.0.1:{free_port()}", token=TOKEN)).connect()
    manager = ServerlessContainerManager(api, token=TOKEN)
    conn = ClipperConnection(manager)
    conn.connect()
    with pytest.raises(ClipperException, match="make run"):
        conn.start_clipper()
    with pytest.raises(ClipperException, match="ONNX files"):
        manager.deploy_model("m", "1", "floats", "image")
