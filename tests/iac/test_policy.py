"""Least privilege, statement by statement: every IAM statement in the translated template names the resources
it applies to, or is listed below with the reason it cannot; every managed policy attached is listed with its
reason; the functions' roles trust only Lambda, the model-stack role only CloudFormation and the endpoint role
only SageMaker; every invoke permission names its source; admin routes need IAM."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from infra.local import cfn
from tests.iac.conditions import resolve
from tests.iac.conftest import MODEL_TEMPLATE, SERVICE_TEMPLATE

pytestmark = pytest.mark.iac

# Managed policies SAM attaches, and why each is accepted.
MANAGED_POLICY_REASONS = {
    "service-role/AWSLambdaBasicExecutionRole": (
        "SAM attaches it to every role it creates; CloudWatch Logs actions on log groups (logs:CreateLogGroup, "
        "CreateLogStream, PutLogEvents). The functions write only their own /aws/lambda/<name> group."
    ),
    "AWSXrayWriteOnlyAccess": (
        "Tracing: Active; xray:PutTraceSegments/PutTelemetryRecords/GetSampling* have no resource-level "
        "permissions, so '*' is the only resource they accept."
    ),
    "service-role/AWSLambdaVPCAccessExecutionRole": (
        "SAM attaches it whenever VpcConfig is declared, and VpcConfig is declared behind UseElastiCache (SAM "
        "cannot make the attachment conditional); ec2:CreateNetworkInterface/Describe*/DeleteNetworkInterface "
        "for the function's ENIs, which Lambda requires on '*'."
    ),
}
# Which roles get the VPC policy (the functions that use Redis).
VPC_ROLES = {"FrontendFunctionRole", "BatcherFunctionRole", "FeedbackFunctionRole"}

# Inline statements allowed to use a wildcard resource: (role, Sid) -> reason.
WILDCARD_STATEMENT_REASONS: dict[tuple[str, str], str] = {
    ("ModelStackRole", "CreateBatcherMappings"): (
        "lambda:CreateEventSourceMapping has no resource-level permission (the mapping does not exist yet); the "
        "statement's lambda:FunctionArn condition limits it to this stack's batcher function."
    ),
    ("ModelStackRole", "ManageBatcherMappings"): (
        "event source mappings are named by a UUID that CloudFormation gets back at creation, so no name pattern "
        "exists; the lambda:FunctionArn condition limits the statement to mappings of this stack's batcher."
    ),
    ("ModelStackRole", "ReadAndTagBatcherMappings"): (
        "event source mappings are named by a UUID (no name pattern exists), and reading one or its tags carries "
        "no lambda:FunctionArn key to condition on; it reads and tags, never changes what a mapping does."
    ),
    ("ModelStackRole", "SageMakerEndpointConfigs"): (
        "CloudFormation generates the endpoint configuration's name (EndpointConfig-<random>), so no name "
        "pattern exists; the model and endpoint themselves are scoped to <stack>-* in the statement before."
    ),
    ("SageMakerExecutionRole", "PullModelImage"): (
        "the model image's repository is a deploy-time choice (ModelImageUri) in this account and region, "
        "not a resource of this stack; pulling needs read actions only."
    ),
    ("SageMakerExecutionRole", "EcrToken"): "ecr:GetAuthorizationToken accepts only '*' (it is not per repository).",
    ("SageMakerExecutionRole", "EndpointMetrics"): (
        "cloudwatch:PutMetricData accepts only '*'; a cloudwatch:namespace condition limits it to Clipper's "
        "and the endpoint's namespaces."
    ),
    ("SageMakerExecutionRole", "EndpointInVpc"): (
        "SageMaker creates the endpoint's network interfaces in the VPC (when the cache is in one) and these "
        "EC2 actions accept only '*'."
    ),
}
# Roles that are not a function's, and the one service each trusts.
SERVICE_ROLES = {
    "ModelStackRole": "cloudformation.amazonaws.com",
    "SageMakerExecutionRole": "sagemaker.amazonaws.com",
}

# A resource string names a specific resource when it is a reference to one in this stack, or an ARN built
# from this stack's name (the per-model queues and endpoints live in stacks named after it).
STACK_SCOPED = re.compile(r"\$\{AWS::StackName\}-|^\$\{[A-Za-z0-9]+\.Arn\}/[a-z]+/\*$")


@pytest.fixture(scope="module")
def translated() -> dict[str, Any]:
    return cfn.translate_sam(SERVICE_TEMPLATE)


def roles(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == "AWS::IAM::Role"}


def statements(template: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(owner, statement) of every permission statement: role inline policies and standalone policies; a statement
    under a condition (``Fn::If``) is each statement it may be."""
    for logical_id, resource in template["Resources"].items():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::IAM::Role":
            for policy in props.get("Policies", []):
                for statement in policy["PolicyDocument"]["Statement"]:
                    yield from ((logical_id, s) for s in conditional(statement))
        elif resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            for statement in props["PolicyDocument"]["Statement"]:
                yield from ((logical_id, s) for s in conditional(statement))


