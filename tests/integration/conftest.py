from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws


@dataclass
class AwsWorld:
    dynamodb: Any
    sqs: Any
    s3: Any
    registry_table: str
    replies_table: str
    bucket: str
    queue_url: str
    dlq_url: str


def create_tables(dynamodb: Any, registry: str, replies: str) -> None:
    dynamodb.create_table(
        TableName=registry,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.create_table(
        TableName=replies,
        KeySchema=[
            {"AttributeName": "query_id", "KeyType": "HASH"},
            {"AttributeName": "model", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "query_id", "AttributeType": "S"},
            {"AttributeName": "model", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def create_queue(sqs: Any, name: str, max_receive: int = 3) -> tuple[str, str]:
    dlq_url = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"{max_receive}"}}'
    url = sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": redrive, "VisibilityTimeout": "30"})
    return url["QueueUrl"], dlq_url


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def aws(aws_env: None) -> Iterator[AwsWorld]:
    with mock_aws():
        dynamodb = boto3.client("dynamodb")
        sqs = boto3.client("sqs")
        s3 = boto3.client("s3")
        create_tables(dynamodb, "clipper-registry", "clipper-replies")
        s3.create_bucket(Bucket="clipper-models")
        queue_url, dlq_url = create_queue(sqs, "clipper-model-mlp")
        yield AwsWorld(dynamodb, sqs, s3, "clipper-registry", "clipper-replies", "clipper-models", queue_url, dlq_url)


__all__ = ["AwsWorld", "create_queue", "create_tables", "os"]
