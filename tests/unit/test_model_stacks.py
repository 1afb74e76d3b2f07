"""The per-version model stacks' adapter where CloudFormation's answers are awkward to produce under moto (a
stack left in ROLLBACK_COMPLETE by a failed creation), and the stack names: one per (model, version)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st

from clipper.adapters.cloudformation_stacks import CloudFormationModelStacks
from clipper.errors import Unavailable
from clipper.models.serving import ModelArtifact, StackServesAnotherFile, stack_model_name

pytestmark = pytest.mark.unit


class DeadStackCloudFormation:
    """A CloudFormation whose stack of the name exists, in the status given; what was deleted is recorded."""

    def __init__(self, status: str, sha256: str | None = None) -> None:
        self.status = status
        self.tags = [] if sha256 is None else [{"Key": "clipper:sha256", "Value": sha256}]
        self.deleted: list[str] = []

    def create_stack(self, **request: Any) -> None:
        error = {"Error": {"Code": "AlreadyExistsException", "Message": "exists"}}
        raise ClientError(error, "CreateStack")

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        outputs = [{"OutputKey": "QueueUrl", "OutputValue": "https://queue"}]
        reason = "Resource creation cancelled"
        stack = {"StackStatus": self.status, "StackStatusReason": reason, "Outputs": outputs, "Tags": self.tags}
        return {"Stacks": [stack]}

    def delete_stack(self, StackName: str) -> None:
        self.deleted.append(StackName)


def test_a_stack_left_by_a_failed_creation_is_deleted_so_the_next_try_creates_it():
    cfn = DeadStackCloudFormation("ROLLBACK_COMPLETE")
    stacks = CloudFormationModelStacks(cfn, "svc", "{}", endpoint="http://m/{model}/{version}")  # type: ignore[arg-type]

    with pytest.raises(Unavailable, match=r"had failed to create .*Resource creation cancelled"):
        stacks.create("mlp", "2", ModelArtifact("s3://b/models/mlp/2/model.onnx"), replicas=1)

    assert cfn.deleted == ["svc-model-mlp-v2"]


def test_an_existing_healthy_stack_is_reused():
    cfn = DeadStackCloudFormation("CREATE_COMPLETE")
    stacks = CloudFormationModelStacks(cfn, "svc", "{}", endpoint="http://m/{model}/{version}")  # type: ignore[arg-type]

    serving = stacks.create("mlp", "2", ModelArtifact("s3://b/models/mlp/2/model.onnx"), replicas=1)

    assert serving.queue_url == "https://queue" and serving.endpoint == "http://m/mlp/2" and cfn.deleted == []


def test_an_existing_stack_made_for_another_file_is_not_taken_over():
    """Two uploads of one version at once: the second's create found the first's stack and took it over, so the
    registry could describe one file while the stack served the other. Now only a stack of the same file (its
    sha256 tag), or one made before stacks carried the tag, is taken over."""
    artifact = ModelArtifact("s3://b/models/mlp/2/model.onnx", "v2", "b" * 64)
    for tagged, taken in [("a" * 64, False), ("b" * 64, True), (None, True)]:
        cfn = DeadStackCloudFormation("CREATE_COMPLETE", tagged)
        stacks = CloudFormationModelStacks(cfn, "svc", "{}", endpoint="http://m/{model}/{version}")  # type: ignore[arg-type]
        if taken:
            assert stacks.create("mlp", "2", artifact, replicas=1).queue_url == "https://queue"
        else:
            with pytest.raises(StackServesAnotherFile, match=r"serves another file \(sha256 aaaaaaaaaaaa"):
                stacks.create("mlp", "2", artifact, replicas=1)
        assert cfn.deleted == []


def test_a_new_stack_is_tagged_with_the_file_it_serves():
    cfn = RecordingCloudFormation()
    stacks = CloudFormationModelStacks(cfn, "svc", "{}", endpoint="http://m/{model}/{version}")  # type: ignore[arg-type]
    stacks.create("mlp", "2", ModelArtifact("s3://b/models/mlp/2/model.onnx", "v2", "c" * 64), replicas=1)
    assert {"Key": "clipper:sha256", "Value": "c" * 64} in cfn.requests[0]["Tags"]


class DeletingCloudFormation:
    """CloudFormation as AWS behaves after DeleteStack: the stack stays DELETE_IN_PROGRESS for a few polls (its name
    cannot be created meanwhile), then is gone (DescribeStacks by name: ValidationError, does not exist)."""

    def __init__(self, polls: int) -> None:
        self.polls, self.created = polls, 0

    def create_stack(self, **request: Any) -> None:
        if self.polls >= 0:
            raise ClientError({"Error": {"Code": "AlreadyExistsException", "Message": "exists"}}, "CreateStack")
        self.created += 1

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        if self.polls >= 0:
            self.polls -= 1
            if self.polls >= 0:
                return {"Stacks": [{"StackStatus": "DELETE_IN_PROGRESS"}]}
            error = {"Error": {"Code": "ValidationError", "Message": f"Stack with id {StackName} does not exist"}}
            raise ClientError(error, "DescribeStacks")
        return {
            "Stacks": [{"StackStatus": "CREATE_COMPLETE", "Outputs": [{"OutputKey": "QueueUrl", "OutputValue": "q"}]}]
        }


def test_a_version_uploaded_again_while_its_old_stack_is_being_deleted_gets_a_new_stack():
    """Deleted and uploaded again at once: the create found the old stack DELETE_IN_PROGRESS, waited, and took its
    disappearance for NotFound, which the updater counts as a defect: the upload was never registered."""
    cfn = DeletingCloudFormation(polls=3)
    stacks = CloudFormationModelStacks(cfn, "svc", "{}", endpoint="http://m/{model}/{version}", poll_s=0.0)  # type: ignore[arg-type]
    serving = stacks.create("mlp", "2", ModelArtifact("s3://b/models/mlp/2/model.onnx"), replicas=1)
    assert serving.queue_url == "q" and cfn.created == 1


class CreatingCloudFormation(DeadStackCloudFormation):
    """Another upload's stack, still being created: complete after a few looks."""

    def __init__(self, sha256: str) -> None:
        super().__init__("CREATE_IN_PROGRESS", sha256)
        self.looks = 0

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        self.looks += 1
        if self.looks >= 3:
            self.status = "CREATE_COMPLETE"
        return super().describe_stacks(StackName)


