"""The functions' roles allow the DynamoDB calls their code makes. moto checks no IAM, so a call the role does not
grant passes every other test and fails on AWS only (AccessDenied, a 5xx for the operator). Here each function's
own graph (its ``functions/<name>/app.py``, imported with the stack's table names) runs a round of its operations
over the service stack deployed in moto, every DynamoDB request is recorded, and each action it needs is looked
up in the function role's statements of the translated template. A transaction needs the permission of each of
its items' actions (Put: PutItem, Update: UpdateItem, Delete: DeleteItem, ConditionCheck: ConditionCheckItem)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.client
import pytest
from fastapi.testclient import TestClient

from infra.local import cfn
from tests.iac.conftest import IGNORE_MOTO_SKIPS, REPO_ROOT, SERVICE_TEMPLATE

pytestmark = [pytest.mark.iac, IGNORE_MOTO_SKIPS]

STACK = "perms"
TOKEN = "s3cret"
TRANSACT_ITEM_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
    "Get": "GetItem",
}


@pytest.fixture(scope="module")
def service(session: Any) -> dict[str, str]:
    return cfn.deploy_service(session, STACK, REPO_ROOT, {"StageName": "prod"})


@pytest.fixture(scope="module")
def tables(session: Any, service: dict[str, str]) -> dict[str, str]:
    """{physical id: logical id} of the stack's tables (their names) and queues (their URLs)."""
    resources = cfn.stack_resources(session.client("cloudformation"), STACK)
    return {physical: logical for logical, physical in resources.items() if logical.endswith(("Table", "Queue"))}


@pytest.fixture(scope="module")
def translated() -> dict[str, Any]:
    return cfn.translate_sam(SERVICE_TEMPLATE)