def conditional(statement: dict[str, Any]) -> list[dict[str, Any]]:
    if set(statement) != {"Fn::If"}:
        return [statement]
    _, when_true, when_false = statement["Fn::If"]
    return [s for branch in (when_true, when_false) if branch != {"Ref": "AWS::NoValue"} for s in conditional(branch)]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def names_a_specific_resource(resource: Any) -> bool:
    if isinstance(resource, str):
        return resource != "*" and not resource.endswith(":*")
    if not isinstance(resource, dict):
        return False
    ((fn, arg),) = resource.items()
    if fn in ("Ref", "Fn::GetAtt"):
        return True  # a resource of this stack
    if fn == "Fn::Sub" and isinstance(arg, str):
        return bool(STACK_SCOPED.search(arg))
    return False


def test_there_are_inline_statements_to_check(translated: dict[str, Any]) -> None:
    found = list(statements(translated))

    assert len(found) >= 15
    functions = ("Frontend", "Batcher", "Feedback", "Admin", "ModelUpdater", "CanaryReview")
    assert {owner for owner, _ in found} == {f"{f}FunctionRole" for f in functions} | set(SERVICE_ROLES)


def test_every_statement_names_specific_resources_or_has_a_reason(translated: dict[str, Any]) -> None:
    unexplained = []
    for owner, statement in statements(translated):
        assert statement["Effect"] == "Allow", (owner, statement)
        assert "NotResource" not in statement and "NotAction" not in statement, (owner, statement)
        assert not any(a == "*" or a.endswith(":*") for a in as_list(statement["Action"])), (owner, statement)
        specific = all(names_a_specific_resource(r) for r in as_list(statement["Resource"]))
        reason = WILDCARD_STATEMENT_REASONS.get((owner, statement.get("Sid", "")))
        if specific:
            assert reason is None, f"{owner}/{statement.get('Sid')} is scoped: drop its recorded reason"
        elif reason is None:
            unexplained.append((owner, statement.get("Sid"), statement["Resource"]))

    assert unexplained == []


def test_wildcard_detection_catches_broad_resources() -> None:
    assert not names_a_specific_resource("*")
    assert not names_a_specific_resource({"Fn::Sub": "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:*"})
    assert names_a_specific_resource({"Fn::GetAtt": ["FeedbackQueue", "Arn"]})
    assert names_a_specific_resource(
        {"Fn::Sub": "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${AWS::StackName}-model-*"}
    )
    assert names_a_specific_resource({"Fn::Sub": "${ModelBucket.Arn}/claims/*"})


def test_managed_policies_are_the_listed_ones(translated: dict[str, Any]) -> None:
    for name, role in roles(translated).items():
        arns = role["Properties"].get("ManagedPolicyArns", [])
        attached = {arn.split(":policy/", 1)[1] for arn in arns}
        assert attached <= set(MANAGED_POLICY_REASONS), (name, attached - set(MANAGED_POLICY_REASONS))
        assert ("service-role/AWSLambdaVPCAccessExecutionRole" in attached) == (name in VPC_ROLES), name
    assert all(len(reason) > 40 for reason in MANAGED_POLICY_REASONS.values())


