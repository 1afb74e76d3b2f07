"""The functions' roles allow the DynamoDB calls their code makes. moto checks no IAM, so a call the role does not
grant passes every other test and fails on AWS only (AccessDenied, a 5xx for the operator). Here each function's
own graph (its ``functions/<name>/app.py``, imported with the stack's table names) runs a round of its operations
over the service stack deployed in moto, every DynamoDB request is recorded, and each action it needs is looked
up in the function role's statements of the translated template. A transaction needs the permission of each of
its items' actions (Put: PutItem, Update: UpdateItem, Delete: DeleteItem, ConditionCheck: ConditionCheckItem)."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.client
import numpy as np
import pytest
from fastapi.testclient import TestClient

from infra.local import cfn
from tests.iac.conftest import IGNORE_MOTO_SKIPS, REPO_ROOT, SERVICE_TEMPLATE
from tests.iac.test_translate import role_statements

pytestmark = [pytest.mark.iac, IGNORE_MOTO_SKIPS]

STACK = "perms"
SQS_BATCH_ACTIONS = {
    "SendMessageBatch": "SendMessage",
    "DeleteMessageBatch": "DeleteMessage",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
}
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
    if "QueueUrl" in params:  # SQS: a batch call needs the single call's action
        return [(params["QueueUrl"], f"sqs:{SQS_BATCH_ACTIONS.get(operation, operation)}")]
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


def test_the_admin_reads_of_the_selection_table_keep_to_its_leading_keys(
    admin: TestClient, tables: dict[str, str], translated: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin role reads the selection table only under the partition keys its condition names (the feedback
    log's, the bandit states'): a read of another key is AccessDenied on AWS, which moto does not check."""
    import fnmatch

    selection = next(physical for physical, logical in tables.items() if logical == "SelectionTable")
    keys: list[str] = []
    real = botocore.client.BaseClient._make_api_call

    def recording(self: Any, operation: str, params: dict[str, Any]) -> Any:
        if params.get("TableName") == selection:
            if "Key" in params:
                keys.append(params["Key"]["pk"]["S"])
            elif operation == "Query":  # its partition key's placeholder
                (placeholder,) = re.findall(r"\bpk\s*=\s*(:\w+)", params["KeyConditionExpression"])
                keys.append(params["ExpressionAttributeValues"][placeholder]["S"])
            else:
                raise AssertionError(f"{operation} on the selection table: which keys it reads is not known")
        return real(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
    app = {"name": "sel", "input_type": "floats", "default_output": "0", "latency_slo_micros": 100_000}
    assert admin.post("/admin/add_app", json=app).status_code == 200
    assert admin.post("/admin/set_app_policy", json={"name": "sel", "policy": "exp3"}).status_code == 200
    for uid in (None, "7"):
        got = admin.get("/admin/apps/sel/selection", params={} if uid is None else {"uid": uid})
        assert got.status_code == 200, got.text
    assert admin.get("/admin/apps/sel/report").status_code == 200
    admin.post("/admin/delete_app", json={"name": "sel"})

    statement = next(
        st
        for st in role_statements(translated, "AdminFunction")
        if st.get("Resource") == {"Fn::GetAtt": ["SelectionTable", "Arn"]}
    )
    patterns = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert {"app/sel", "app/sel/user/7"} <= set(keys)
    assert [k for k in keys if not any(fnmatch.fnmatchcase(k, p) for p in patterns)] == []


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
    # an upload gone before it is read is NotFound (skipped) only where S3 may say 404: without s3:ListBucket on
    # the bucket it answers 403, which reads as an outage (moto checks no IAM, so the grant is checked here)
    assert ("ModelBucket", "s3:ListBucket") in granted(translated, "ModelUpdaterFunctionRole")
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


# -- the query path: frontend, batcher (the Lambda driver) and feedback, on the AWS path (no Redis) --------------

OWNER: list[str] = []  # the function whose module is being imported: the clients it makes are its own


@pytest.fixture
def owned_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[str, str, dict[str, Any]]]]:
    """Every DynamoDB and SQS request, by the function whose module made the client: {function: [(resource,
    action, params)]}. A client is its maker's (the module import's), whichever thread uses it."""
    import botocore.session

    calls: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    create, real = botocore.session.Session.create_client, botocore.client.BaseClient._make_api_call

    def creating(self: Any, *args: Any, **kwargs: Any) -> Any:
        client = create(self, *args, **kwargs)
        client._clipper_owner = OWNER[-1] if OWNER else "test"
        return client

    def recording(self: Any, operation: str, params: dict[str, Any]) -> Any:
        if self.meta.service_model.service_name in ("dynamodb", "sqs"):
            owner = getattr(self, "_clipper_owner", "test")
            calls.setdefault(owner, []).extend((r, a, params) for r, a in needed(operation, params))
        return real(self, operation, params)

    monkeypatch.setattr(botocore.session.Session, "create_client", creating)
    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
    return calls


