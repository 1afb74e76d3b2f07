"""The translated template and the model stack deploy to moto's CloudFormation and build what they declare."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.local import cfn
from tests.iac.conftest import IGNORE_MOTO_SKIPS, REPO_ROOT

pytestmark = [pytest.mark.iac, IGNORE_MOTO_SKIPS]

STACK = "clipper"
ECR_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/clipper-onnx-runtime:latest"
SAGEMAKER_ROLE = "arn:aws:iam::123456789012:role/clipper-sagemaker"


@pytest.fixture(scope="module")
def service(session: Any) -> dict[str, str]:
    return cfn.deploy_service(session, STACK, REPO_ROOT, {"StageName": "prod", "LogLevel": "DEBUG"})


@pytest.fixture(scope="module")
def model_stacks(session: Any, service: dict[str, str]) -> dict[str, dict[str, str]]:
    client = session.client("cloudformation")
    return {
        "logreg": cfn.deploy_model_stack(client, STACK, "logreg"),
        "mlp": cfn.deploy_model_stack(client, STACK, "mlp", {"MaxReceiveCount": "3"}),
        "forest": cfn.deploy_model_stack(
            client,
            STACK,
            "forest",
            {
                "LambdaBatcher": "true",
                "BatcherFunctionArn": service["BatcherFunctionArn"],
                "BatchSize": "25",
                "MaximumBatchingWindowInSeconds": "1",
            },
        ),
    }


def test_service_stack_is_complete_with_all_outputs(session: Any, service: dict[str, str]) -> None:
    (stack,) = session.client("cloudformation").describe_stacks(StackName=STACK)["Stacks"]

    assert stack["StackStatus"] == "CREATE_COMPLETE"
    assert set(service) == {
        "ApiUrl",
        "RegistryTableName",
        "RepliesTableName",
        "CacheTableName",
        "SelectionTableName",
        "FeedbackQueueUrl",
        "FeedbackDeadLetterQueueUrl",
        "UploadFailureQueueUrl",
        "FeedbackFunctionName",
        "DashboardName",
        "ModelBucketName",
        "FrontendFunctionName",
        "FrontendAliasArn",
        "BatcherFunctionName",
        "BatcherFunctionArn",
        "SharedLayerArn",
        "AdminFunctionName",
        "ModelUpdaterFunctionName",
        "SageMakerExecutionRoleArn",
    }


def test_tables_exist_and_replies_expire(session: Any, service: dict[str, str]) -> None:
    dynamodb = session.client("dynamodb")

    registry = dynamodb.describe_table(TableName=service["RegistryTableName"])["Table"]
    replies = dynamodb.describe_table(TableName=service["RepliesTableName"])["Table"]
    ttl = dynamodb.describe_time_to_live(TableName=service["RepliesTableName"])["TimeToLiveDescription"]

    assert [k["AttributeName"] for k in registry["KeySchema"]] == ["pk", "sk"]
    assert [k["AttributeName"] for k in replies["KeySchema"]] == ["query_id", "model"]
    assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": "expires_at"}


def test_model_bucket_exists_encrypted(session: Any, service: dict[str, str]) -> None:
    s3 = session.client("s3")

    encryption = s3.get_bucket_encryption(Bucket=service["ModelBucketName"])

    (rule,) = encryption["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"


def test_functions_exist_wired_to_the_stack(session: Any, service: dict[str, str]) -> None:
    lambda_client = session.client("lambda")

    for key, service_name in [("FrontendFunctionName", "clipper-frontend"), ("BatcherFunctionName", "clipper-batcher")]:
        config = lambda_client.get_function(FunctionName=service[key])["Configuration"]
        env = config["Environment"]["Variables"]
        assert (config["Handler"], config["Runtime"]) == ("app.handler", "python3.12")
        assert env["POWERTOOLS_SERVICE_NAME"] == service_name
        assert env["CLIPPER_REGISTRY_TABLE"] == service["RegistryTableName"]
        assert env["CLIPPER_REPLIES_TABLE"] == service["RepliesTableName"]
        assert env["CLIPPER_MODEL_BUCKET"] == service["ModelBucketName"]
        assert env["LOG_LEVEL"] == env["POWERTOOLS_LOG_LEVEL"] == "DEBUG"
        assert env["REDIS_URL"] == ""
    assert lambda_client.get_function(FunctionName=service["BatcherFunctionName"])["Configuration"]["Timeout"] == 30


def test_code_was_uploaded_to_the_artifacts_bucket(session: Any, service: dict[str, str]) -> None:
    listing = session.client("s3").list_objects_v2(Bucket=cfn.artifacts_bucket_name(STACK))

    keys = sorted(o["Key"] for o in listing.get("Contents", []))
    assert [k.rsplit("-", 1)[0] for k in keys] == [
        "code/functions-admin",
        "code/functions-batcher",
        "code/functions-canary_review",
        "code/functions-feedback",
        "code/functions-frontend",
        "code/functions-model_updater",
        "code/shared",
    ]


def test_shared_layer_output_is_its_arn(session: Any, service: dict[str, str]) -> None:
    layer_arn, version = service["SharedLayerArn"].rsplit(":", 1)

    layer = session.client("lambda").get_layer_version(LayerName=layer_arn, VersionNumber=int(version))

    assert layer["CompatibleRuntimes"] == ["python3.12"]


def test_each_model_gets_its_queue_with_redrive_to_its_own_dlq(
    session: Any, model_stacks: dict[str, dict[str, str]]
) -> None:
    sqs = session.client("sqs")

    for model in ("logreg", "mlp"):
        outputs = model_stacks[model]
        attributes = sqs.get_queue_attributes(QueueUrl=outputs["QueueUrl"], AttributeNames=["All"])["Attributes"]
        redrive = json.loads(attributes["RedrivePolicy"])
        assert outputs["QueueUrl"].endswith(f"/{STACK}-model-{model}")
        assert outputs["DeadLetterQueueUrl"].endswith(f"/{STACK}-model-{model}-dlq")
        receives = 5 if model == "logreg" else 3  # the default (AWS guidance for a Lambda event source), as given
        assert redrive == {"deadLetterTargetArn": outputs["DeadLetterQueueArn"], "maxReceiveCount": receives}
        assert attributes["VisibilityTimeout"] == "180"
        assert "EndpointName" not in outputs
    assert model_stacks["logreg"]["QueueArn"] != model_stacks["mlp"]["QueueArn"]


def test_lambda_batcher_mapping_reports_item_failures(
    session: Any, service: dict[str, str], model_stacks: dict[str, dict[str, str]]
) -> None:
    lambda_client = session.client("lambda")

    (mapping,) = lambda_client.list_event_source_mappings(EventSourceArn=model_stacks["forest"]["QueueArn"])[
        "EventSourceMappings"
    ]

    assert mapping["FunctionArn"] == service["BatcherFunctionArn"]
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["ScalingConfig"] == {"MaximumConcurrency": 2}
    assert (mapping["BatchSize"], mapping["MaximumBatchingWindowInSeconds"]) == (25, 1)
    for model in ("logreg", "mlp"):
        listed = lambda_client.list_event_source_mappings(EventSourceArn=model_stacks[model]["QueueArn"])
        assert listed["EventSourceMappings"] == []


def test_sagemaker_container_knows_its_model_version_queue_and_tables(session: Any, service: dict[str, str]) -> None:
    outputs = cfn.deploy_model_stack(
        session.client("cloudformation"),
        STACK,
        "cnn-v3",
        {
            "SageMakerEndpoint": "true",
            "ImageUri": ECR_IMAGE,
            "ExecutionRoleArn": SAGEMAKER_ROLE,
            "RegistryModelName": "cnn",
            "RegistryModelVersion": "3",
            "ModelSha256": "ab" * 32,
            "ReplyTtlSeconds": "900",
        },
    )
    sagemaker = session.client("sagemaker")

    endpoint = sagemaker.describe_endpoint(EndpointName=outputs["EndpointName"])
    config = sagemaker.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    (variant,) = config["ProductionVariants"]
    container = sagemaker.describe_model(ModelName=variant["ModelName"])["PrimaryContainer"]

    assert variant["InstanceType"] == "ml.g4dn.xlarge"
    assert container["Image"] == ECR_IMAGE
    assert "ModelDataUrl" not in container
    assert container["Environment"] == {
        "CLIPPER_MODEL_NAME": "cnn",  # the registry's names: the batcher reads its settings and SLO with them
        "CLIPPER_MODEL_VERSION": "3",
        "CLIPPER_MODEL_SHA256": "ab" * 32,  # the validated file's: the server refuses another at load
        "CLIPPER_QUEUE_URL": outputs["QueueUrl"],
        "CLIPPER_CLOUDWATCH_METRICS": "true",
        "CLIPPER_REPLY_TTL_S": "900",  # the service stack's ReplyTtlSeconds and ConfigTtlSeconds (default 2)
        "CLIPPER_CONFIG_TTL_S": "2",
        "AWS_DEFAULT_REGION": "us-east-1",  # SageMaker sets no region for the container's clients
        "CLIPPER_REGISTRY_TABLE": service["RegistryTableName"],
        "CLIPPER_REPLIES_TABLE": service["RepliesTableName"],
        "CLIPPER_CACHE_TABLE": service["CacheTableName"],
        "CLIPPER_MODEL_BUCKET": service["ModelBucketName"],
        "REDIS_URL": "",
    }


def test_a_refused_stack_raises_with_the_reason(session: Any) -> None:
    template = {"Parameters": {"ModelName": {"Type": "String"}}, "Resources": {"Q": {"Type": "AWS::SQS::Queue"}}}
    with pytest.raises(cfn.StackDeployError, match=r"create_stack refused: .*Missing parameter ModelName"):
        cfn.deploy_stack(session.client("cloudformation"), "refused", template)


# --- waiting on a stack (no moto: a scripted client) -----------------------------------------------------------


class ScriptedCloudFormation:
    """Reports the given statuses in turn, then the failure events."""

    def __init__(self, statuses: list[str], events: list[dict[str, str]]) -> None:
        self.statuses = statuses
        self.events = events
        self.created: dict[str, Any] = {}

    def create_stack(self, **kwargs: Any) -> dict[str, Any]:
        self.created = kwargs
        return {"StackId": "id"}

    def describe_stacks(self, StackName: str) -> dict[str, Any]:  # boto3 parameter names
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return {
            "Stacks": [
                {
                    "StackName": StackName,
                    "StackStatus": status,
                    "Outputs": [{"OutputKey": "QueueUrl", "OutputValue": "https://queue"}],
                }
            ]
        }

    def get_paginator(self, name: str) -> Any:
        assert name == "describe_stack_events"
        events = self.events

        class Paginator:
            def paginate(self, **_: Any) -> list[dict[str, Any]]:
                return [{"StackEvents": events}]

        return Paginator()


def test_deploy_stack_waits_for_completion_and_returns_outputs() -> None:
    client = ScriptedCloudFormation(["CREATE_IN_PROGRESS", "CREATE_IN_PROGRESS", "CREATE_COMPLETE"], [])

    outputs = cfn.deploy_stack(client, "s", {"Resources": {}}, {"ModelName": "m"}, poll_s=0)

    assert outputs == {"QueueUrl": "https://queue"}
    assert client.created["Parameters"] == [{"ParameterKey": "ModelName", "ParameterValue": "m"}]
    assert json.loads(client.created["TemplateBody"]) == {"Resources": {}}


def test_deploying_again_takes_the_stacks_as_they_are(
    session: Any, service: dict[str, str], model_stacks: dict[str, dict[str, str]]
) -> None:
    """A restore into a restarted moto tried again after its deploy had worked finds the stacks there."""
    again = cfn.deploy_service(session, STACK, REPO_ROOT, {"StageName": "prod", "LogLevel": "DEBUG"})
    assert again == service
    assert cfn.deploy_model_stack(session.client("cloudformation"), STACK, "logreg") == model_stacks["logreg"]


def test_deploy_stack_failure_names_the_failed_resources() -> None:
    events = [
        {"LogicalResourceId": "RequestQueue", "ResourceStatus": "CREATE_FAILED", "ResourceStatusReason": "bad name"},
        {"LogicalResourceId": "s", "ResourceStatus": "ROLLBACK_IN_PROGRESS"},
    ]
    client = ScriptedCloudFormation(["CREATE_IN_PROGRESS", "ROLLBACK_COMPLETE"], events)

    with pytest.raises(cfn.StackDeployError, match=r"ROLLBACK_COMPLETE: RequestQueue: bad name$"):
        cfn.deploy_stack(client, "s", "{}", poll_s=0)


def test_feedback_mapping_reports_partial_failures_and_can_be_disabled(session: Any, service: dict[str, str]) -> None:
    lam = session.client("lambda")
    (mapping,) = lam.list_event_source_mappings(FunctionName=service["FeedbackFunctionName"])["EventSourceMappings"]
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["BatchSize"] == 10
    translated = cfn.translate_sam(cfn.REPO_ROOT / "template.yaml")
    (esm,) = [r for r in translated["Resources"].values() if r["Type"] == "AWS::Lambda::EventSourceMapping"]
    assert esm["Properties"]["Enabled"] == {"Fn::If": ["FeedbackMappingOn", True, False]}


def test_service_stack_with_options_deploys(session: Any) -> None:
    # The options moto can create (ElastiCache and the HTTP API exist only on AWS): JWT on the query routes,
    # SnapStart, reserved concurrency for the batcher.
    outputs = cfn.deploy_service(
        session,
        "clipper-options",
        REPO_ROOT,
        {
            "QueryJwtIssuer": "https://issuer.example.com",
            "QueryJwtAudience": "client-a",
            "FrontendWarmMode": "snapstart",
            "BatcherReservedConcurrency": "7",
            "ModelStacks": "on",
            "ModelImageUri": ECR_IMAGE,
        },
    )
    lam = session.client("lambda")

    # the functions that create and scale the per-version model stacks know the stack, its template, the
    # role CloudFormation uses and the shared parameters, resolved to this deployment's resources
    for name in ("AdminFunctionName", "ModelUpdaterFunctionName"):
        variables = lam.get_function(FunctionName=outputs[name])["Configuration"]["Environment"]["Variables"]
        assert variables["CLIPPER_SERVICE_STACK_NAME"] == "clipper-options"
        assert variables["CLIPPER_MODEL_STACK_TEMPLATE"] == ""  # the template packaged in the shared layer
        assert variables["CLIPPER_MODEL_STACK_ROLE_ARN"].startswith("arn:aws:iam::")
        shared = json.loads(variables["CLIPPER_MODEL_STACK_PARAMETERS"])
        assert shared["SageMakerEndpoint"] == "true" and shared["ImageUri"] == ECR_IMAGE
        assert shared["ExecutionRoleArn"].startswith("arn:aws:iam::")
        assert (shared["ReplyTtlSeconds"], shared["ConfigTtlSeconds"]) == ("300", "2")  # reach the containers

    assert "RedisUrl" not in outputs
    concurrency = lam.get_function_concurrency(FunctionName=outputs["BatcherFunctionName"])
    assert concurrency["ReservedConcurrentExecutions"] == 7
    assert lam.get_function(FunctionName=outputs["FrontendFunctionName"])["Configuration"]["Runtime"] == "python3.12"
