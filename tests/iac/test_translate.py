"""template.yaml translates offline into the CloudFormation the query path needs; code packaging."""

from __future__ import annotations

import io
import re
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from infra.local import cfn
from tests.iac.conftest import MODEL_TEMPLATE, REPO_ROOT, SERVICE_TEMPLATE

pytestmark = pytest.mark.iac


@pytest.fixture(scope="module")
def translated() -> dict[str, Any]:
    return cfn.translate_sam(SERVICE_TEMPLATE)


def of_type(template: dict[str, Any], rtype: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == rtype}


def role_statements(template: dict[str, Any], function: str) -> list[dict[str, Any]]:
    role = template["Resources"][f"{function}Role"]["Properties"]
    return [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]


def test_no_serverless_resource_survives(translated: dict[str, Any]) -> None:
    types = {r["Type"] for r in translated["Resources"].values()}

    assert not [t for t in types if t.startswith("AWS::Serverless::")]
    assert "Transform" not in translated


def test_functions_have_handlers_runtime_layer_and_local_code(translated: dict[str, Any]) -> None:
    functions = of_type(translated, "AWS::Lambda::Function")
    (layer_id,) = of_type(translated, "AWS::Lambda::LayerVersion")

    assert set(functions) == {
        "FrontendFunction",
        "BatcherFunction",
        "FeedbackFunction",
        "AdminFunction",
        "ModelUpdaterFunction",
        "CanaryReviewFunction",
    }
    for name, folder in [
        ("AdminFunction", "functions/admin"),
        ("ModelUpdaterFunction", "functions/model_updater"),
        ("FrontendFunction", "functions/frontend"),
        ("BatcherFunction", "functions/batcher"),
        ("FeedbackFunction", "functions/feedback"),
        ("CanaryReviewFunction", "functions/canary_review"),
    ]:
        props = functions[name]["Properties"]
        assert props["Handler"] == "app.handler"
        assert props["Runtime"] == "python3.12"
        assert props["Architectures"] == ["x86_64"]
        if name != "BatcherFunction":  # its tracing is a parameter (tests/iac/test_options.py)
            assert props["TracingConfig"] == {"Mode": "Active"}
        assert props["Layers"] == [{"Ref": layer_id}]
        assert props["Code"] == {"S3Bucket": cfn.LOCAL_CODE_BUCKET, "S3Key": folder}
        env = props["Environment"]["Variables"]
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "Clipper"
        assert env["CLIPPER_REPLIES_TABLE"] == {"Ref": "RepliesTable"}
        assert env["CLIPPER_REGISTRY_TABLE"] == {"Ref": "RegistryTable"}
        assert env["CLIPPER_MODEL_BUCKET"] == {"Ref": "ModelBucket"}
        assert env["REDIS_URL"] == {
            "Fn::If": [
                "UseElastiCache",
                {"Fn::Sub": "rediss://${Cache.Endpoint.Address}:${Cache.Endpoint.Port}"},
                {"Ref": "RedisUrl"},
            ]
        }
        assert env["CLIPPER_CONFIG_TTL_S"] == {"Ref": "ConfigTtlSeconds"}
    assert functions["FrontendFunction"]["Properties"]["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"] == (
        "clipper-frontend"
    )


def test_shared_layer_comes_from_the_shared_folder(translated: dict[str, Any]) -> None:
    ((_, layer),) = of_type(translated, "AWS::Lambda::LayerVersion").items()

    assert layer["Properties"]["Content"] == {"S3Bucket": cfn.LOCAL_CODE_BUCKET, "S3Key": "shared"}
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.12"]
    assert translated["Outputs"]["SharedLayerArn"]["Value"] == {"Ref": layer_id_of(translated)}


def layer_id_of(template: dict[str, Any]) -> str:
    (layer_id,) = of_type(template, "AWS::Lambda::LayerVersion")
    return layer_id


def requirement_names(lines: list[str]) -> dict[str, str]:
    """{normalised name: version specifier} of requirement lines."""
    found = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)", line)
            assert match, line
            found[match[1].lower().replace("_", "-")] = match[3]
    return found


