"""``set_model_batching`` through the admin function's own graph (functions/admin/app.py: the registry in
DynamoDB, the real ``CloudFormationModelStacks``) onto model stacks (infra/model-stack.yaml) created in moto's
CloudFormation: the stack of a version with a Lambda batcher is updated, and with it its SQS event source
mapping's BatchSize and MaximumBatchingWindowInSeconds; a version without one is left as it is; what the mapping
cannot take is listed in the answer.

Each stack is updated once here. moto (5.2) cannot update this template's stack twice with changed parameters: it
describes an updated stack's CommaDelimitedList parameters as Python lists ("['']"), so the adapter gives them back
changed, and moto then "modifies" the SageMaker resources that are under a false condition (AttributeError). The
first update applies the mapping's change, then fails with the ValidationError that the adapter retries once.
AWS has neither behaviour."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from clipper.adapters.cloudformation_stacks import CloudFormationModelStacks
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.core.domain import InputType, ModelVersion
from clipper.models.serving import ModelArtifact
from infra.local import cfn
from tests.iac.conftest import IGNORE_MOTO_SKIPS, MODEL_TEMPLATE, REPO_ROOT

pytestmark = [pytest.mark.iac, IGNORE_MOTO_SKIPS]

STACK = "clipper"
TOKEN = "s3cret"
WIDE = {"BatchSize": "25", "MaximumBatchingWindowInSeconds": "1"}  # a mapping set up by hand


@pytest.fixture(scope="module")
def service(session: Any) -> dict[str, str]:
    return cfn.deploy_service(session, STACK, REPO_ROOT, {"StageName": "prod"})


@pytest.fixture
def admin(session: Any, service: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """The admin function's app as its handler builds it, with the model stacks of the service stack: every
    version's stack gets a Lambda batcher (CLIPPER_MODEL_STACK_PARAMETERS)."""
    shared = {"LambdaBatcher": "true", "BatcherFunctionArn": service["BatcherFunctionArn"]}
    env = {
        "CLIPPER_REGISTRY_TABLE": service["RegistryTableName"],
        "CLIPPER_REPLIES_TABLE": service["RepliesTableName"],
        "CLIPPER_ADMIN_TOKEN": TOKEN,
        "CLIPPER_SERVICE_STACK_NAME": STACK,
        "CLIPPER_MODEL_STACK_TEMPLATE": "",  # as deployed: the template packaged with the shared layer
        "CLIPPER_MODEL_STACK_PARAMETERS": json.dumps(shared),
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    sys.modules.pop("functions.admin.app", None)
    import functions.admin.app as module

    client = TestClient(module.app)
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    try:
        yield client
    finally:
        sys.modules.pop("functions.admin.app", None)


def test_set_model_batching_updates_the_lambda_batchers_event_source_mapping(
    session: Any, service: dict[str, str], admin: TestClient
) -> None:
    cloudformation, lambda_client = session.client("cloudformation"), session.client("lambda")
    template = MODEL_TEMPLATE.read_text(encoding="utf-8")
    lambda_batcher = {"LambdaBatcher": "true", "BatcherFunctionArn": service["BatcherFunctionArn"]}
    with_lambda = CloudFormationModelStacks(cloudformation, STACK, template, lambda_batcher)
    registry = DynamoDBRegistry(session.client("dynamodb"), service["RegistryTableName"])

    def deploy(model: str, version: str, stacks: CloudFormationModelStacks | None) -> str:
        """A version served by a stack (None: by an HTTP server, no stack); returns its stack's name."""
        queue, endpoint = "https://sqs.local/q", "http://127.0.0.1:1"
        if stacks is not None:
            artifact = ModelArtifact(f"s3://bucket/models/{model}/{version}/model.onnx")
            served = stacks.create(model, version, artifact, replicas=1)
            queue, endpoint = served.queue_url, served.endpoint
        registry.put_version(ModelVersion(model, version, InputType.FLOATS, queue, endpoint), activate=version == "1")
        return with_lambda.stack_name(model, version)

    def mapping(stack: str) -> list[tuple[int, int, dict[str, int]]]:
        queue_arn = outputs(cloudformation, stack)["QueueArn"]
        found = lambda_client.list_event_source_mappings(EventSourceArn=queue_arn)["EventSourceMappings"]
        return [(m["BatchSize"], m["MaximumBatchingWindowInSeconds"], m["ScalingConfig"]) for m in found]

    # cnn:1 has a Lambda batcher, cnn:2 none (a long-poll batcher reads its queue), cnn:3 no stack at all
    cnn1 = deploy("cnn", "1", with_lambda)
    cnn2 = deploy("cnn", "2", CloudFormationModelStacks(cloudformation, STACK, template))
    deploy("cnn", "3", None)
    created = parameters(cloudformation, cnn1)
    assert mapping(cnn1) == [(10, 0, {"MaximumConcurrency": 2})] and mapping(cnn2) == []  # the template's defaults

    fixed = {"model_name": "cnn", "controller": "fixed", "batch_size": 32, "batch_wait_ms": 1000}
    done = ok(admin.post("/admin/set_model_batching", json=fixed))
    lam = done["lambda_batcher"]
    assert (lam["versions"], lam["BatchSize"], lam["MaximumBatchingWindowInSeconds"]) == (["1"], 32, 1)
    assert lam["not_applied"] == [] and done["versions_without_lambda_batcher"] == ["2", "3"]
    assert status(cloudformation, cnn1) == "UPDATE_COMPLETE"
    assert parameters(cloudformation, cnn1) == {**created, "BatchSize": "32", "MaximumBatchingWindowInSeconds": "1"}
    assert mapping(cnn1) == [(32, 1, {"MaximumConcurrency": 2})]
    assert status(cloudformation, cnn2) == "CREATE_COMPLETE" and mapping(cnn2) == []

    # what a mapping cannot take: an adaptive controller, a wait under a second (its window is whole seconds)
    rnn1 = deploy("rnn", "1", CloudFormationModelStacks(cloudformation, STACK, template, {**lambda_batcher, **WIDE}))
    created = parameters(cloudformation, rnn1)
    assert mapping(rnn1) == [(25, 1, {"MaximumConcurrency": 2})]
    adaptive = {"model_name": "rnn", "controller": "quantile", "max_batch_size": 64, "batch_wait_ms": 2}
    done = ok(admin.post("/admin/set_model_batching", json=adaptive))
    lam = done["lambda_batcher"]
    assert (lam["versions"], lam["BatchSize"], lam["MaximumBatchingWindowInSeconds"]) == (["1"], 10, 0)
    assert [n.split(":")[0] for n in lam["not_applied"]] == ["controller quantile", "batch_wait_ms"]
    assert parameters(cloudformation, rnn1) == {**created, "BatchSize": "10", "MaximumBatchingWindowInSeconds": "0"}
    assert mapping(rnn1) == [(10, 0, {"MaximumConcurrency": 2})]
    stored = ok(admin.post("/admin/get_model_batching", json={"model_name": "rnn"}))["batching"]
    assert (stored["controller"], stored["max_batch_size"], stored["batch_wait_ms"]) == ("quantile", 64, 2)


def ok(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def describe(cloudformation: Any, stack: str) -> dict[str, Any]:
    described: dict[str, Any] = cloudformation.describe_stacks(StackName=stack)["Stacks"][0]
    return described


def status(cloudformation: Any, stack: str) -> str:
    return str(describe(cloudformation, stack)["StackStatus"])


# moto describes an updated stack's CommaDelimitedList parameters as Python lists ("['']" for ""), AWS as given
MOTO_RENDERS_AS_LISTS = {"VpcSubnetIds", "VpcSecurityGroupIds"}


def parameters(cloudformation: Any, stack: str) -> dict[str, str]:
    """The stack's parameters, but for the list ones."""
    described = describe(cloudformation, stack)["Parameters"]
    return {p["ParameterKey"]: p["ParameterValue"] for p in described if p["ParameterKey"] not in MOTO_RENDERS_AS_LISTS}


def outputs(cloudformation: Any, stack: str) -> dict[str, str]:
    return {o["OutputKey"]: o["OutputValue"] for o in describe(cloudformation, stack).get("Outputs", [])}
