"""A version that cannot serve an application linked to its model never comes to serve it: switching the active
version to it, rolling back to it, starting a canary on it and linking an application to a model whose canary
runs it are refused with a 400 naming the field, and nothing changes. Against the registry in moto, over HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.admin.api import create_admin_app
from clipper.admin.service import AdminService

pytestmark = pytest.mark.integration
TOKEN = "s3cret"


@pytest.fixture
def admin(aws) -> TestClient:
    client = TestClient(
        create_admin_app(AdminService(DynamoDBRegistry(aws.dynamodb, aws.registry_table)), "token", TOKEN)
    )
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    return client


def post(admin: TestClient, op: str, **body: Any) -> Any:
    return admin.post(f"/admin/{op}", json=body)


def add_model(admin: TestClient, model: str, version: str, input_type: str, shape: list[int], activate: bool) -> None:
    resp = post(
        admin,
        "add_model",
        model_name=model,
        model_version=version,
        input_type=input_type,
        input_shape=shape,
        activate=activate,
        queue_url=f"https://sqs.local/q-{model}-{version}",
        endpoint=f"http://127.0.0.1:9{version}00",
    )
    assert resp.status_code == 200, resp.text


def add_app(admin: TestClient, name: str) -> None:
    resp = post(
        admin,
        "add_app",
        name=name,
        input_type="floats",
        input_shape=[64],
        default_output="-1",
        latency_slo_micros=100_000,
    )
    assert resp.status_code == 200, resp.text


def active(admin: TestClient, model: str) -> str:
    return str(post(admin, "get_state").json()["models"][model]["active_version"])


def refused(resp: Any, field: str) -> bool:
    return resp.status_code == 400 and resp.json()["cause"].startswith(f"{field}:")


def test_a_version_of_another_input_is_never_made_to_serve_a_linked_application(admin):
    add_model(admin, "m", "1", "floats", [64], activate=True)
    add_model(admin, "m", "2", "strings", [], activate=False)  # no application linked yet: accepted
    add_model(admin, "m", "3", "floats", [32], activate=False)  # another shape
    add_app(admin, "digits")
    assert post(admin, "add_model_links", app_name="digits", model_names=["m"]).status_code == 200

    for version in ("2", "3"):
        resp = post(admin, "set_model_version", model_name="m", model_version=version)
        assert refused(resp, "model_version"), resp.text
        assert f"m:{version}" in resp.json()["cause"]
        resp = post(admin, "start_canary", model_name="m", model_version=version, share_percent=10)
        assert refused(resp, "model_version"), resp.text
        assert post(admin, "get_canary", model_name="m").json()["canary"] is None
    assert active(admin, "m") == "1"


def test_a_rollback_to_a_version_that_cannot_serve_a_linked_application_is_refused(admin):
    add_model(admin, "m", "1", "strings", [], activate=True)  # active first, before the floats application
    add_model(admin, "m", "2", "floats", [64], activate=True)
    add_app(admin, "digits")
    assert post(admin, "add_model_links", app_name="digits", model_names=["m"]).status_code == 200
    resp = post(admin, "rollback_model", model_name="m")
    assert refused(resp, "model_name") and "m:1 takes strings" in resp.json()["cause"], resp.text
    assert active(admin, "m") == "2"


def test_an_application_is_not_linked_to_a_model_whose_canary_could_not_serve_it(admin):
    add_model(admin, "m", "1", "floats", [64], activate=True)
    add_model(admin, "m", "2", "floats", [32], activate=False)
    assert post(admin, "start_canary", model_name="m", model_version="2", share_percent=10).status_code == 200
    add_app(admin, "digits")
    resp = post(admin, "add_model_links", app_name="digits", model_names=["m"])
    assert refused(resp, "model_names") and "m:2 has [32]" in resp.json()["cause"], resp.text
    assert post(admin, "get_linked_models", app_name="digits").json() == []