def test_layer_requirements_are_the_runtime_dependencies() -> None:
    # boto3 included: the tracer's aws-xray-sdk brings botocore into the layer anyway, where it would shadow the
    # runtime's; shipping boto3 beside it keeps the SDK one consistent set (see shared/requirements.txt).
    layer = requirement_names((REPO_ROOT / "shared" / "requirements.txt").read_text().splitlines())
    project = requirement_names(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"])

    assert "boto3" in layer and "botocore" not in layer  # pip picks the botocore that boto3 pins
    assert set(layer) == set(project)
    assert all(spec.startswith(">=") for spec in layer.values())


def test_tables_keys_ttl_and_pitr(translated: dict[str, Any]) -> None:
    registry = translated["Resources"]["RegistryTable"]["Properties"]
    replies = translated["Resources"]["RepliesTable"]["Properties"]

    assert registry["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert registry["BillingMode"] == "PAY_PER_REQUEST"
    assert registry["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert replies["KeySchema"] == [
        {"AttributeName": "query_id", "KeyType": "HASH"},
        {"AttributeName": "model", "KeyType": "RANGE"},
    ]
    assert replies["BillingMode"] == "PAY_PER_REQUEST"
    assert replies["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}


def test_bucket_is_versioned_encrypted_and_private(translated: dict[str, Any]) -> None:
    bucket = translated["Resources"]["ModelBucket"]["Properties"]

    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    (rule,) = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert set(bucket["PublicAccessBlockConfiguration"].values()) == {True}
    assert len(bucket["PublicAccessBlockConfiguration"]) == 4


def test_http_api_has_exactly_the_query_routes(translated: dict[str, Any]) -> None:
    (api,) = of_type(translated, "AWS::ApiGatewayV2::Api").values()
    paths = api["Properties"]["Body"]["paths"]

    assert {(path, method) for path, methods in paths.items() for method in methods} == {
        ("/{app}/predict", "post"),
        ("/{app}/update", "post"),
        ("/health", "get"),
        ("/health", "head"),  # some health checkers send HEAD
        ("/metrics", "get"),
        ("/admin/ping", "get"),
        ("/admin/{operation}", "post"),
        ("/admin/apps/{app}/report", "get"),
        ("/admin/openapi.json", "get"),  # the operations' document, on AWS too (it had no route: 404)
    }
    for path, methods in paths.items():
        for method, spec in methods.items():
            security = spec.get("security", [])
            iam = isinstance(security, list) and {"AWS_IAM": []} in security
            operator = path.startswith("/admin/") or path == "/metrics"
            assert iam == operator, (path, method)  # admin routes and /metrics, and only they, need IAM
    (stage,) = of_type(translated, "AWS::ApiGatewayV2::Stage").values()
    assert stage["Properties"]["StageName"] == {"Ref": "StageName"}


def test_reserved_concurrency_is_unset_unless_given(translated: dict[str, Any]) -> None:
    reserved = translated["Resources"]["FrontendFunction"]["Properties"]["ReservedConcurrentExecutions"]

    assert reserved == {
        "Fn::If": ["HasFrontendReservedConcurrency", {"Ref": "FrontendReservedConcurrency"}, {"Ref": "AWS::NoValue"}]
    }
    assert translated["Parameters"]["FrontendReservedConcurrency"]["Default"] == ""


def test_policies_are_scoped_to_this_stack(translated: dict[str, Any]) -> None:
    frontend = role_statements(translated, "FrontendFunction")
    batcher = role_statements(translated, "BatcherFunction")
    queues = {"Fn::Sub": "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${AWS::StackName}-model-*"}

    assert all(s["Resource"] != "*" for s in frontend + batcher)
    send = next(s for s in frontend if "sqs:SendMessage" in s["Action"] and s["Resource"] == queues)
    assert "sqs:SendMessage" in send["Action"]
    feedback = next(s for s in frontend if s["Action"] == "sqs:SendMessage")
    assert feedback["Resource"] == {"Fn::GetAtt": ["FeedbackQueue", "Arn"]}
    consume = next(s for s in batcher if "sqs:ReceiveMessage" in s["Action"])
    assert set(consume["Action"]) >= {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"}
    assert consume["Resource"] == queues
    invoke = next(s for s in batcher if s["Action"] == "sagemaker:InvokeEndpoint")
    assert invoke["Resource"]["Fn::Sub"].endswith(":endpoint/${AWS::StackName}-*")
    on_registry = [s for s in frontend if s["Resource"] == {"Fn::GetAtt": ["RegistryTable", "Arn"]}]
    writes = [s for s in on_registry if any(w in a for a in _as_list(s["Action"]) for w in ("Put", "Update", "Delete"))]
    # the one write: a canary's evidence counters (clipper.adapters.dynamodb_canary), those attributes only
    (evidence,) = writes
    assert _as_list(evidence["Action"]) == ["dynamodb:UpdateItem"]
    attributes = evidence["Condition"]["ForAllValues:StringEquals"]["dynamodb:Attributes"]
    assert set(attributes) == {"pk", "sk", "version", "queries", "errors", "slo_misses"}


def test_queue_visibility_default_is_six_batcher_timeouts(translated: dict[str, Any]) -> None:
    model = cfn.load_template(MODEL_TEMPLATE)

    assert model["Parameters"]["VisibilityTimeoutSeconds"]["Default"] >= (
        6 * translated["Parameters"]["BatcherTimeout"]["Default"]
    )


def test_translation_sets_a_region_only_for_its_own_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)

    translated = cfn.translate_sam(SERVICE_TEMPLATE)

    assert "FrontendFunction" in translated["Resources"]
    assert "AWS_DEFAULT_REGION" not in os.environ


# --- packaging ------------------------------------------------------------------------------------------------


class RecordingS3:
    """Just enough of an S3 client for package_code: keeps what was put."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}

    def put_object(self, *, Bucket: str, Key: str, Body: bytes) -> dict[str, Any]:  # boto3 parameter names
        self.objects[(Bucket, Key)] = Body
        return {}


def zip_names(body: bytes) -> set[str]:
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        return set(archive.namelist())


@pytest.fixture
def code_tree(tmp_path: Path) -> Path:
    (tmp_path / "functions" / "frontend" / "__pycache__").mkdir(parents=True)
    (tmp_path / "functions" / "frontend" / "app.py").write_text("def handler(event, context):\n    return {}\n")
    (tmp_path / "functions" / "frontend" / "__pycache__" / "app.cpython-312.pyc").write_bytes(b"\0")
    (tmp_path / "shared" / "clipper").mkdir(parents=True)
    (tmp_path / "shared" / "clipper" / "__init__.py").write_text("")
    (tmp_path / "shared" / "clipper_serverless.egg-info").mkdir()
    (tmp_path / "shared" / "clipper_serverless.egg-info" / "PKG-INFO").write_text("x")
    return tmp_path


def local_template() -> dict[str, Any]:
    return {
        "Resources": {
            "Fn": {
                "Type": "AWS::Lambda::Function",
                "Properties": {"Code": {"S3Bucket": cfn.LOCAL_CODE_BUCKET, "S3Key": "functions/frontend"}},
            },
            "Layer": {
                "Type": "AWS::Lambda::LayerVersion",
                "Properties": {
                    "Content": {"S3Bucket": cfn.LOCAL_CODE_BUCKET, "S3Key": "shared"},
                    "CompatibleRuntimes": ["python3.12"],
                },
            },
            "Remote": {
                "Type": "AWS::Lambda::Function",
                "Properties": {"Code": {"S3Bucket": "elsewhere", "S3Key": "x.zip"}},
            },
        }
    }


def test_package_code_uploads_local_folders_and_rewrites_locations(code_tree: Path) -> None:
    s3 = RecordingS3()
    template = local_template()

    packaged = cfn.package_code(template, code_tree, s3, "artifacts")

    fn_code = packaged["Resources"]["Fn"]["Properties"]["Code"]
    layer_content = packaged["Resources"]["Layer"]["Properties"]["Content"]
    assert fn_code["S3Bucket"] == layer_content["S3Bucket"] == "artifacts"
    assert zip_names(s3.objects[("artifacts", fn_code["S3Key"])]) == {"app.py"}
    assert zip_names(s3.objects[("artifacts", layer_content["S3Key"])]) == {"python/clipper/__init__.py"}
    assert packaged["Resources"]["Remote"]["Properties"]["Code"] == {"S3Bucket": "elsewhere", "S3Key": "x.zip"}
    assert template == local_template()  # the input is left alone


def test_package_code_is_deterministic_and_handles_untranslated_sam(code_tree: Path) -> None:
    s3 = RecordingS3()
    sam = {
        "Resources": {
            "Fn": {"Type": "AWS::Serverless::Function", "Properties": {"CodeUri": "functions/frontend/"}},
            "S3Fn": {"Type": "AWS::Serverless::Function", "Properties": {"CodeUri": "s3://b/k.zip"}},
        }
    }

    first = cfn.package_code(local_template(), code_tree, s3, "artifacts")
    second = cfn.package_code(sam, code_tree, s3, "artifacts")

    key = first["Resources"]["Fn"]["Properties"]["Code"]["S3Key"]
    assert second["Resources"]["Fn"]["Properties"]["CodeUri"] == {"Bucket": "artifacts", "Key": key}
    assert second["Resources"]["S3Fn"]["Properties"]["CodeUri"] == "s3://b/k.zip"


def test_package_code_names_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="functions/frontend"):
        cfn.package_code(local_template(), tmp_path, RecordingS3(), "artifacts")


def test_alarms_watch_dead_letters_latency_default_rate_and_errors(translated: dict[str, Any]) -> None:
    alarms = of_type(translated, "AWS::CloudWatch::Alarm")
    assert set(alarms) == {
        "FeedbackDeadLetterAlarm",
        "UploadFailureAlarm",
        "ApiLatencyAlarm",
        "DefaultOutputRateAlarm",
        "FunctionErrorsAlarm",
        "CanaryRollbackAlarm",
    }
    assert alarms["ApiLatencyAlarm"]["Properties"]["Threshold"] == {"Ref": "AlarmLatencyMs"}
    assert alarms["ApiLatencyAlarm"]["Properties"]["ExtendedStatistic"] == "p99"
    rate = alarms["DefaultOutputRateAlarm"]["Properties"]["Metrics"]
    assert {m["MetricStat"]["Metric"]["MetricName"] for m in rate if "MetricStat" in m} == {"DefaultOutputs", "Queries"}
    assert [m["Expression"] for m in rate if "Expression" in m] == ["IF(queries > 0, defaults / queries, 0)"]
    (dashboard,) = of_type(translated, "AWS::CloudWatch::Dashboard").values()
    assert "CacheHits" in dashboard["Properties"]["DashboardBody"]["Fn::Sub"]
    upload = alarms["UploadFailureAlarm"]["Properties"]  # an upload the updater failed on every try is kept
    assert upload["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": ["UploadFailureQueue", "QueueName"]}}]
    (invoke,) = [
        r["Properties"]
        for r in of_type(translated, "AWS::Lambda::EventInvokeConfig").values()
        if r["Properties"]["FunctionName"] == {"Ref": "ModelUpdaterFunction"}
    ]
    destination = invoke["DestinationConfig"]["OnFailure"]["Destination"]
    assert destination == {"Fn::GetAtt": ["UploadFailureQueue", "Arn"]}
    rollback = alarms["CanaryRollbackAlarm"]["Properties"]
    assert (rollback["Namespace"], rollback["MetricName"]) == ("Clipper", "CanaryDecisions")
    assert rollback["Dimensions"] == [{"Name": "kind", "Value": "rollback"}]
    assert (rollback["Statistic"], rollback["Period"], rollback["Threshold"]) == ("Sum", 60, 1)
    assert rollback["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_canaries_are_reviewed_every_minute(translated: dict[str, Any]) -> None:
    rules = [r["Properties"] for r in of_type(translated, "AWS::Events::Rule").values()]
    (schedule,) = [r for r in rules if "ScheduleExpression" in r]
    assert schedule["ScheduleExpression"] == "rate(1 minute)"
    assert schedule["Targets"][0]["Arn"] == {"Fn::GetAtt": ["CanaryReviewFunction", "Arn"]}


def test_model_uploads_reach_the_updater_through_eventbridge(translated: dict[str, Any]) -> None:
    bucket = translated["Resources"]["ModelBucket"]["Properties"]
    assert bucket["NotificationConfiguration"] == {"EventBridgeConfiguration": {"EventBridgeEnabled": True}}
    (rule,) = [r for r in of_type(translated, "AWS::Events::Rule").values() if "EventPattern" in r["Properties"]]
    pattern = rule["Properties"]["EventPattern"]
    assert pattern["detail-type"] == ["Object Created"]
    assert pattern["detail"]["object"]["key"] == [{"prefix": "models/"}]
    assert rule["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": ["ModelUpdaterFunction", "Arn"]}


# Each table's TTL and point-in-time recovery, and why: what must survive an accident is recoverable, what
# is only useful for a while expires.
TABLE_DURABILITY = {
    # apps, models, versions, links: kept until deleted, recoverable; the canary evidence's feedback markers expire
    "RegistryTable": (True, True),
    "SelectionTable": (True, True),  # bandit states (learned, recoverable); feedback markers expire
    "RepliesTable": (True, False),  # a reply matters until its query's SLO: expires, nothing to recover
    "CacheTable": (True, False),  # a cache: expires, rebuilt by queries, nothing to recover
}


@pytest.mark.parametrize(("table", "durability"), TABLE_DURABILITY.items())
def test_every_table_expires_or_is_recoverable_as_its_data_needs(
    translated: dict[str, Any], table: str, durability: tuple[bool, bool]
) -> None:
    props = translated["Resources"][table]["Properties"]
    ttl, pitr = durability

    assert props.get("TimeToLiveSpecification", {}).get("Enabled", False) is ttl
    assert props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled", False) is pitr


def test_every_table_is_in_the_durability_list(translated: dict[str, Any]) -> None:
    assert set(of_type(translated, "AWS::DynamoDB::Table")) == set(TABLE_DURABILITY)


def test_the_local_stack_drops_scheduled_rules_and_keeps_the_upload_rule(translated: dict[str, Any]) -> None:
    local = cfn.without_schedules(translated)["Resources"]
    rules = {k: r["Properties"] for k, r in local.items() if r["Type"] == "AWS::Events::Rule"}
    assert (
        list(rules) == ["ModelUpdaterFunctionModelUpload"]
        and "EventPattern" in rules["ModelUpdaterFunctionModelUpload"]
    )
    assert "CanaryReviewFunctionEveryMinutePermission" not in local and "CanaryReviewFunction" in local
    assert "ModelUpdaterFunctionModelUploadPermission" in local


def frontend_version_ids(shared_content: str, frontend_code: str = "functions/frontend/") -> list[str]:
    """The logical ids of the frontend's published versions when the shared layer's content (and the frontend's
    own code) is packaged at these locations, as ``sam package`` gives each content its own S3 key."""
    template = cfn.load_template(SERVICE_TEMPLATE)
    template["Resources"]["SharedLayer"]["Properties"]["ContentUri"] = shared_content
    template["Resources"]["FrontendFunction"]["Properties"]["CodeUri"] = frontend_code
    translated = cfn.translate_template(template)
    return sorted(k for k in of_type(translated, "AWS::Lambda::Version") if k.startswith("FrontendFunctionVersion"))


def test_a_new_shared_layer_publishes_a_new_frontend_version() -> None:
    """The API calls the frontend's ``live`` alias, and SAM publishes a version only when what it hashes changes:
    without the layer in that hash, a release that changed only shared/ (nearly all of the frontend's code) left
    the alias on the old version with the old layer while every other function ran the new code."""
    one = frontend_version_ids("s3://artifacts/shared-aaaa")
    same = frontend_version_ids("s3://artifacts/shared-aaaa")
    other_layer = frontend_version_ids("s3://artifacts/shared-bbbb")
    other_code = frontend_version_ids("s3://artifacts/shared-aaaa", "s3://artifacts/frontend-cccc")

    assert len(one) == 1
    assert one == same  # an unchanged deploy publishes nothing
    assert other_layer != one
    assert other_code != one
