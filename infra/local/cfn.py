"""CloudFormation plumbing for the local stack and the IaC tests.

`template.yaml` is the single source of truth for both AWS and the local stack. Locally it is translated
offline with aws-sam-translator (what `sam build`/`sam deploy` would hand to CloudFormation), its code folders
are zipped into an S3 bucket, and the result is created in CloudFormation - moto's, in process
(`moto.mock_aws`) or through its server (boto3 honours AWS_ENDPOINT_URL). `infra/model-stack.yaml` is plain
CloudFormation, one stack per model.

    deploy_service(clients, "clipper", repo_root, {"StageName": "prod"})
        -> translate_sam -> package_code -> deploy_stack -> enable TTL -> outputs
    deploy_model_stack(cfn, "clipper", "logreg", {...}) -> outputs (QueueUrl, QueueArn, ...)

moto traps this module works around (see also the handbook):
- a raw SAM template "succeeds" in moto while dropping every AWS::Serverless::* resource: always translate;
- aws-sam-translator rejects a local CodeUri/ContentUri (it wants s3://), so translation first swaps each local
  path for an S3 location in the sentinel bucket LOCAL_CODE_BUCKET, and package_code uploads and rewrites it;
- moto skips AWS::ApiGatewayV2::* with a warning (the HTTP API exists only on AWS);
- DynamoDB TTL declared in a template stays disabled in moto, so deploy_service enables it afterwards;
- an SQS event source mapping in moto invokes the Lambda through Docker once a message arrives, so the local
  stack keeps the model stacks' LambdaBatcher 'false' and runs the long-poll batcher instead;
- moto's CloudFormation has no AWS::Lambda::Alias (the frontend's AutoPublishAlias), and a permission on a
  skipped alias fails the stack, so deploy_service points whatever names an alias at the alias's function
  (locally the FrontendAliasArn output is the function's name; nothing local invokes through the alias);
- moto's EventBridge takes a rule without an event pattern (a schedule: CanaryReviewFunction's) as matching
  every event, and fails PutEvents on its Lambda target, so the bucket's upload events would never reach the
  local dispatcher: deploy_service drops scheduled rules and their invoke permissions (nothing local runs a
  schedule; the local feedback worker reviews the canaries each second instead).

Nothing here runs at import time.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import time
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE_TEMPLATE = "template.yaml"
MODEL_STACK_TEMPLATE = Path("infra") / "model-stack.yaml"

# An S3 bucket name no real bucket can have (underscores are invalid): marks "this key is a local path".
LOCAL_CODE_BUCKET = "__local_code__"

# SAM resource type -> property that holds its code location.
_SAM_CODE_PROPERTIES = {
    "AWS::Serverless::Function": "CodeUri",
    "AWS::Serverless::LayerVersion": "ContentUri",
}
# CloudFormation resource type -> property that holds its {S3Bucket, S3Key} code location.
_CFN_CODE_PROPERTIES = {
    "AWS::Lambda::Function": "Code",
    "AWS::Lambda::LayerVersion": "Content",
}
_SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".aws-sam"}
_SKIPPED_SUFFIXES = (".pyc", ".pyo")
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same folder always gives the same zip

_CAPABILITIES = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"]
_IN_PROGRESS_SUFFIX = "_IN_PROGRESS"

# Offline stand-in for IAM ListPolicies: managed policies a template may name in a function's `Policies`.
_MANAGED_POLICIES = {
    "AWSLambdaBasicExecutionRole": "service-role/AWSLambdaBasicExecutionRole",
    "AWSLambdaSQSQueueExecutionRole": "service-role/AWSLambdaSQSQueueExecutionRole",
    "AWSLambdaVPCAccessExecutionRole": "service-role/AWSLambdaVPCAccessExecutionRole",
    "AWSXrayWriteOnlyAccess": "AWSXrayWriteOnlyAccess",
    "AmazonS3ReadOnlyAccess": "AmazonS3ReadOnlyAccess",
    "AmazonDynamoDBReadOnlyAccess": "AmazonDynamoDBReadOnlyAccess",
    "CloudWatchLambdaInsightsExecutionRolePolicy": "CloudWatchLambdaInsightsExecutionRolePolicy",
}


class StackDeployError(RuntimeError):
    """A stack did not reach CREATE_COMPLETE; the message carries the failed resources' reasons."""


