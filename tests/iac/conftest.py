"""Fixtures for the template tests: the repository's templates, fake AWS credentials, a moto account."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE_TEMPLATE = REPO_ROOT / "template.yaml"
MODEL_TEMPLATE = REPO_ROOT / "infra" / "model-stack.yaml"
REGION = "us-east-1"

# moto warns for every resource type its CloudFormation cannot create; these are the ones the service stack
# declares (the HTTP API, its stage, the bucket policy, the CloudWatch alarms, the model updater's on-failure
# destination: those are checked on the translated template and by cfn-lint instead; the local stack hands uploads
# to the updater itself). Anything else moto skips is a test failure.
# (A warning filter cannot hold a literal colon, hence ".." for "::".)
IGNORE_MOTO_SKIPS = pytest.mark.filterwarnings(
    r"ignore:Tried to parse AWS..(ApiGatewayV2..Api|ApiGatewayV2..Stage|S3..BucketPolicy|CloudWatch..Alarm"
    r"|Lambda..EventInvokeConfig) "
    r"but it's not supported by moto's CloudFormation implementation:UserWarning"
)


@pytest.fixture(scope="module")
def aws_env() -> Iterator[None]:
    """Fake credentials and a region, so no test can reach a real account."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", REGION)
        yield


@pytest.fixture(scope="module")
def session(aws_env: None) -> Iterator[Any]:
    """A boto3 session inside one moto account that lives for the whole test module."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.Session(region_name=REGION)