def granted_on_model_queues(template: dict[str, Any], role: str) -> set[str]:
    """The actions the role allows on the model stacks' queues (``<stack>-model-*``, named by a pattern)."""
    out: set[str] = set()
    for policy in template["Resources"][role]["Properties"].get("Policies", []):
        for statement in policy["PolicyDocument"]["Statement"]:
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            for resource in resources:
                sub = resource.get("Fn::Sub") if isinstance(resource, dict) else None
                if (
                    statement.get("Effect") == "Allow"
                    and isinstance(sub, str)
                    and sub.endswith(":sqs:${AWS::Region}:${AWS::AccountId}:${AWS::StackName}-model-*")
                ):
                    out |= set(actions)
    return out


def attribute_condition(template: dict[str, Any], role: str, action: str, logical: str) -> set[str] | None:
    """The attributes a ``ForAllValues:StringEquals dynamodb:Attributes`` condition limits ``action`` on the
    table to, where the role's only grant of it is such a statement (None: granted without a condition)."""
    limits: list[set[str]] = []
    for policy in template["Resources"][role]["Properties"].get("Policies", []):
        for statement in policy["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resource = statement["Resource"]
            if action not in actions or not (
                isinstance(resource, dict) and resource.get("Fn::GetAtt", [""])[0] == logical
            ):
                continue
            condition = statement.get("Condition", {}).get("ForAllValues:StringEquals", {}).get("dynamodb:Attributes")
            if condition is None:
                return None
            limits.append(set(condition))
    return set().union(*limits) if limits else None


_NOT_ATTRIBUTES = {
    "SET",
    "ADD",
    "REMOVE",
    "DELETE",
    "if_not_exists",
    "list_append",
    "attribute_not_exists",
    "attribute_exists",
    "AND",
    "OR",
    "NOT",
    "size",
}


def attributes_named(params: dict[str, Any]) -> set[str]:
    """The top-level attributes an UpdateItem request names (its key, its update and condition expressions)."""
    import re

    names = set(params.get("Key", {}))
    aliases = params.get("ExpressionAttributeNames", {})
    for expression in (params.get("UpdateExpression", ""), params.get("ConditionExpression", "")):
        for token in re.findall(r"(?<![:\w])#?[A-Za-z_][\w]*", expression):
            if token in _NOT_ATTRIBUTES:
                continue
            names.add(aliases.get(token, token) if token.startswith("#") else token)
    return names


def lambda_context(name: str) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(
        function_name=name,
        memory_limit_in_mb=512,
        invoked_function_arn=f"arn:aws:lambda:us-east-1:123456789012:function:{name}",
        aws_request_id="perms",
    )


def sqs_event(sqs: Any, queue_url: str, arn: str, wait_s: float) -> list[dict[str, Any]]:
    """Messages of ``queue_url`` as an SQS event source mapping hands them to a function."""
    got = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0, AttributeNames=["All"]
    ).get("Messages", [])
    if not got:
        time.sleep(wait_s)
    return [
        {
            "messageId": m["MessageId"],
            "receiptHandle": m["ReceiptHandle"],
            "body": m["Body"],
            "attributes": m.get("Attributes", {}),
            "messageAttributes": {},
            "eventSource": "aws:sqs",
            "eventSourceARN": arn,
        }
        for m in got
    ]


