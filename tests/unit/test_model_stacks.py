"""The per-version model stacks' adapter where CloudFormation's answers are awkward to produce under moto: a
stack left in ROLLBACK_COMPLETE by a failed creation."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from clipper.adapters.cloudformation_stacks import CloudFormationModelStacks
from clipper.errors import Unavailable

pytestmark = pytest.mark.unit


class DeadStackCloudFormation:
    """A CloudFormation whose stack of the name exists, in the status given; what was deleted is recorded."""

    def __init__(self, status: str) -> None:
        self.status = status
        self.deleted: list[str] = []

    def create_stack(self, **request: Any) -> None:
        error = {"Error": {"Code": "AlreadyExistsException", "Message": "exists"}}
        raise ClientError(error, "CreateStack")

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        outputs = [{"OutputKey": "QueueUrl", "OutputValue": "https://queue"}]
        reason = "Resource creation cancelled"
        return {"Stacks": [{"StackStatus": self.status, "StackStatusReason": reason, "Outputs": outputs}]}

    def delete_stack(self, StackName: str) -> None:
        self.deleted.append(StackName)


def test_a_stack_left_by_a_failed_creation_is_deleted_so_the_next_try_creates_it():
    cfn = DeadStackCloudFormation("ROLLBACK_COMPLETE")
    stacks = CloudFormationModelStacks(cfn, "svc", "{}", endpoint="http://m/{model}/{version}")  # type: ignore[arg-type]

    with pytest.raises(Unavailable, match=r"had failed to create .*Resource creation cancelled"):
        stacks.create("mlp", "2", "s3://b/models/mlp/2/model.onnx", replicas=1)

    assert cfn.deleted == ["svc-model-mlp-v2"]


def test_an_existing_healthy_stack_is_reused():
    cfn = DeadStackCloudFormation("CREATE_COMPLETE")
    stacks = CloudFormationModelStacks(cfn, "svc", "{}", endpoint="http://m/{model}/{version}")  # type: ignore[arg-type]

    serving = stacks.create("mlp", "2", "s3://b/models/mlp/2/model.onnx", replicas=1)

    assert serving.queue_url == "https://queue" and serving.endpoint == "http://m/mlp/2" and cfn.deleted == []