class OfflinePolicyLoader:
    """The managed-policy loader aws-sam-translator asks for, answered without calling IAM."""

    def __init__(self, partition: str = "aws", extra: Mapping[str, str] | None = None) -> None:
        self._policies = {name: f"arn:{partition}:iam::aws:policy/{path}" for name, path in _MANAGED_POLICIES.items()}
        self._policies.update(extra or {})

    def load(self) -> dict[str, str]:
        return dict(self._policies)


# --- translation ----------------------------------------------------------------------------------------------


def load_template(template_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a CloudFormation/SAM YAML (or JSON) template; short-form intrinsics become their long form."""
    from samtranslator.yaml_helper import yaml_parse

    parsed: dict[str, Any] = yaml_parse(Path(template_path).read_text(encoding="utf-8"))
    return parsed


def translate_sam(template_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Translate a SAM template to plain CloudFormation, offline.

    Local code paths (CodeUri/ContentUri, relative to the template's folder) come out as
    `{"S3Bucket": LOCAL_CODE_BUCKET, "S3Key": "<relative path>"}`; `package_code` uploads them.
    """
    return translate_template(load_template(template_path))


def translate_template(template: dict[str, Any]) -> dict[str, Any]:
    """``translate_sam`` of a template already parsed (``load_template``); ``template`` is not changed."""
    from samtranslator.translator.transform import transform

    template = _mark_local_code(template)
    with _default_region():
        translated: dict[str, Any] = transform(template, {}, OfflinePolicyLoader())
    return translated


def _mark_local_code(template: dict[str, Any]) -> dict[str, Any]:
    template = copy.deepcopy(template)
    function_globals = template.get("Globals", {}).get("Function", {})
    if _is_local_path(function_globals.get("CodeUri")):
        function_globals["CodeUri"] = _sentinel_location(function_globals["CodeUri"])
    for resource in template.get("Resources", {}).values():
        prop = _SAM_CODE_PROPERTIES.get(resource.get("Type", ""))
        properties = resource.get("Properties", {})
        if prop and _is_local_path(properties.get(prop)):
            properties[prop] = _sentinel_location(properties[prop])
    return template


def _is_local_path(value: object) -> bool:
    return isinstance(value, str) and not value.startswith("s3://")


def _sentinel_location(path: str) -> dict[str, str]:
    key = PurePosixPath(path.replace("\\", "/")).as_posix()
    return {"Bucket": LOCAL_CODE_BUCKET, "Key": key}


@contextlib.contextmanager
def _default_region() -> Iterator[None]:
    """aws-sam-translator reads the region from boto3's default session: make sure there is one."""
    original = os.environ.get("AWS_DEFAULT_REGION")
    if original:
        yield
        return
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    try:
        yield
    finally:
        if original is None:
            os.environ.pop("AWS_DEFAULT_REGION", None)
        else:
            os.environ["AWS_DEFAULT_REGION"] = original


# --- packaging ------------------------------------------------------------------------------------------------


def package_code(
    template: dict[str, Any], repo_root: str | os.PathLike[str], s3_client: Any, bucket: str
) -> dict[str, Any]:
    """Zip every local code folder the template names, upload it to `bucket`, point the template there.

    Handles translated templates (AWS::Lambda::Function `Code`, AWS::Lambda::LayerVersion `Content` in the
    sentinel bucket) and untranslated SAM ones (local `CodeUri`/`ContentUri`). Paths resolve against
    `repo_root` (the template's folder). A Python layer's files go under `python/`, as `sam build` lays them
    out; its requirements are not installed (moto never runs the code). Returns a new template.
    """
    root = Path(repo_root)
    packaged = copy.deepcopy(template)
    uploaded: dict[str, str] = {}

    def upload(path: str, python_layer: bool) -> str:
        if path not in uploaded:
            body = _zip_path(root / path, python_layer)
            stem = path.strip("/").replace("/", "-") or "root"
            key = f"code/{stem}-{hashlib.sha256(body).hexdigest()[:16]}.zip"
            s3_client.put_object(Bucket=bucket, Key=key, Body=body)
            uploaded[path] = key
        return uploaded[path]

    for resource in packaged.get("Resources", {}).values():
        rtype = resource.get("Type", "")
        properties = resource.get("Properties", {})
        python_layer = rtype.endswith("LayerVersion") and _is_python_layer(properties)
        if rtype in _CFN_CODE_PROPERTIES:
            location = properties.get(_CFN_CODE_PROPERTIES[rtype])
            if isinstance(location, dict) and location.get("S3Bucket") == LOCAL_CODE_BUCKET:
                key = upload(location["S3Key"], python_layer)
                properties[_CFN_CODE_PROPERTIES[rtype]] = {"S3Bucket": bucket, "S3Key": key}
        elif rtype in _SAM_CODE_PROPERTIES:
            prop = _SAM_CODE_PROPERTIES[rtype]
            location = properties.get(prop)
            if isinstance(location, dict) and location.get("Bucket") == LOCAL_CODE_BUCKET:
                location = location["Key"]
            if _is_local_path(location):
                properties[prop] = {"Bucket": bucket, "Key": upload(location, python_layer)}
    return packaged


def _is_python_layer(properties: Mapping[str, Any]) -> bool:
    runtimes = properties.get("CompatibleRuntimes") or []
    return bool(runtimes) and all(str(r).startswith("python") for r in runtimes)


def _zip_path(path: Path, python_layer: bool) -> bytes:
    if path.is_file() and path.suffix == ".zip":
        return path.read_bytes()
    if not path.is_dir():
        raise FileNotFoundError(f"code location {path} is neither a folder nor a .zip file")
    prefix = "python/" if python_layer and not (path / "python").is_dir() else ""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(_code_files(path)):
            info = zipfile.ZipInfo(prefix + file.relative_to(path).as_posix(), date_time=_ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, file.read_bytes())
    return buffer.getvalue()


def _code_files(folder: Path) -> Iterator[Path]:
    for entry in folder.iterdir():
        if entry.is_dir():
            if entry.name not in _SKIPPED_DIRS and not entry.name.endswith(".egg-info"):
                yield from _code_files(entry)
        elif entry.is_file() and not entry.name.endswith(_SKIPPED_SUFFIXES):
            yield entry


# --- stacks ---------------------------------------------------------------------------------------------------


def deploy_stack(
    cfn_client: Any,
    name: str,
    template_body: dict[str, Any] | str,
    parameters: Mapping[str, str] | None = None,
    *,
    timeout_s: float = 600.0,
    poll_s: float = 0.2,
) -> dict[str, str]:
    """Create a stack, wait for CREATE_COMPLETE and return its outputs as {OutputKey: OutputValue}. A stack of that
    name created already (a restore into a restarted moto tried again after its deploy had worked) is taken as it
    is: its outputs."""
    from botocore.exceptions import ClientError

    body = template_body if isinstance(template_body, str) else json.dumps(template_body, separators=(",", ":"))
    try:
        cfn_client.create_stack(
            StackName=name,
            TemplateBody=body,
            Parameters=[{"ParameterKey": k, "ParameterValue": str(v)} for k, v in (parameters or {}).items()],
            Capabilities=_CAPABILITIES,
        )
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") != "AlreadyExistsException":
            raise StackDeployError(f"stack {name}: create_stack refused: {e}") from e

    deadline = time.monotonic() + timeout_s
    while True:
        stack = cfn_client.describe_stacks(StackName=name)["Stacks"][0]
        status = stack["StackStatus"]
        if not status.endswith(_IN_PROGRESS_SUFFIX):
            break
        if time.monotonic() > deadline:
            raise StackDeployError(f"stack {name}: still {status} after {timeout_s:.0f} s")
        time.sleep(poll_s)
    if status != "CREATE_COMPLETE":
        raise StackDeployError(f"stack {name}: {status}: {'; '.join(_failure_reasons(cfn_client, name))}")
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def _failure_reasons(cfn_client: Any, name: str) -> list[str]:
    reasons = []
    for page in cfn_client.get_paginator("describe_stack_events").paginate(StackName=name):
        for event in page["StackEvents"]:
            if event.get("ResourceStatus", "").endswith("FAILED"):
                reason = event.get("ResourceStatusReason", "no reason given")
                reasons.append(f"{event.get('LogicalResourceId')}: {reason}")
    return reasons or ["no failure events recorded"]


def stack_resources(cfn_client: Any, name: str) -> dict[str, str]:
    """{logical id: physical id} of a stack's resources."""
    resources = {}
    for page in cfn_client.get_paginator("list_stack_resources").paginate(StackName=name):
        for summary in page["StackResourceSummaries"]:
            if summary.get("LogicalResourceId"):  # moto lists the resources it skipped with empty ids
                resources[summary["LogicalResourceId"]] = summary.get("PhysicalResourceId", "")
    return resources


def deploy_service(
    session_or_clients: Any,
    stack_name: str,
    repo_root: str | os.PathLike[str] = REPO_ROOT,
    parameters: Mapping[str, str] | None = None,
    *,
    physical_names: bool = False,
) -> dict[str, str]:
    """Translate, package and create template.yaml as `stack_name`; return its outputs.

    `session_or_clients` is a boto3 Session or a mapping with "cloudformation", "s3" and "dynamodb" clients
    (and optionally "lambda", to repair layer outputs under moto). The code goes to a bucket
    `<stack_name>-artifacts`, created when missing. `physical_names`: see `with_physical_names`.
    """
    cfn = _client(session_or_clients, "cloudformation")
    s3 = _client(session_or_clients, "s3")
    dynamodb = _client(session_or_clients, "dynamodb")
    lambda_client = _client(session_or_clients, "lambda", required=False)

    translated = translate_sam(Path(repo_root) / SERVICE_TEMPLATE)
    if physical_names:
        translated = with_physical_names(translated, stack_name)
    bucket = artifacts_bucket_name(stack_name)
    _ensure_bucket(s3, bucket)
    packaged = without_schedules(without_aliases(package_code(translated, repo_root, s3, bucket)))
    outputs = deploy_stack(cfn, stack_name, packaged, parameters)
    _enable_declared_ttl(dynamodb, translated, stack_resources(cfn, stack_name))
    if lambda_client is not None:
        outputs = _repair_layer_outputs(lambda_client, translated, stack_name, outputs)
    return outputs


# resource type -> (name property, whether the name must be lower case)
_NAMEABLE = {
    "AWS::DynamoDB::Table": ("TableName", False),
    "AWS::S3::Bucket": ("BucketName", True),
    "AWS::SQS::Queue": ("QueueName", False),
}


def with_physical_names(template: dict[str, Any], stack_name: str) -> dict[str, Any]:
    """A copy of a template whose tables, buckets and queues without a name are named `<stack>-<LogicalId>`.

    CloudFormation (and moto's) names them `<stack>-<LogicalId>-<random suffix>`: a new suffix each time the
    stack is created. The local stack creates its stack afresh at every start (and after its emulator
    restarts), and names that stay the same keep what refers to them valid: the processes' settings, the
    artifact URLs in the registry, the state copied out of moto. Only the local stack asks for this.
    """
    named = copy.deepcopy(template)
    for logical_id, resource in named.get("Resources", {}).items():
        prop, lower = _NAMEABLE.get(resource.get("Type", ""), ("", False))
        if not prop:
            continue
        properties = resource.setdefault("Properties", {})
        if prop in properties:
            continue
        name = f"{stack_name}-{logical_id}"
        if lower:
            name = name.lower()
        if resource["Type"] == "AWS::SQS::Queue" and properties.get("FifoQueue") in (True, "true"):
            name += ".fifo"
        properties[prop] = name
    return named


def without_aliases(template: dict[str, Any]) -> dict[str, Any]:
    """A copy of a translated template with each AWS::Lambda::Alias removed and references to it (Ref, GetAtt,
    ${...} in Fn::Sub) pointed at the alias's function; for moto, whose CloudFormation has no aliases."""
    resources = template.get("Resources", {})
    targets = {
        logical_id: resource["Properties"]["FunctionName"]["Ref"]
        for logical_id, resource in resources.items()
        if resource.get("Type") == "AWS::Lambda::Alias"
        and isinstance(resource.get("Properties", {}).get("FunctionName"), dict)
        and "Ref" in resource["Properties"]["FunctionName"]
    }
    if not targets:
        return template

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            if set(node) == {"Ref"} and node["Ref"] in targets:
                return {"Ref": targets[node["Ref"]]}
            if set(node) == {"Fn::GetAtt"} and node["Fn::GetAtt"][0] in targets:
                return {"Fn::GetAtt": [targets[node["Fn::GetAtt"][0]], *node["Fn::GetAtt"][1:]]}
            if set(node) == {"Fn::Sub"} and isinstance(node["Fn::Sub"], str):
                text = node["Fn::Sub"]
                for alias, function in targets.items():
                    text = text.replace("${" + alias + "}", "${" + function + "}")
                return {"Fn::Sub": text}
            return {key: rewrite(value) for key, value in node.items()}
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        return node

    rewritten: dict[str, Any] = rewrite({k: v for k, v in template.items()})
    rewritten["Resources"] = {k: v for k, v in rewritten["Resources"].items() if k not in targets}
    return rewritten


def without_schedules(template: dict[str, Any]) -> dict[str, Any]:
    """A copy of a translated template without its scheduled EventBridge rules and the permissions that let them
    invoke a function; for moto (see the module docstring)."""
    resources = template.get("Resources", {})
    rules = {
        logical_id
        for logical_id, resource in resources.items()
        if resource.get("Type") == "AWS::Events::Rule" and "ScheduleExpression" in resource.get("Properties", {})
    }
    if not rules:
        return template

    def invoked_by_rule(resource: Mapping[str, Any]) -> bool:
        source = resource.get("Properties", {}).get("SourceArn")
        return (
            resource.get("Type") == "AWS::Lambda::Permission"
            and isinstance(source, dict)
            and (source.get("Fn::GetAtt", [None])[0] in rules)
        )

    kept = {k: v for k, v in resources.items() if k not in rules and not invoked_by_rule(v)}
    return {**template, "Resources": kept}


def model_stack_name(service_stack: str, model_name: str) -> str:
    return f"{service_stack}-model-{model_name}"


def deploy_model_stack(
    cfn_client: Any,
    service_stack: str,
    model_name: str,
    parameters: Mapping[str, str] | None = None,
    *,
    repo_root: str | os.PathLike[str] = REPO_ROOT,
) -> dict[str, str]:
    """Create infra/model-stack.yaml for one model as `<service_stack>-model-<model_name>`; return outputs."""
    template = load_template(Path(repo_root) / MODEL_STACK_TEMPLATE)
    merged = {**(parameters or {}), "ServiceStackName": service_stack, "ModelName": model_name}
    return deploy_stack(cfn_client, model_stack_name(service_stack, model_name), template, merged)


def artifacts_bucket_name(stack_name: str) -> str:
    return f"{stack_name.lower()}-artifacts"


def _client(session_or_clients: Any, service: str, *, required: bool = True) -> Any:
    if isinstance(session_or_clients, Mapping):
        return session_or_clients[service] if required else session_or_clients.get(service)
    return session_or_clients.client(service)


def _ensure_bucket(s3_client: Any, bucket: str) -> None:
    from botocore.exceptions import ClientError

    try:
        s3_client.head_bucket(Bucket=bucket)
        return
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise
    region = s3_client.meta.region_name
    if region and region != "us-east-1":
        s3_client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
    else:
        s3_client.create_bucket(Bucket=bucket)


def _repair_layer_outputs(
    lambda_client: Any, template: Mapping[str, Any], stack_name: str, outputs: dict[str, str]
) -> dict[str, str]:
    # moto resolves `Ref` to an AWS::Lambda::LayerVersion as the Python repr of its model object (it has no
    # physical id), and names the layer "<stack>-<logical id>-<suffix>", ignoring LayerName. Look the ARN up.
    # On AWS the output already is an ARN and nothing happens.
    resources = template.get("Resources", {})
    repaired = dict(outputs)
    for key, output in template.get("Outputs", {}).items():
        ref = output.get("Value", {}).get("Ref") if isinstance(output.get("Value"), dict) else None
        if key not in outputs or outputs[key].startswith("arn:"):
            continue
        if resources.get(ref, {}).get("Type") != "AWS::Lambda::LayerVersion":
            continue
        prefix = f"{stack_name}-{ref}-"
        for page in lambda_client.get_paginator("list_layers").paginate():
            for layer in page["Layers"]:
                if layer["LayerName"].startswith(prefix):
                    repaired[key] = layer["LatestMatchingVersion"]["LayerVersionArn"]
    return repaired


def _enable_declared_ttl(dynamodb: Any, template: Mapping[str, Any], resources: Mapping[str, str]) -> None:
    # CloudFormation on AWS applies TimeToLiveSpecification; moto's CloudFormation creates the table but leaves
    # TTL DISABLED, so expired replies would never go away locally and tests of the TTL contract would lie.
    # Apply what the template declares, only where the table does not already have it.
    for logical_id, resource in template.get("Resources", {}).items():
        if resource.get("Type") != "AWS::DynamoDB::Table" or logical_id not in resources:
            continue
        spec = resource.get("Properties", {}).get("TimeToLiveSpecification") or {}
        if spec.get("Enabled") is not True or not isinstance(spec.get("AttributeName"), str):
            continue
        table = resources[logical_id]
        current = dynamodb.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
        if current.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
            continue
        dynamodb.update_time_to_live(
            TableName=table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": spec["AttributeName"]},
        )
