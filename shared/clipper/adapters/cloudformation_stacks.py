"""``ServingStacks`` over CloudFormation: one stack of infra/model-stack.yaml per model version, named
``<service>-model-<ModelName>`` (ModelName from ``clipper.models.serving.stack_model_name``), inside the
service stack's IAM scope (``<service>-model-*`` queues, ``<service>-*`` endpoints).

``create`` starts the stack and waits for it (on AWS an endpoint takes minutes; locally moto is immediate),
and reuses a stack that exists (a redelivered upload event). ``scale`` updates the stack's
``InitialInstanceCount`` (the SageMaker endpoint's instances) and ``MaximumConcurrency`` (the Lambda batcher's,
at least 2), keeping every other parameter; it does not wait (an endpoint update takes minutes).

The template ships with this module: ``model-stack.yaml`` beside it is a link to infra/model-stack.yaml, which
``sam build`` copies into the shared layer as a file, so the functions create and update the stacks from the
template of the code they run (``TemplateBody``), with nothing to upload after ``sam deploy``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from clipper.adapters.aws_errors import aws_call, error_code, translate
from clipper.errors import Conflict, NotFound, Unavailable
from clipper.models.serving import SHA256_TAG, ModelArtifact, Serving, StackServesAnotherFile, stack_model_name

if TYPE_CHECKING:
    from mypy_boto3_cloudformation import CloudFormationClient

    from clipper.settings import ModelStackSettings
else:
    CloudFormationClient = Any

_CAPABILITIES: Any = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"]

# infra/model-stack.yaml as packaged with the shared layer (a link in the repository, a file once built)
PACKAGED_TEMPLATE = Path(__file__).with_name("model-stack.yaml")
# CloudFormation's limit on TemplateBody (a larger template must be given as an S3 URL)
TEMPLATE_BODY_LIMIT = 51_200
# a template's Resources section, in YAML or JSON
_HAS_RESOURCES = re.compile(r'^Resources\s*:|"Resources"\s*:', re.MULTILINE)


class CloudFormationModelStacks:
    def __init__(
        self,
        client: CloudFormationClient,
        service_stack: str,
        template: str,
        parameters: Mapping[str, str] | None = None,
        endpoint: str = "",
        wait_s: float = 900.0,
        poll_s: float = 0.5,
        role_arn: str = "",
        max_poll_s: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``template``: the template's body, or an https URL of it (``TemplateURL``). ``parameters``: the
        stack parameters every version shares (SageMakerEndpoint, ImageUri, InstanceType, LambdaBatcher...).
        ``endpoint``: the address of a version without a SageMaker endpoint (``{model}``, ``{version}``
        replaced), e.g. an HTTP model server. ``role_arn``: the CloudFormation service role that creates the
        stacks' resources (then the caller needs only ``iam:PassRole`` on it and the stack operations).
        A stack in progress is looked at after ``poll_s``, then at doubling intervals up to ``max_poll_s``: a
        queue's stack is up in seconds, an endpoint's in up to ten minutes, which at a steady 0.5 s made 1,200
        DescribeStacks calls a version (CloudFormation throttles its API per account)."""
        self._client = client
        self._service = service_stack
        source = "TemplateURL" if template.startswith("https://") else "TemplateBody"
        self._template: dict[str, Any] = {source: template}
        self._parameters = dict(parameters or {})
        self._endpoint = endpoint
        self._wait_s, self._poll_s, self._max_poll_s = wait_s, poll_s, max(poll_s, max_poll_s)
        self._sleep = sleep
        self._role: dict[str, Any] = {"RoleARN": role_arn} if role_arn else {}

    def stack_name(self, model: str, version: str) -> str:
        return f"{self._service}-model-{stack_model_name(model, version)}"

    def create(
        self, model: str, version: str, artifact: ModelArtifact, replicas: int, batching: tuple[int, int] | None = None
    ) -> Serving:
        name = self.stack_name(model, version)
        params = self._stack_parameters(model, version, artifact, replicas)
        if batching is not None:  # the model's settings, as set_model_batching maps them onto the earlier versions
            params.update(_batching_parameters(*batching))
        for last in (False, True):
            try:
                outputs = self._create(name, model, version, params, artifact.sha256)
                break
            except NotFound as e:
                # the name's stack was being deleted (DeleteStack is asynchronous: a version deleted and uploaded
                # again at once finds it DELETE_IN_PROGRESS) and is gone now: created afresh
                if last:
                    raise Unavailable(
                        f"stack {name} was being deleted while created; to be created on the next try"
                    ) from e
        endpoint = outputs.get("EndpointName")
        address = f"sagemaker:{endpoint}" if endpoint else self._endpoint.format(model=model, version=version)
        return Serving(outputs["QueueUrl"], address)

    def _create(self, name: str, model: str, version: str, params: dict[str, str], sha256: str) -> dict[str, str]:
        """Create the stack, or find it when it exists, and wait for it: its outputs; NotFound when the stack of
        that name was found being deleted and is gone. A stack that exists for another file (its sha256 tag) is
        not taken over: ``StackServesAnotherFile``."""
        tags = [{"Key": "clipper:model", "Value": model}, {"Key": "clipper:version", "Value": version}]
        if sha256:
            tags.append({"Key": SHA256_TAG, "Value": sha256})
        try:
            self._client.create_stack(
                StackName=name,
                Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()],
                Capabilities=_CAPABILITIES,
                Tags=tags,
                **self._template,
                **self._role,
            )
        except ClientError as e:
            if error_code(e) != "AlreadyExistsException":
                raise translate(e, "cloudformation.CreateStack(model)") from e
            stack = self._describe(name)
            self._clear_failed(name, stack)
            theirs = _another_file(stack, sha256)
            if theirs:
                if str(stack.get("StackStatus", "")).endswith("_IN_PROGRESS"):
                    self._wait(name)  # the upload that made it registers once it is up: then this one is looked at
                raise StackServesAnotherFile(
                    f"stack {name} serves another file (sha256 {theirs[:12]}..., not {sha256[:12]}...): another "
                    "upload of the version made it, or the version's deleted stack is still there; looked at again",
                    theirs,
                ) from e
        except BotoCoreError as e:
            raise translate(e, "cloudformation.CreateStack(model)") from e
        return self._wait(name)

    def _stack_parameters(self, model: str, version: str, artifact: ModelArtifact, replicas: int) -> dict[str, str]:
        params = {
            **self._parameters,
            "ServiceStackName": self._service,
            "ModelName": stack_model_name(model, version),
            "RegistryModelName": model,
            "RegistryModelVersion": version,
            **_scale_parameters(replicas),
        }
        if self._parameters.get("SageMakerEndpoint") == "true":
            # the version's folder, uncompressed (ModelDataSource S3Prefix): model.onnx lands in /opt/ml/model.
            # SageMaker reads the folder as it is then (no object version): the endpoint checks the file's sha256
            # against the validated one before it loads it, so a later PUT to the key is never served.
            uri = artifact.uri
            params["ModelDataUrl"] = uri if uri.endswith("/") else uri.rsplit("/", 1)[0] + "/"
            params["ModelSha256"] = artifact.sha256
        return params

    def _clear_failed(self, name: str, stack: dict[str, Any]) -> None:
        """A stack whose creation failed stays in ROLLBACK_COMPLETE, where it can only be deleted: delete it
        and fail this try, so the next one (the upload event's retry) creates it afresh instead of finding
        the dead stack again and again."""
        if stack["StackStatus"] == "ROLLBACK_COMPLETE":
            with aws_call("cloudformation.DeleteStack(model)"):
                self._client.delete_stack(StackName=name)
            reason = stack.get("StackStatusReason", "no reason given")
            raise Unavailable(f"stack {name} had failed to create ({reason}); deleted, to be created on the next try")

    def _wait(self, name: str) -> dict[str, str]:
        deadline = time.monotonic() + self._wait_s
        pause = self._poll_s
        while True:
            stack = self._describe(name)
            status = stack["StackStatus"]
            if not status.endswith("_IN_PROGRESS"):
                break
            if time.monotonic() > deadline:
                raise Unavailable(f"stack {name} still {status} after {self._wait_s:.0f} s")
            self._sleep(pause)
            pause = min(pause * 2, self._max_poll_s)
        if status not in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
            raise Unavailable(f"stack {name} is {status}: {stack.get('StackStatusReason', 'no reason given')}")
        return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}

    def _describe(self, name: str) -> dict[str, Any]:
        try:
            stacks = self._client.describe_stacks(StackName=name)["Stacks"]
        except ClientError as e:
            # DescribeStacks answers ValidationError for a stack that does not exist
            if error_code(e) == "ValidationError":
                raise NotFound("model stack", name) from e
            raise translate(e, "cloudformation.DescribeStacks(model)") from e
        except BotoCoreError as e:
            raise translate(e, "cloudformation.DescribeStacks(model)") from e
        return dict(stacks[0])

    def replicas(self, model: str, version: str) -> int:
        """The stack's InitialInstanceCount."""
        stack = self._describe(self.stack_name(model, version))
        return int(_parameters(stack).get("InitialInstanceCount", "1"))

    def scale(self, model: str, version: str, replicas: int) -> None:
        name = self.stack_name(model, version)
        self._update(name, self._describe(name), _scale_parameters(replicas))

    def busy(self, model: str, version: str) -> str | None:
        status = str(self._describe(self.stack_name(model, version))["StackStatus"])
        return status if status.endswith("_IN_PROGRESS") else None

    def set_batching(self, model: str, version: str, batch_size: int, window_s: int) -> bool:
        """The Lambda batcher's event source mapping (BatchSize, MaximumBatchingWindowInSeconds) of a version;
        False when the version has no Lambda batcher (nothing changed)."""
        name = self.stack_name(model, version)
        stack = self._describe(name)
        if _parameters(stack).get("LambdaBatcher") != "true":
            return False
        self._update(name, stack, _batching_parameters(batch_size, window_s))
        return True

    def _update(self, name: str, stack: dict[str, Any], wanted: dict[str, str]) -> None:
        """Update the parameters ``wanted`` of the stack ``name`` (as ``stack`` describes it), keeping the rest."""
        if stack["StackStatus"].endswith("_IN_PROGRESS"):  # an update takes minutes; CloudFormation queues none
            raise Conflict(f"model stack {name} is {stack['StackStatus']}; try again when that ends")
        current = _parameters(stack)
        if all(current.get(k) == v for k, v in wanted.items()):
            return  # nothing to update (CloudFormation refuses an update that changes nothing)
        # only these parameters change: the version keeps the image, instance type and the rest it has
        # (given back as values: moto's UsePreviousValue knows only the parameters passed at creation)
        parameters = [{"ParameterKey": k, "ParameterValue": v} for k, v in {**current, **wanted}.items()]
        request: dict[str, Any] = {
            "StackName": name,
            "Parameters": parameters,
            "Capabilities": _CAPABILITIES,
            **self._template,  # the same template and shared parameters as create (moto cannot reuse its own)
            **self._role,
        }
        for attempt in (1, 2):
            try:
                self._client.update_stack(**request)
                return
            except ClientError as e:
                # moto's first update of a stack whose template has resources under a false condition fails
                # with ValidationError (it sees them as added) and the second succeeds; AWS fails both times.
                if attempt == 2 or error_code(e) != "ValidationError":
                    raise translate(e, "cloudformation.UpdateStack(model)") from e
            except BotoCoreError as e:
                raise translate(e, "cloudformation.UpdateStack(model)") from e

    def delete(self, model: str, version: str) -> None:
        with aws_call("cloudformation.DeleteStack(model)"):
            self._client.delete_stack(StackName=self.stack_name(model, version))