def test_no_role_gets_the_sqs_policy_for_every_queue(translated: dict[str, Any]) -> None:
    # SAM's SQS event attaches AWSLambdaSQSQueueExecutionRole (all queues); the feedback mapping is declared
    # directly and its statement names the feedback queue.
    by_sid = {s.get("Sid"): s for owner, s in statements(translated) if owner == "FeedbackFunctionRole"}
    feedback = by_sid["ConsumeFeedbackQueue"]

    assert feedback["Resource"] == {"Fn::GetAtt": ["FeedbackQueue", "Arn"]}
    assert set(feedback["Action"]) == {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
    }


def test_roles_trust_only_the_service_that_uses_them(translated: dict[str, Any]) -> None:
    for name, role in roles(translated).items():
        (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        service = SERVICE_ROLES.get(name, "lambda.amazonaws.com")
        assert trust["Principal"] == {"Service": [service]}, name
        assert trust["Action"] == ["sts:AssumeRole"], name


def test_every_invoke_permission_names_its_source(translated: dict[str, Any]) -> None:
    permissions = {
        k: v["Properties"] for k, v in translated["Resources"].items() if v["Type"] == "AWS::Lambda::Permission"
    }

    assert permissions
    for name, permission in permissions.items():
        assert permission["Action"] == "lambda:InvokeFunction", name
        assert "SourceArn" in permission, name


def test_the_bucket_policy_only_denies(translated: dict[str, Any]) -> None:
    policy = translated["Resources"]["ModelBucketPolicy"]["Properties"]["PolicyDocument"]

    (statement,) = policy["Statement"]
    assert statement["Effect"] == "Deny"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_admin_routes_need_iam_whatever_the_query_auth(translated: dict[str, Any]) -> None:
    for params in ({}, {"QueryJwtIssuer": "https://issuer.example", "QueryJwtAudience": "a"}):
        paths = resolve(translated, **params)["Resources"]["HttpApi"]["Properties"]["Body"]["paths"]
        admin = [spec for path, methods in paths.items() if path.startswith("/admin/") for spec in methods.values()]
        assert len(admin) == 4  # ping, the operations, the report, the OpenAPI document
        assert all(spec["security"] == [{"AWS_IAM": []}] for spec in admin)


def test_model_stack_declares_no_iam() -> None:
    model = cfn.load_template(MODEL_TEMPLATE)

    assert not [r for r in model["Resources"].values() if r["Type"].startswith("AWS::IAM::")]


def test_metrics_route_needs_iam(translated: dict[str, Any]) -> None:
    paths = resolve(translated)["Resources"]["HttpApi"]["Properties"]["Body"]["paths"]

    assert paths["/metrics"]["get"]["security"] == [{"AWS_IAM": []}]


def test_the_admin_function_may_delete_validated_copies_only_and_the_bucket_expires_what_they_leave(
    translated: dict[str, Any],
) -> None:
    """Deleting a version deletes its validated copy (listed under validated/<model>/<version>/, then deleted):
    the admin role may list and delete under validated/ only; the versioned bucket expires the versions left."""
    granted = [s for owner, s in statements(translated) if owner == "AdminFunctionRole"]
    by_sid = {s.get("Sid"): s for s in granted}
    delete, listing = by_sid["DeleteValidatedCopies"], by_sid["ListValidatedCopies"]
    assert delete["Action"] == "s3:DeleteObject" and delete["Resource"] == {"Fn::Sub": "${ModelBucket.Arn}/validated/*"}
    assert listing["Action"] == "s3:ListBucket" and listing["Condition"] == {"StringLike": {"s3:prefix": "validated/*"}}
    assert not any("s3:DeleteObject" in as_list(s["Action"]) for s in granted if s is not delete)
    rules = translated["Resources"]["ModelBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    (rule,) = [r for r in rules if r.get("Prefix") == "validated/"]
    assert rule["Status"] == "Enabled" and rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == 7
