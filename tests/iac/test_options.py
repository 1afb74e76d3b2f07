"""The template's optional features, each checked both ways on the translated template resolved for the
parameter values: the JWT authorizer of the query routes, the frontend's warm mode (SnapStart or provisioned
concurrency), ElastiCache Serverless with the functions in a VPC, and the batcher's concurrency settings."""

from __future__ import annotations

import re
from typing import Any

import pytest

from infra.local import cfn
from tests.iac.conditions import resolve
from tests.iac.conftest import MODEL_TEMPLATE, SERVICE_TEMPLATE

pytestmark = pytest.mark.iac

ISSUER = "https://cognito-idp.us-east-1.amazonaws.com/us-east-1_Example"
VPC = {"ElastiCacheEngine": "valkey", "VpcId": "vpc-0abc", "VpcSubnetIds": "subnet-0aaa,subnet-0bbb"}
QUERY_ROUTES = [("/{app}/predict", "post"), ("/{app}/update", "post")]
REDIS_FUNCTIONS = ("FrontendFunction", "BatcherFunction", "FeedbackFunction")


@pytest.fixture(scope="module")
def translated() -> dict[str, Any]:
    return cfn.translate_sam(SERVICE_TEMPLATE)


def api_body(template: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = template["Resources"]["HttpApi"]["Properties"]["Body"]
    return body


def env(template: dict[str, Any], function: str) -> dict[str, Any]:
    variables: dict[str, Any] = template["Resources"][function]["Properties"]["Environment"]["Variables"]
    return variables


# --- JWT authorizer on the query routes -------------------------------------------------------------------


def test_query_routes_are_open_without_an_issuer(translated: dict[str, Any]) -> None:
    body = api_body(resolve(translated))

    for path, method in QUERY_ROUTES:
        assert "security" not in body["paths"][path][method], path
    assert "QueryJwt" not in body["components"]["securitySchemes"]
    assert set(body["components"]["securitySchemes"]) == {"AWS_IAM"}


def test_query_routes_require_a_jwt_from_the_issuer(translated: dict[str, Any]) -> None:
    body = api_body(resolve(translated, QueryJwtIssuer=ISSUER, QueryJwtAudience="client-a,client-b"))

    for path, method in QUERY_ROUTES:
        assert body["paths"][path][method]["security"] == [{"QueryJwt": []}], path
    assert "security" not in body["paths"]["/health"]["get"]  # probes stay open
    for path in ("/admin/ping", "/admin/{operation}"):
        (spec,) = body["paths"][path].values()
        assert spec["security"] == [{"AWS_IAM": []}]
    scheme = body["components"]["securitySchemes"]["QueryJwt"]
    authorizer = scheme["x-amazon-apigateway-authorizer"]
    assert (scheme["type"], authorizer["type"]) == ("oauth2", "jwt")
    assert authorizer["identitySource"] == "$request.header.Authorization"
    assert authorizer["jwtConfiguration"] == {
        "issuer": {"Ref": "QueryJwtIssuer"},
        "audience": {"Fn::Split": [",", {"Ref": "QueryJwtAudience"}]},
    }


def test_an_issuer_without_audience_is_refused_by_a_rule() -> None:
    template = cfn.load_template(SERVICE_TEMPLATE)

    rule = template["Rules"]["JwtIssuerNeedsAudience"]
    assert rule["RuleCondition"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "QueryJwtIssuer"}, ""]}]}
    (assertion,) = rule["Assertions"]
    assert assertion["Assert"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "QueryJwtAudience"}, ""]}]}
    assert resolve(template, QueryJwtIssuer=ISSUER)["_conditions"]["HasQueryJwt"] is False


# --- frontend warm mode -----------------------------------------------------------------------------------