def needed(operation: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    """(table name, IAM action) pairs one DynamoDB request needs."""
    if "QueueUrl" in params:  # SQS
        return [(params["QueueUrl"], f"sqs:{operation}")]
    if operation in ("TransactWriteItems", "TransactGetItems"):
        out = []
        for item in params["TransactItems"]:
            ((kind, body),) = item.items()
            out.append((body["TableName"], f"dynamodb:{TRANSACT_ITEM_ACTIONS[kind]}"))
        return out
    if operation in ("BatchWriteItem", "BatchGetItem"):
        return [(table, f"dynamodb:{operation}") for table in params["RequestItems"]]
    return [(params["TableName"], f"dynamodb:{operation}")] if "TableName" in params else []


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every (table, action) a DynamoDB request made while the test runs needs (whether it succeeded or not)."""
    calls: list[tuple[str, str]] = []
    real = botocore.client.BaseClient._make_api_call

    def recording(self: Any, operation: str, params: dict[str, Any]) -> Any:
        if self.meta.service_model.service_name in ("dynamodb", "sqs"):
            calls.extend(needed(operation, params))
        return real(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
    return calls


def granted(template: dict[str, Any], role: str) -> set[tuple[str, str]]:
    """(table logical id, action) pairs the role's inline statements allow (conditions aside)."""
    out = set()
    for policy in template["Resources"][role]["Properties"].get("Policies", []):
        for statement in policy["PolicyDocument"]["Statement"]:
            if statement.get("Effect") != "Allow":
                continue
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for resource in resources:
                if isinstance(resource, dict) and "Fn::GetAtt" in resource:
                    logical = resource["Fn::GetAtt"][0]
                    out |= {(logical, a) for a in actions}
    return out


def missing(
    calls: list[tuple[str, str]], tables: dict[str, str], template: dict[str, Any], role: str
) -> list[tuple[str, str]]:
    allowed = granted(template, role)
    # the stack's own tables and queues (a model version's queue is another stack's, named by a pattern)
    need = {(tables[resource], action) for resource, action in calls if resource in tables}
    return sorted(n for n in need if n not in allowed)


def function_module(name: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    sys.modules.pop(f"functions.{name}.app", None)
    module = __import__(f"functions.{name}.app", fromlist=["app"])
    return module


@pytest.fixture
def admin(service: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    env = {
        "CLIPPER_REGISTRY_TABLE": service["RegistryTableName"],
        "CLIPPER_REPLIES_TABLE": service["RepliesTableName"],
        "CLIPPER_SELECTION_TABLE": service["SelectionTableName"],
        "CLIPPER_CACHE_TABLE": service["CacheTableName"],
        "CLIPPER_ADMIN_TOKEN": TOKEN,
        "CLIPPER_SERVICE_STACK_NAME": "",
        "CLIPPER_FEEDBACK_QUEUE_URL": service["FeedbackQueueUrl"],
        "CLIPPER_FEEDBACK_DEAD_LETTER_QUEUE_URL": service["FeedbackDeadLetterQueueUrl"],
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    module = function_module("admin", env, monkeypatch)
    client = TestClient(module.app)
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    try:
        yield client
    finally:
        sys.modules.pop("functions.admin.app", None)


def test_the_admin_functions_role_allows_every_dynamodb_call_of_the_model_lifecycle(
    admin: TestClient, recorded: list[tuple[str, str]], tables: dict[str, str], translated: dict[str, Any]
) -> None:
    def post(op: str, body: dict[str, Any]) -> Any:
        resp = admin.post(f"/admin/{op}", json=body)
        assert resp.status_code == 200, (op, resp.text)
        return resp.json()

    serving = {"queue_url": "https://sqs.local/q", "endpoint": "http://127.0.0.1:1"}
    post("add_app", {"name": "a", "input_type": "floats", "default_output": "0", "latency_slo_micros": 100_000})
    post("set_app_policy", {"name": "a", "policy": "exp3"})
    for version in ("1", "2", "3"):
        post("add_model", {"model_name": "m", "model_version": version, "input_type": "floats", **serving})
    post("add_model_links", {"app_name": "a", "model_names": ["m"]})
    post("set_model_version", {"model_name": "m", "model_version": "2"})
    post("rollback_model", {"model_name": "m"})
    post("start_canary", {"model_name": "m", "model_version": "2", "share_percent": 10})
    post("get_canary", {"model_name": "m"})
    post("abort_canary", {"model_name": "m"})
    post("start_canary", {"model_name": "m", "model_version": "2", "share_percent": 10})
    post("promote_canary", {"model_name": "m"})
    post("set_model_batching", {"model_name": "m", "controller": "fixed", "batch_size": 8})
    post("delete_versioned_model", {"model_name": "m", "model_version": "1"})
    post("stop_inactive_model_versions", {"model_name": "m"})
    state = post("get_state", {})
    assert set(state["feedback"]) == {"queue", "dead_letter"}
    post("delete_model_links", {"app_name": "a", "model_names": ["m"]})
    post("delete_app", {"name": "a"})
    assert recorded, "no DynamoDB call was recorded"
    used = {(tables.get(t, t), a) for t, a in recorded}
    assert ("RegistryTable", "dynamodb:ConditionCheckItem") in used
    assert {("FeedbackQueue", "sqs:GetQueueAttributes"), ("FeedbackDeadLetterQueue", "sqs:GetQueueAttributes")} <= used
    assert missing(recorded, tables, translated, "AdminFunctionRole") == []


def test_a_missing_grant_is_found(tables: dict[str, str], translated: dict[str, Any]) -> None:
    registry = next(physical for physical, logical in tables.items() if logical == "RegistryTable")
    calls = [(registry, "dynamodb:GetItem"), (registry, "dynamodb:CreateTable")]
    assert missing(calls, tables, translated, "AdminFunctionRole") == [("RegistryTable", "dynamodb:CreateTable")]


def stack_env(service: dict[str, str]) -> dict[str, str]:
    """The table and bucket names the template gives every function (Globals), and quiet logs."""
    return {
        "CLIPPER_REGISTRY_TABLE": service["RegistryTableName"],
        "CLIPPER_REPLIES_TABLE": service["RepliesTableName"],
        "CLIPPER_SELECTION_TABLE": service["SelectionTableName"],
        "CLIPPER_CACHE_TABLE": service["CacheTableName"],
        "CLIPPER_MODEL_BUCKET": service["ModelBucketName"],
        "POWERTOOLS_LOG_LEVEL": "WARNING",
        "POWERTOOLS_METRICS_NAMESPACE": "Clipper",
    }


def test_the_model_updaters_role_allows_every_dynamodb_call_of_a_registration(
    session: Any,
    service: dict[str, str],
    demo_models: dict[str, Any],
    recorded: list[tuple[str, str]],
    tables: dict[str, str],
    translated: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {
        **stack_env(service),
        "CLIPPER_SERVICE_STACK_NAME": "",
        "CLIPPER_DEFAULT_QUEUE_URL": "https://sqs.local/q-{model}",
        "CLIPPER_DEFAULT_ENDPOINT": "http://127.0.0.1:1/{model}",
    }
    module = function_module("model_updater", env, monkeypatch)
    s3, bucket = session.client("s3"), service["ModelBucketName"]
    (mlp_entry,) = [m for m in demo_models["models"] if m["name"] == "mlp"]
    mlp = (Path(demo_models["out_dir"]) / mlp_entry["path"]).read_bytes()

    def upload(version: str, data: bytes) -> dict[str, Any]:
        key = f"models/u/{version}/model.onnx"
        put = s3.put_object(Bucket=bucket, Key=key, Body=data)
        record = {
            "eventSource": "aws:s3",
            "eventName": "ObjectCreated:Put",
            "s3": {"bucket": {"name": bucket}, "object": {"key": key, "size": len(data), "eTag": put["ETag"]}},
        }
        result: dict[str, Any] = module.handle_event(module.updater, {"Records": [record]}, bucket)
        return result

    try:
        statuses = [upload(v, data)["outcomes"][0] for v, data in (("1", mlp), ("2", b"x"), ("2", mlp))]
    finally:
        sys.modules.pop("functions.model_updater.app", None)
    assert [u["status"] for u in statuses] == ["registered", "rejected", "rejected"], statuses
    assert {a for _, a in recorded} >= {"dynamodb:PutItem", "dynamodb:Query"}
    assert missing(recorded, tables, translated, "ModelUpdaterFunctionRole") == []


def test_the_canary_reviewers_role_allows_every_dynamodb_call_of_a_round(
    session: Any,
    service: dict[str, str],
    recorded: list[tuple[str, str]],
    tables: dict[str, str],
    translated: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from clipper.adapters.dynamodb_canary import DynamoDBCanaryEvidence
    from clipper.adapters.dynamodb_registry import DynamoDBRegistry
    from clipper.canary.evidence import VersionEvidence
    from clipper.core.domain import CanaryParams, InputType, ModelVersion

    dynamodb, table = session.client("dynamodb"), service["RegistryTableName"]
    registry = DynamoDBRegistry(dynamodb, table)
    for version in ("1", "2"):
        registry.put_version(ModelVersion("c", version, InputType.FLOATS, "https://q", "http://e"), version == "1")
    # a canary failing half its queries beside an active version failing none: the error guard rolls it back
    canary = registry.start_canary("c", "2", 0.1, 0.0, CanaryParams())
    evidence = DynamoDBCanaryEvidence(dynamodb, table)
    evidence.add("c", canary.trial, "1", VersionEvidence(queries=100))
    evidence.add("c", canary.trial, "2", VersionEvidence(queries=100, errors=50))
    recorded.clear()
    module = function_module("canary_review", stack_env(service), monkeypatch)
    try:
        module.reviewer.review_all()  # the handler's work
    finally:
        sys.modules.pop("functions.canary_review.app", None)
    assert registry.running_canary("c") is None, "the round decided nothing: the test reaches no decision's writes"
    assert missing(recorded, tables, translated, "CanaryReviewFunctionRole") == []