def test_another_uploads_stack_still_being_created_is_waited_for_before_the_upload_is_looked_at_again():
    """Its own upload registers once it is up (minutes, on SageMaker): looked at again sooner, the other upload
    would run out of its event's retries before it could be refused as other bytes."""
    cfn = CreatingCloudFormation("a" * 64)
    stacks = CloudFormationModelStacks(cfn, "svc", "{}", endpoint="http://m/{model}/{version}", poll_s=0.01)  # type: ignore[arg-type]
    with pytest.raises(StackServesAnotherFile):
        stacks.create("mlp", "2", ModelArtifact("s3://b/models/mlp/2/model.onnx", "v2", "b" * 64), replicas=1)
    assert cfn.status == "CREATE_COMPLETE" and cfn.looks >= 3


class RecordingCloudFormation(DeadStackCloudFormation):
    """A CloudFormation that creates every stack at once, recording the requests."""

    def __init__(self) -> None:
        super().__init__("CREATE_COMPLETE")
        self.requests: list[dict[str, Any]] = []

    def create_stack(self, **request: Any) -> None:
        self.requests.append(request)

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        outputs = [
            {"OutputKey": "QueueUrl", "OutputValue": "https://q"},
            {"OutputKey": "EndpointName", "OutputValue": "e"},
        ]
        return {"Stacks": [{"StackStatus": "CREATE_COMPLETE", "Outputs": outputs}]}