def alias_of(template: dict[str, Any]) -> dict[str, Any]:
    (alias,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Alias"]
    return alias


def test_the_api_always_invokes_the_live_alias(translated: dict[str, Any]) -> None:
    alias = alias_of(translated)
    paths = api_body(translated)["paths"]

    assert alias["Properties"]["Name"] == "live"
    assert alias["Properties"]["FunctionName"] == {"Ref": "FrontendFunction"}
    for path in ("/{app}/predict", "/{app}/update", "/health"):
        for spec in paths[path].values():
            assert "${FrontendFunctionAliaslive}" in spec["x-amazon-apigateway-integration"]["uri"]["Fn::Sub"]
    permissions = [
        r["Properties"]
        for r in translated["Resources"].values()
        if r["Type"] == "AWS::Lambda::Permission" and r["Properties"]["Principal"] == "apigateway.amazonaws.com"
    ]
    frontend = [p for p in permissions if "Frontend" in str(p["FunctionName"])]
    assert frontend and all(p["FunctionName"] == {"Ref": "FrontendFunctionAliaslive"} for p in frontend)


@pytest.mark.parametrize(
    ("mode", "snapstart", "provisioned"),
    [("none", "None", None), ("snapstart", "PublishedVersions", None), ("provisioned", "None", 3)],
)
def test_warm_mode(translated: dict[str, Any], mode: str, snapstart: str, provisioned: int | None) -> None:
    resolved = resolve(translated, FrontendWarmMode=mode, FrontendProvisionedConcurrency="3")
    function = resolved["Resources"]["FrontendFunction"]["Properties"]
    alias = alias_of(resolved)["Properties"]

    assert function["Runtime"] == "python3.12"  # SnapStart for Python needs 3.12 or later
    assert function["SnapStart"] == {"ApplyOn": snapstart}
    if provisioned is None:
        assert "ProvisionedConcurrencyConfig" not in alias
    else:
        assert alias["ProvisionedConcurrencyConfig"] == {
            "ProvisionedConcurrentExecutions": {"Ref": "FrontendProvisionedConcurrency"}
        }
    assert resolved["Parameters"]["FrontendWarmMode"]["Default"] == "none"


# --- ElastiCache Serverless and the VPC -------------------------------------------------------------------


def test_without_elasticache_no_cache_no_vpc_and_redis_url_is_the_parameter(translated: dict[str, Any]) -> None:
    resolved = resolve(translated)
    types = {r["Type"] for r in resolved["Resources"].values()}

    assert "AWS::ElastiCache::ServerlessCache" not in types
    assert not {t for t in types if t.startswith("AWS::EC2::")}
    for function in [k for k, r in resolved["Resources"].items() if r["Type"] == "AWS::Lambda::Function"]:
        assert "VpcConfig" not in resolved["Resources"][function]["Properties"], function
        assert env(resolved, function)["REDIS_URL"] == {"Ref": "RedisUrl"}
    assert "RedisUrl" not in resolved["Outputs"]


@pytest.mark.parametrize("engine", ["valkey", "redis"])
def test_elasticache_serverless_in_the_vpc(translated: dict[str, Any], engine: str) -> None:
    resolved = resolve(translated, **{**VPC, "ElastiCacheEngine": engine})
    resources = resolved["Resources"]
    cache = resources["Cache"]["Properties"]
    url = {"Fn::Sub": "rediss://${Cache.Endpoint.Address}:${Cache.Endpoint.Port}"}

    assert resources["Cache"]["Type"] == "AWS::ElastiCache::ServerlessCache"
    assert cache["Engine"] == {"Ref": "ElastiCacheEngine"}
    assert cache["SubnetIds"] == {"Ref": "VpcSubnetIds"}
    assert cache["SecurityGroupIds"] == [{"Fn::GetAtt": ["CacheSecurityGroup", "GroupId"]}]
    assert cache["CacheUsageLimits"]["DataStorage"] == {"Maximum": {"Ref": "ElastiCacheMaxDataGB"}, "Unit": "GB"}
    for function in REDIS_FUNCTIONS:
        props = resources[function]["Properties"]
        assert props["VpcConfig"] == {
            "SecurityGroupIds": [{"Fn::GetAtt": ["FunctionSecurityGroup", "GroupId"]}],
            "SubnetIds": {"Ref": "VpcSubnetIds"},
        }, function
        assert env(resolved, function)["REDIS_URL"] == url
    for function in ("AdminFunction", "ModelUpdaterFunction"):  # never use Redis: stay out of the VPC
        assert "VpcConfig" not in resources[function]["Properties"]
    assert resolved["Outputs"]["RedisUrl"]["Value"] == url


def test_only_the_functions_reach_the_cache(translated: dict[str, Any]) -> None:
    resources = resolve(translated, **VPC)["Resources"]

    (ingress,) = resources["CacheSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert (ingress["FromPort"], ingress["ToPort"]) == (6379, 6380)
    assert ingress["SourceSecurityGroupId"] == {"Fn::GetAtt": ["FunctionSecurityGroup", "GroupId"]}
    egress = resources["FunctionToCacheEgress"]["Properties"]
    assert egress["DestinationSecurityGroupId"] == {"Fn::GetAtt": ["CacheSecurityGroup", "GroupId"]}
    (https,) = resources["FunctionSecurityGroup"]["Properties"]["SecurityGroupEgress"]
    assert (https["FromPort"], https["ToPort"], https["CidrIp"]) == (443, 443, "0.0.0.0/0")


def test_with_model_servers_over_http_the_functions_reach_their_port(translated: dict[str, Any]) -> None:
    """In the VPC (ElastiCache) the functions could reach only 443 and the cache: a model server at the
    template's own example address (http://models.internal:8080) was a connect timeout for every batch."""
    http = {**VPC, "ModelStacks": "on", "ModelServing": "http", "ModelEndpointAddress": "http://m.internal:8080/x"}
    resources = resolve(translated, **http, ModelEndpointPort="8080")["Resources"]
    https, model = resources["FunctionSecurityGroup"]["Properties"]["SecurityGroupEgress"]
    port = {"Ref": "ModelEndpointPort"}
    assert https["FromPort"] == 443 and (model["FromPort"], model["ToPort"]) == (port, port)


def test_a_model_server_on_443_gets_no_second_rule(translated: dict[str, Any]) -> None:
    """443 is always open (the AWS APIs): a second, identical egress rule for a model server on 443 is refused by
    EC2 (a duplicate permission), which failed the stack."""
    http = {**VPC, "ModelStacks": "on", "ModelServing": "http", "ModelEndpointAddress": "https://m.internal/x"}
    resources = resolve(translated, **http, ModelEndpointPort="443")["Resources"]
    (https,) = resources["FunctionSecurityGroup"]["Properties"]["SecurityGroupEgress"]
    assert (https["FromPort"], https["ToPort"], https["CidrIp"]) == (443, 443, "0.0.0.0/0")


def test_an_engine_without_a_vpc_creates_nothing_and_a_rule_refuses_it(translated: dict[str, Any]) -> None:
    resolved = resolve(translated, ElastiCacheEngine="valkey")

    assert "Cache" not in resolved["Resources"]
    rule = cfn.load_template(SERVICE_TEMPLATE)["Rules"]["ElastiCacheNeedsVpc"]
    assert len(rule["Assertions"]) == 2


def test_rules_use_only_rule_functions() -> None:
    """CloudFormation takes only its rule functions (and Ref) inside Rules; cfn-lint and moto let others by: an
    Fn::Join there (ElastiCacheNeedsVpc's subnets) would have failed every deployment's validation (a review)."""
    allowed = {"Ref", "Fn::And", "Fn::Contains", "Fn::EachMemberEquals", "Fn::EachMemberIn", "Fn::Equals", "Fn::Not"}
    allowed |= {"Fn::Or", "Fn::RefAll", "Fn::ValueOf", "Fn::ValueOfAll"}
    used: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            used.update(k for k in node if k == "Ref" or k.startswith("Fn::"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    rules = cfn.load_template(SERVICE_TEMPLATE)["Rules"]
    for rule in rules.values():
        walk(rule.get("RuleCondition"))
        walk([a["Assert"] for a in rule["Assertions"]])
    assert used and used <= allowed, used - allowed


# --- concurrency ------------------------------------------------------------------------------------------


def test_batcher_reserved_concurrency_is_a_parameter(translated: dict[str, Any]) -> None:
    unset = resolve(translated)["Resources"]["BatcherFunction"]["Properties"]
    reserved = resolve(translated, BatcherReservedConcurrency="20")["Resources"]["BatcherFunction"]["Properties"]

    assert "ReservedConcurrentExecutions" not in unset
    assert reserved["ReservedConcurrentExecutions"] == {"Ref": "BatcherReservedConcurrency"}


def test_model_stack_mapping_takes_batch_size_window_and_maximum_concurrency() -> None:
    model = cfn.load_template(MODEL_TEMPLATE)

    mapping = resolve(model, ServiceStackName="clipper", ModelName="m", LambdaBatcher="true", BatcherFunctionArn="arn")
    props = mapping["Resources"]["BatcherEventSourceMapping"]["Properties"]
    assert props["BatchSize"] == {"Ref": "BatchSize"}
    assert props["MaximumBatchingWindowInSeconds"] == {"Ref": "MaximumBatchingWindowInSeconds"}
    assert props["ScalingConfig"] == {"MaximumConcurrency": {"Ref": "MaximumConcurrency"}}
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    without = resolve(model, ServiceStackName="clipper", ModelName="m")
    assert "BatcherEventSourceMapping" not in without["Resources"]


def test_model_endpoint_joins_the_cache_vpc_only_when_given_one() -> None:
    model = cfn.load_template(MODEL_TEMPLATE)
    endpoint = {"ServiceStackName": "clipper", "ModelName": "m", "SageMakerEndpoint": "true", "ImageUri": "i"}
    endpoint["ExecutionRoleArn"] = "arn:aws:iam::123456789012:role/r"

    outside = resolve(model, **endpoint)["Resources"]["SageMakerModel"]["Properties"]
    inside = resolve(model, **endpoint, VpcSubnetIds="subnet-1,subnet-2", VpcSecurityGroupIds="sg-1")
    assert "VpcConfig" not in outside
    assert inside["Resources"]["SageMakerModel"]["Properties"]["VpcConfig"] == {
        "Subnets": {"Ref": "VpcSubnetIds"},
        "SecurityGroupIds": {"Ref": "VpcSecurityGroupIds"},
    }


def test_a_lambda_batcher_is_the_only_consumer_of_its_queue() -> None:
    """With the Lambda batcher and a SageMaker endpoint (the Lambda driver calling InvokeEndpoint), the container
    is not given the queue: its own long-poll batcher would take the same messages as the Lambda mapping."""
    model = cfn.load_template(MODEL_TEMPLATE)
    endpoint = {"ServiceStackName": "clipper", "ModelName": "m", "SageMakerEndpoint": "true", "ImageUri": "i"}
    endpoint["ExecutionRoleArn"] = "arn:aws:iam::123456789012:role/r"

    alone = resolve(model, **endpoint)["Resources"]
    with_lambda = resolve(model, **endpoint, LambdaBatcher="true", BatcherFunctionArn="arn")["Resources"]
    environment = alone["SageMakerModel"]["Properties"]["PrimaryContainer"]["Environment"]
    assert environment["CLIPPER_QUEUE_URL"] == {"Ref": "RequestQueue"}
    assert "BatcherEventSourceMapping" in with_lambda
    assert "CLIPPER_QUEUE_URL" not in with_lambda["SageMakerModel"]["Properties"]["PrimaryContainer"]["Environment"]


def test_model_stack_alarms_on_dead_letters_and_endpoint_errors_when_there_is_an_endpoint() -> None:
    model = cfn.load_template(MODEL_TEMPLATE)
    endpoint = {"SageMakerEndpoint": "true", "ImageUri": "i", "ExecutionRoleArn": "arn:aws:iam::123456789012:role/r"}

    queue_only = resolve(model, ServiceStackName="clipper", ModelName="m")["Resources"]
    with_endpoint = resolve(model, ServiceStackName="clipper", ModelName="m", **endpoint)["Resources"]

    assert "DeadLetterAlarm" in queue_only and "EndpointErrorsAlarm" not in queue_only
    alarm = with_endpoint["EndpointErrorsAlarm"]["Properties"]
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/SageMaker", "Invocation5XXErrors")
    assert {"Name": "EndpointName", "Value": {"Fn::GetAtt": ["Endpoint", "EndpointName"]}} in alarm["Dimensions"]


def test_model_stack_alarms_on_failed_batches_whatever_the_retries_and_the_batcher() -> None:
    """Both batchers count EndpointErrors by queue (EMF in Lambda, PutMetricData in the container); the alarm
    is there with or without a SageMaker endpoint and fires after three minutes in a row with failures."""
    model = cfn.load_template(MODEL_TEMPLATE)
    endpoint = {"SageMakerEndpoint": "true", "ImageUri": "i", "ExecutionRoleArn": "arn:aws:iam::123456789012:role/r"}
    for resources in (
        resolve(model, ServiceStackName="clipper", ModelName="m")["Resources"],
        resolve(model, ServiceStackName="clipper", ModelName="m", **endpoint)["Resources"],
    ):
        alarm = resources["EndpointFailuresAlarm"]["Properties"]
        assert (alarm["Namespace"], alarm["MetricName"], alarm["Statistic"]) == ("Clipper", "EndpointErrors", "Sum")
        assert alarm["Dimensions"] == [{"Name": "queue", "Value": {"Fn::GetAtt": ["RequestQueue", "QueueName"]}}]
        assert alarm["Period"] * alarm["DatapointsToAlarm"] <= 180 and alarm["Threshold"] == 0
    container = resolve(model, ServiceStackName="clipper", ModelName="m", **endpoint)["Resources"]["SageMakerModel"]
    assert container["Properties"]["PrimaryContainer"]["Environment"]["CLIPPER_CLOUDWATCH_METRICS"] == "true"


# --- batcher tracing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "mode", "disabled"), [("off", "PassThrough", "true"), ("on", "Active", "false")])
def test_batcher_tracing_follows_its_parameter(
    translated: dict[str, Any], value: str, mode: str, disabled: str
) -> None:
    template = resolve(translated, BatcherTracing=value)
    batcher = template["Resources"]["BatcherFunction"]["Properties"]

    assert batcher["TracingConfig"]["Mode"] == mode
    assert env(template, "BatcherFunction")["POWERTOOLS_TRACE_DISABLED"] == disabled
    assert template["Resources"]["FrontendFunction"]["Properties"]["TracingConfig"]["Mode"] == "Active"


# --- per-version model stacks -------------------------------------------------------------------------------

STACK_FUNCTIONS = ("AdminFunction", "ModelUpdaterFunction")


def test_model_stacks_are_off_by_default(translated: dict[str, Any]) -> None:
    template = resolve(translated)

    for function in STACK_FUNCTIONS:
        assert env(template, function)["CLIPPER_SERVICE_STACK_NAME"] == "", function


@pytest.mark.parametrize("serving", ["sagemaker", "http"])
def test_model_stacks_get_the_shared_parameters_of_their_serving_mode(translated: dict[str, Any], serving: str) -> None:
    template = resolve(translated, ModelStacks="on", ModelServing=serving, ModelImageUri="1.dkr.ecr/x:1")
    model_parameters = set(cfn.load_template(MODEL_TEMPLATE)["Parameters"])

    for function in STACK_FUNCTIONS:
        variables = env(template, function)
        assert variables["CLIPPER_SERVICE_STACK_NAME"] == {"Ref": "AWS::StackName"}
        assert variables["CLIPPER_MODEL_STACK_ROLE_ARN"] == {"Fn::GetAtt": ["ModelStackRole", "Arn"]}
        assert variables["CLIPPER_MODEL_STACK_TEMPLATE"] == {"Ref": "ModelStackTemplateUrl"}
        shared = variables["CLIPPER_MODEL_STACK_PARAMETERS"]["Fn::Sub"]
        text = shared[0] if isinstance(shared, list) else shared
        names = set(re.findall(r'"([A-Za-z]+)":', text))
        assert names <= model_parameters, names - model_parameters  # every key is a model-stack parameter
        if serving == "sagemaker":
            assert {"SageMakerEndpoint", "ImageUri", "InstanceType", "ExecutionRoleArn", "RedisUrl"} <= names
        else:
            assert names == {"LambdaBatcher", "BatcherFunctionArn"}


def statement_ids(template: dict[str, Any], function: str) -> set[str]:
    role = template["Resources"][f"{function}Role"]["Properties"]
    return {s["Sid"] for p in role.get("Policies", []) for s in p["PolicyDocument"]["Statement"] if "Sid" in s}


@pytest.mark.parametrize(
    ("url", "reads_s3"), [("", False), ("https://b.s3.us-east-1.amazonaws.com/templates/model-stack.yaml", True)]
)
def test_model_stacks_use_the_packaged_template_unless_a_url_is_given(
    translated: dict[str, Any], url: str, reads_s3: bool
) -> None:
    # empty: the functions use infra/model-stack.yaml as packaged with them, and need no read of the bucket for it;
    # a URL (a deployment that kept its copy in S3): CloudFormation reads it with the functions' permissions
    template = resolve(translated, ModelStacks="on", ModelStackTemplateUrl=url)

    assert translated["Parameters"]["ModelStackTemplateUrl"]["Default"] == ""
    assert "ModelStackTemplateUrl" not in template["Outputs"]  # nothing is read from the bucket unless given
    for function in STACK_FUNCTIONS:
        assert env(template, function)["CLIPPER_MODEL_STACK_TEMPLATE"] == {"Ref": "ModelStackTemplateUrl"}
        assert ("ReadModelStackTemplate" in statement_ids(template, function)) is reads_s3, function
        assert "RegistryReadWrite" in statement_ids(template, function)  # the role's other statements stay


# --- users' bandit states: retention ------------------------------------------------------------------------


def test_the_feedback_function_expires_users_states_after_the_retention(translated: dict[str, Any]) -> None:
    template = resolve(translated)
    # the feedback function saves the states; the setting is global, so every function reads the same value
    assert env(template, "FeedbackFunction")["CLIPPER_USER_STATE_RETENTION_DAYS"] == {"Ref": "UserStateRetentionDays"}
    parameter = template["Parameters"]["UserStateRetentionDays"]
    assert (parameter["Default"], parameter["MinValue"]) == (365, 0)
    table = template["Resources"]["SelectionTable"]["Properties"]
    assert table["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}


def test_the_feedback_markers_outlive_every_feedback_message(translated: dict[str, Any]) -> None:
    """A redelivered or redriven feedback message is recognised by its marker only while the marker lives."""
    from clipper.adapters import dynamodb_canary, dynamodb_selection

    resources = translated["Resources"]
    retention = max(
        int(resources[q]["Properties"].get("MessageRetentionPeriod", 345600))
        for q in ("FeedbackQueue", "FeedbackDeadLetterQueue")
    )
    assert retention < dynamodb_selection.MARKER_TTL_S
    assert retention < dynamodb_canary.MARKER_TTL_S


def test_the_batchers_timeout_never_passes_its_queues_visibility_timeout(translated: dict[str, Any]) -> None:
    """Lambda refuses an SQS event source mapping whose queue's visibility timeout is shorter than the function's
    timeout: every model stack would fail with a BatcherTimeout past the model queues' visibility."""
    model = cfn.load_template(MODEL_TEMPLATE)
    service = cfn.load_template(SERVICE_TEMPLATE)
    visibility = model["Parameters"]["VisibilityTimeoutSeconds"]["Default"]
    assert service["Parameters"]["BatcherTimeout"]["MaxValue"] <= visibility
    assert translated["Resources"]["FeedbackFunction"]["Properties"]["Timeout"] <= int(
        translated["Resources"]["FeedbackQueue"]["Properties"]["VisibilityTimeout"]
    )


def test_a_model_stacks_names_fit_sagemaker_and_sqs_at_the_longest_parameters() -> None:
    """<service>-<ModelName> names SageMaker's model and endpoint (63 characters at most, and lowercase in their
    ARNs, which the roles match), <service>-model-<ModelName>-dlq the dead-letter queue (80)."""
    params = cfn.load_template(MODEL_TEMPLATE)["Parameters"]
    service, model = params["ServiceStackName"]["MaxLength"], params["ModelName"]["MaxLength"]
    assert service + 1 + model <= 63
    assert service + len("-model-") + model + len("-dlq") <= 80
    pattern = re.compile(params["ServiceStackName"]["AllowedPattern"])
    assert pattern.fullmatch("clipper-prod") and not pattern.fullmatch("Clipper")


def test_the_lambda_batcher_knows_its_timeout_so_an_endpoint_call_ends_first(translated: dict[str, Any]) -> None:
    """Its endpoint calls had a fixed 30 s (HTTP) or 4 reads of 30 s (SageMaker, botocore's retries) against a
    30 s function: a hung endpoint stopped the function with nothing reported."""
    assert env(translated, "BatcherFunction")["CLIPPER_FUNCTION_TIMEOUT_S"] == {"Ref": "BatcherTimeout"}


def test_the_model_updater_knows_its_timeout_so_a_models_validation_ends_within_it(translated: dict[str, Any]) -> None:
    """A model's sample run had no limit: one that never ended held the function to its timeout, and the upload was
    retried. The settings refuse a validation limit that leaves no room in this timeout (tests/integration)."""
    function = translated["Resources"]["ModelUpdaterFunction"]["Properties"]
    assert env(translated, "ModelUpdaterFunction")["CLIPPER_FUNCTION_TIMEOUT_S"] == str(function["Timeout"]) == "900"


def test_the_model_updater_has_memory_for_its_largest_model_and_the_process_validating_it(
    translated: dict[str, Any],
) -> None:
    """The function had 2048 MB: with a 512 MiB model, the updater's copy of the file and the validation child's
    loading of it (~3x the file) passed it together. Measured on a 512 MiB ONNX model (template.yaml's comment)."""
    function = translated["Resources"]["ModelUpdaterFunction"]["Properties"]
    assert "CLIPPER_MAX_MODEL_BYTES" not in env(translated, "ModelUpdaterFunction")  # its default, 512 MiB
    largest_mib = 512
    child_mib = 3 * largest_mib + 50  # measured: 1,589 MiB
    parent_mib = 150 + largest_mib  # the runtime and its clients, and the file
    assert function["MemorySize"] >= 1.25 * (child_mib + parent_mib)