def redelivered_answer(
    client: TestClient, sqs: Any, queue_url: str, endpoint: str, row: list[float], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """A query answered by the SageMaker container's batcher (``clipper.entrypoints.batcher``, its clients made
    as the "sagemaker" function's) from a second delivery of its message: the batcher looks up whether it was
    answered before computing it."""
    from clipper.entrypoints import batcher as container
    from clipper.settings import BatcherSettings

    monkeypatch.setenv("CLIPPER_CLOUDWATCH_METRICS", "false")
    answer: dict[str, Any] = {}
    asking = threading.Thread(target=lambda: answer.update(client.post("/qs/predict", json={"input": row}).json()))
    asking.start()
    for _ in range(100):  # a first delivery nobody handles: visible again at once
        if sqs.receive_message(QueueUrl=queue_url, VisibilityTimeout=0, WaitTimeSeconds=0).get("Messages"):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the query never reached its queue")
    OWNER.append("sagemaker")
    try:
        argv = ["--queue-url", queue_url, "--endpoint-url", endpoint, "--model", "qs", "--version", "1"]
        args = container.parse_args([*argv, "--poll-wait-s", "0.2", "--slo-ms", "1000"])
        settings = BatcherSettings()  # type: ignore[call-arg]
        source = container.config_source(args, settings)
        driver = container.build_driver(args, settings, None, source.load() if source is not None else None)
    finally:
        OWNER.pop()
    stop = threading.Event()
    running = threading.Thread(target=driver.run, args=(stop,), daemon=True)
    running.start()
    asking.join(timeout=15)
    stop.set()
    running.join(timeout=15)
    return answer


def test_the_query_paths_roles_allow_every_call_of_queries_their_feedback_and_a_canary(
    session: Any,
    service: dict[str, str],
    demo_models: dict[str, Any],
    owned_calls: dict[str, list[tuple[str, str, dict[str, Any]]]],
    tables: dict[str, str],
    translated: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The frontend (queries and feedback accepted), the Lambda batcher (the batches of the model queue, the
    endpoint a real ONNX Runtime server) and the feedback function (the feedback applied to an Exp3 state and a
    canary's evidence), each from its own ``functions/<name>/app.py`` on the AWS path (DynamoDB cache and replies,
    SQS queues, no Redis): every DynamoDB and SQS request each makes is one its role grants."""
    from clipper.adapters.dynamodb_registry import DynamoDBRegistry
    from clipper.core.domain import Application, CanaryParams, InputType, ModelVersion
    from tests.services import start_endpoint, stop

    sqs = session.client("sqs")
    queue_url = sqs.create_queue(QueueName=f"{STACK}-model-qm-1")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    feedback_arn = sqs.get_queue_attributes(QueueUrl=service["FeedbackQueueUrl"], AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    (mlp_entry,) = [m for m in demo_models["models"] if m["name"] == "mlp"]
    endpoint, url = start_endpoint(str(Path(demo_models["out_dir"]) / mlp_entry["path"]))
    registry = DynamoDBRegistry(session.client("dynamodb"), service["RegistryTableName"])
    registry.put_app(Application("q", InputType.FLOATS, "-1", 10_000_000, (64,), policy="exp3", incarnation=7))
    for version in ("1", "2"):
        registry.put_version(ModelVersion("qm", version, InputType.FLOATS, queue_url, url, (64,)), version == "1")
    registry.link("q", "qm")
    registry.start_canary("qm", "2", 0.5, 0.0, CanaryParams())
    # "qs": served by a SageMaker endpoint's own batcher (the container's long-poll batcher); "qf": nobody reads
    # its queue, so its queries time out and the frontend releases their claims with the cause
    other = {}
    for name, slo in (("qs", 10_000_000), ("qf", 300_000)):
        other[name] = sqs.create_queue(QueueName=f"{STACK}-model-{name}-1")["QueueUrl"]
        registry.put_app(Application(name, InputType.FLOATS, "-1", slo, (64,), incarnation=8))
        registry.put_version(ModelVersion(name, "1", InputType.FLOATS, other[name], url, (64,)), True)
        registry.link(name, name)
    monkeypatch.delenv("REDIS_URL", raising=False)  # the AWS path: DynamoDB cache and replies

    env = stack_env(service)
    frontend_env = {**env, "CLIPPER_FEEDBACK_QUEUE_URL": service["FeedbackQueueUrl"]}
    modules: dict[str, Any] = {}
    try:
        for name, function_env in (("frontend", frontend_env), ("batcher", env), ("feedback", env)):
            OWNER.append(name)
            try:
                modules[name] = function_module(name, function_env, monkeypatch)
            finally:
                OWNER.pop()
        done = threading.Event()

        def event_source_mapping() -> None:  # the batcher's: each batch of the queue, failures left for a retry
            while not done.is_set():
                records = sqs_event(sqs, queue_url, queue_arn, 0.02)
                if records:
                    failed = {
                        f["itemIdentifier"]
                        for f in modules["batcher"]._handle({"Records": records}, None)["batchItemFailures"]
                    }
                    for r in records:
                        if r["messageId"] not in failed:
                            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=r["receiptHandle"])

        mapping = threading.Thread(target=event_source_mapping, daemon=True)
        mapping.start()
        client = TestClient(modules["frontend"].app)
        rng = np.random.default_rng(5)
        inputs = [rng.integers(0, 16, 64).astype(float).tolist() for _ in range(12)]
        answers = []
        for i, row in enumerate(inputs):
            resp = client.post("/q/predict", json={"input": row})
            assert resp.status_code == 200, resp.text
            answers.append(resp.json())
            if i in (0, 5):
                time.sleep(1.3)  # the canary tally learns the trial, then flushes its counts (each second)
        time.sleep(1.3)
        done.set()
        mapping.join(timeout=10)
        assert not [a for a in answers if a["default"]], answers
        timed_out = client.post("/qf/predict", json={"input": inputs[0]}).json()
        assert timed_out["default"] and "timeout" in timed_out["default_explanation"], timed_out
        assert redelivered_answer(client, sqs, other["qs"], url, inputs[1], monkeypatch)["default"] is False
        for row, answer in zip(inputs, answers, strict=True):
            resp = client.post("/q/update", json={"input": row, "label": answer["output"]})
            assert resp.status_code == 200, resp.text
        # the feedback function gets what the frontend sent (moto's own mapping of the stack's feedback queue
        # would take the messages first, to a Lambda it cannot run)
        sent = [p for r, a, p in owned_calls["frontend"] if r == service["FeedbackQueueUrl"] and a == "sqs:SendMessage"]
        assert len(sent) == len(inputs)
        records = [
            {
                "messageId": f"m{i}",
                "receiptHandle": f"r{i}",
                "body": p["MessageBody"],
                "attributes": {"ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "eventSource": "aws:sqs",
                "eventSourceARN": feedback_arn,
            }
            for i, p in enumerate(sent)
        ]
        for first in range(0, len(records), 10):  # the mapping's batch size
            result = modules["feedback"].handler({"Records": records[first : first + 10]}, lambda_context("feedback"))
            assert result["batchItemFailures"] == [], result
    finally:
        tally = modules["frontend"].processor.tally if "frontend" in modules else None
        if tally is not None:
            tally.stop()  # its thread would go on reading the registry after moto's mock has ended
        for name in modules:
            sys.modules.pop(f"functions.{name}.app", None)
        stop(endpoint)

    roles = {
        "frontend": "FrontendFunctionRole",
        "batcher": "BatcherFunctionRole",
        "feedback": "FeedbackFunctionRole",
        "sagemaker": "SageMakerExecutionRole",
    }
    used = {name: {(tables.get(r, r), a) for r, a, _ in owned_calls.get(name, [])} for name in roles}
    # the test reaches the work each role exists for (a call no longer made would make the check below vacuous)
    # the test reaches the work each role exists for (a call no longer made would leave the check below vacuous)
    assert {
        ("CacheTable", "dynamodb:BatchGetItem"),  # the cache's lookup
        ("RepliesTable", "dynamodb:Query"),  # the replies awaited
        ("RegistryTable", "dynamodb:UpdateItem"),  # the canary's evidence counted
        ("FeedbackQueue", "sqs:SendMessage"),  # feedback accepted
        ("CacheTable", "dynamodb:UpdateItem"),  # a timed-out query's claims released with the cause
    } <= used["frontend"], used["frontend"]
    assert ("RepliesTable", "dynamodb:BatchGetItem") in used["sagemaker"], "the redelivery was not looked up"
    assert {("CacheTable", "dynamodb:BatchWriteItem"), ("RepliesTable", "dynamodb:PutItem")} <= used["batcher"]
    assert {("SelectionTable", "dynamodb:PutItem"), ("RegistryTable", "dynamodb:UpdateItem")} <= used["feedback"]
    from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
    from clipper.selection.state import state_key

    state = DynamoDBSelectionStore(session.client("dynamodb"), service["SelectionTableName"]).load(state_key("q"))
    assert state is not None and state.updates == len(inputs), "not every feedback was applied"
    for name, role in roles.items():
        calls = [(r, a) for r, a, _ in owned_calls.get(name, [])]
        assert missing(calls, tables, translated, role) == [], name
        on_model_queues = {a for r, a in calls if r in (queue_url, *other.values())}
        assert on_model_queues <= granted_on_model_queues(translated, role), (name, on_model_queues)
        for resource, action, params in owned_calls.get(name, []):
            limit = attribute_condition(translated, role, action, tables.get(resource, ""))
            if limit is not None and action == "dynamodb:UpdateItem" and "Key" in params:
                assert attributes_named(params) <= limit, (name, params)