def test_a_sagemaker_endpoint_gets_the_validated_files_sha256_to_check_before_it_loads():
    """SageMaker downloads the version's folder as it is at creation (no S3 object version): the container refuses a
    file whose sha256 is not the validated one (a later PUT to the key)."""
    cfn = RecordingCloudFormation()
    stacks = CloudFormationModelStacks(cfn, "svc", "{}", {"SageMakerEndpoint": "true"})  # type: ignore[arg-type]
    artifact = ModelArtifact("s3://b/models/mlp/2/model.onnx", "v-3", "ab" * 32)

    assert stacks.create("mlp", "2", artifact, replicas=1).endpoint == "sagemaker:e"

    (request,) = cfn.requests
    params = {p["ParameterKey"]: p["ParameterValue"] for p in request["Parameters"]}
    assert params["ModelDataUrl"] == "s3://b/models/mlp/2/" and params["ModelSha256"] == "ab" * 32


# -- stack names: one per (model, version) ----------------------------------------------------------------------
MODEL_NAMES = st.from_regex(r"[a-z0-9][a-z0-9-]{0,63}", fullmatch=True)  # admin's AddModel rules
VERSIONS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", fullmatch=True)
STACK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,127}")  # CloudFormation's rule for a stack name


def test_models_and_versions_that_read_alike_get_stacks_of_their_own():
    stacks = CloudFormationModelStacks(DeadStackCloudFormation("CREATE_COMPLETE"), "svc", "{}")  # type: ignore[arg-type]
    pairs = [("a-v1", "2"), ("a", "1-v2"), ("a", "1-V2"), ("mlp", "V1"), ("mlp", "v1"), ("mlp", "1.0"), ("mlp", "1_0")]
    names = [stacks.stack_name(m, v) for m, v in pairs]
    assert len(set(names)) == len(pairs), names
    assert len({n.lower() for n in names}) == len(pairs), names  # SageMaker's names compare without case
    assert stacks.stack_name("mlp", "2") == "svc-model-mlp-v2"  # the common case keeps its name
    assert stacks.stack_name("digits-logreg", "12") == "svc-model-digits-logreg-v12"


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.tuples(MODEL_NAMES, VERSIONS), st.tuples(MODEL_NAMES, VERSIONS))
def test_stack_names_are_unique_per_model_version_and_fit_cloudformation(a, b):
    first, second = stack_model_name(*a), stack_model_name(*b)
    for name in (first, second):
        assert len(name) <= 30 and re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*", name), name  # the template's rule
        assert STACK_NAME.fullmatch(f"clipper-model-{name}")
    if a != b:
        assert first.lower() != second.lower(), (a, b)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(MODEL_NAMES, st.from_regex(r"[a-z0-9]{1,5}", fullmatch=True), st.from_regex(r"[a-z0-9-]{1,6}", fullmatch=True))
def test_names_built_to_collide_do_not(model, version, suffix):
    """A version with a hyphen could be read back into a different (model, version) pair: it gets a hash."""
    assert stack_model_name(model, f"{version}-v{suffix}") != stack_model_name(f"{model}-v{version}", suffix)


class SlowStackCloudFormation(DeadStackCloudFormation):
    """A stack that is CREATE_IN_PROGRESS for ``looks`` DescribeStacks calls, then CREATE_COMPLETE."""

    def __init__(self, looks: int) -> None:
        super().__init__("CREATE_IN_PROGRESS")
        self.looks = looks

    def create_stack(self, **request: Any) -> None:
        pass

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        self.looks -= 1
        if self.looks < 0:
            self.status = "CREATE_COMPLETE"
        return super().describe_stacks(StackName)


def test_a_stack_in_progress_is_looked_at_less_and_less_often():
    """An endpoint's stack takes up to ten minutes: at a steady 0.5 s that was 1,200 DescribeStacks calls a version,
    against CloudFormation's per-account API rate."""
    cfn = SlowStackCloudFormation(looks=8)
    pauses: list[float] = []
    stacks = CloudFormationModelStacks(cfn, "svc", "{}", endpoint="e", sleep=pauses.append)  # type: ignore[arg-type]

    serving = stacks.create("mlp", "2", ModelArtifact("s3://b/models/mlp/2/model.onnx"), replicas=1)

    assert serving.queue_url == "https://queue"
    assert pauses == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