def _parameters(stack: dict[str, Any]) -> dict[str, str]:
    return {p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])}


def _another_file(stack: Mapping[str, Any], sha256: str) -> str:
    """The sha256 of the file an existing stack was made for when it is not ``sha256`` ('' when it is, when the
    stack is being deleted (waited out), or when it was made before stacks carried the tag: taken over as
    before). Such a stack is not taken over: two uploads of one version at once (the one that made it registers,
    the other is then refused as other bytes), or a deleted version's stack still there."""
    if not sha256 or str(stack.get("StackStatus", "")).startswith("DELETE"):
        return ""
    theirs = next((t.get("Value", "") for t in stack.get("Tags", []) if t.get("Key") == SHA256_TAG), "")
    return str(theirs) if theirs and theirs != sha256 else ""


def _batching_parameters(batch_size: int, window_s: int) -> dict[str, str]:
    return {"BatchSize": str(batch_size), "MaximumBatchingWindowInSeconds": str(window_s)}


def _scale_parameters(replicas: int) -> dict[str, str]:
    return {"InitialInstanceCount": str(replicas), "MaximumConcurrency": str(max(2, replicas))}


def build_model_stacks(client: CloudFormationClient, settings: ModelStackSettings) -> CloudFormationModelStacks | None:
    """From a function's settings: None when no service stack is named (versions then share the active
    version's resources). The template: none given, the one packaged with this module; an https URL (of an S3
    object, given to CloudFormation as ``TemplateURL``); or a path (the local stack gives infra/model-stack.yaml)."""
    if not settings.service_stack_name:
        return None
    template = settings.model_stack_template
    if not template.startswith("https://"):
        template = template_body(Path(template) if template else PACKAGED_TEMPLATE)
    parameters = json.loads(settings.model_stack_parameters) if settings.model_stack_parameters else {}
    return CloudFormationModelStacks(
        client,
        settings.service_stack_name,
        template,
        parameters,
        settings.model_endpoint,
        wait_s=settings.model_stack_wait_s,
        role_arn=settings.model_stack_role_arn,
    )


def template_body(path: Path) -> str:
    """The text of the model stack template at ``path``, checked against CloudFormation's TemplateBody limit and
    for a Resources section (the functions fail at start, not at a version's first stack)."""
    body = path.read_text(encoding="utf-8")
    size = len(body.encode("utf-8"))
    if size > TEMPLATE_BODY_LIMIT:
        raise ValueError(
            f"model stack template {path} is {size} bytes, over CloudFormation's {TEMPLATE_BODY_LIMIT}-byte "
            "TemplateBody limit: upload it to S3 and set CLIPPER_MODEL_STACK_TEMPLATE to its https URL"
        )
    if not _HAS_RESOURCES.search(body):
        # e.g. the packaged link checked out as a text file holding its target (git's core.symlinks false), or a
        # container build (sam build --use-container) that copied the link without its target
        raise ValueError(
            f"model stack template {path} is not a CloudFormation template (no Resources): {body[:80]!r}; build "
            "the layer from a checkout with symbolic links (make sam-build), or set CLIPPER_MODEL_STACK_TEMPLATE"
        )
    return body
