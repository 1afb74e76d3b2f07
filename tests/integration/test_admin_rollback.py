"""Rollback walks back through the version history (3 -> 2 -> 1), whoever made each version active (the admin
API or the updater's auto-promotion), and it is a conditional write: when the active version changes between its
read and its write, it is refused with 409 and changes nothing. Against the registry in moto, over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.admin.api import create_admin_app
from clipper.admin.service import AdminService
from clipper.models.history import VersionHistory
from clipper.models.updater import ServingDefaults, build_model_updater
from tests.fakes import InMemoryServingStacks, digits_app

pytestmark = pytest.mark.integration
TOKEN = "s3cret"


def client_for(service: AdminService) -> TestClient:
    client = TestClient(create_admin_app(service, "token", TOKEN))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    return client


@pytest.fixture
def registry(aws) -> DynamoDBRegistry:
    return DynamoDBRegistry(aws.dynamodb, aws.registry_table)


@pytest.fixture
def admin(registry) -> TestClient:
    return client_for(AdminService(registry))


def add(admin: TestClient, version: str, activate: bool = True) -> None:
    body = {"model_name": "mlp", "model_version": version, "input_type": "floats", "activate": activate}
    body |= {"queue_url": f"https://sqs.local/q-mlp-{version}", "endpoint": f"http://127.0.0.1:900{version}"}
    resp = admin.post("/admin/add_model", json=body)
    assert resp.status_code == 200, resp.text


def rollback(admin: TestClient) -> Any:
    return admin.post("/admin/rollback_model", json={"model_name": "mlp"})


def active(admin: TestClient) -> str:
    resp = admin.post("/admin/get_state", json={})
    return str(resp.json()["models"]["mlp"]["active_version"])


def test_rollback_walks_back_through_the_versions_active_before(admin):
    for version in ("1", "2", "3"):
        add(admin, version)

    first, second = rollback(admin), rollback(admin)

    assert first.json() == {"model_name": "mlp", "active_version": "2", "previous_version": "3", "changed": True}
    assert second.json() == {"model_name": "mlp", "active_version": "1", "previous_version": "2", "changed": True}
    assert active(admin) == "1"
    third = rollback(admin)  # nothing before 1: refused, naming the field
    assert third.status_code == 400 and third.json()["cause"].startswith("model_name")
    assert active(admin) == "1"


def test_rollback_skips_versions_deleted_since(admin):
    for version in ("1", "2", "3"):
        add(admin, version)
    deleted = admin.post("/admin/delete_versioned_model", json={"model_name": "mlp", "model_version": "2"})
    assert deleted.status_code == 200

    assert rollback(admin).json()["active_version"] == "1"


def test_rollback_returns_through_auto_promoted_uploads(aws, admin, registry, demo_models):
    registry.put_app(digits_app())
    add(admin, "1")
    registry.link("digits", "mlp")
    admin.post("/admin/set_auto_promote", json={"model_name": "mlp", "auto_promote": True})
    stacks = InMemoryServingStacks()
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, stacks
    )
    data = (Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx").read_bytes()
    for version in ("2", "3"):
        key = f"models/mlp/{version}/model.onnx"
        put = aws.s3.put_object(Bucket=aws.bucket, Key=key, Body=data)
        assert updater.handle_object(aws.bucket, key, len(data), put["ETag"], put.get("VersionId")).promoted
    assert active(admin) == "3"

    assert [rollback(admin).json()["active_version"] for _ in range(2)] == ["2", "1"]


def test_a_model_item_of_the_older_layout_rolls_back_to_its_previous_version(aws, admin):
    add(admin, "1")
    add(admin, "2", activate=False)
    key = {"pk": {"S": "MODEL#mlp"}, "sk": {"S": "MODEL"}}  # as main wrote it: no history, no switches
    item = {**key, "active_version": {"S": "2"}, "previous_version": {"S": "1"}}
    aws.dynamodb.put_item(TableName=aws.registry_table, Item=item)

    assert rollback(admin).json()["active_version"] == "1"
    assert rollback(admin).status_code == 400


class RaceAfterRead(DynamoDBRegistry):
    """The registry, except that right after rollback reads the history, another writer (an auto-promotion, an
    operator) makes the versions ``switches`` active, one after the other."""

    def __init__(self, client: Any, table: str, switches: list[str]) -> None:
        super().__init__(client, table)
        self.switches = switches

    def version_history(self, model: str, missing_ok: bool = False) -> VersionHistory:
        seen = super().version_history(model, missing_ok)
        other = DynamoDBRegistry(self._client, self._table)
        while self.switches:
            other.set_active_version(model, self.switches.pop(0))
        return seen


# ["4"]: another version became active; ["2", "3"]: the active version changed and came back (A -> B -> A)
@pytest.mark.parametrize("switches", [["4"], ["2", "3"]])
def test_a_rollback_that_races_another_switch_is_refused_with_409_and_changes_nothing(aws, admin, switches):
    for version in ("1", "2", "3", "4"):
        add(admin, version, activate=version != "4")
    before = DynamoDBRegistry(aws.dynamodb, aws.registry_table).version_history("mlp")
    racing = client_for(AdminService(RaceAfterRead(aws.dynamodb, aws.registry_table, list(switches))))

    resp = rollback(racing)

    assert resp.status_code == 409, resp.text
    assert "changed meanwhile" in resp.json()["cause"]
    after = DynamoDBRegistry(aws.dynamodb, aws.registry_table).version_history("mlp")
    assert after.active == switches[-1] and after.switches == before.switches + len(switches)  # theirs only
