from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import numpy as np
import pytest
from moto import mock_aws

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.core.domain import Application, InputType, ModelVersion
from tests.events import LambdaContext, sqs_event
from tests.integration.conftest import aws_env, create_queue, create_tables  # noqa: F401  (fixture)
from tests.services import redis_url, start_endpoint, stop  # noqa: F401  (fixture)


class EventSourceMapping(threading.Thread):
    """Does what Lambda's SQS event source mapping does, in process: receive a batch, invoke the
    batcher handler with a real SQS event, delete what succeeded, and let failed records return."""

    def __init__(self, sqs: Any, queue_url: str, handler: Any) -> None:
        super().__init__(daemon=True)
        self.sqs, self.queue_url, self.handler = sqs, queue_url, handler
        self.arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.running = threading.Event()
        self.running.set()
        self.halt = threading.Event()
        self._polling = threading.Lock()  # held through each receive, invoke and delete
        self.invocations: list[dict[str, Any]] = []

    def poll_once(self) -> int:
        got = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            MessageSystemAttributeNames=["All"],
        ).get("Messages", [])
        if not got:
            return 0
        response = self.handler(sqs_event(got, self.arn), LambdaContext(function_name="batcher"))
        self.invocations.append(response)
        failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
        for m in got:
            if m["MessageId"] in failed:
                # visible again at once, so the retries of a test take no visibility timeout
                self.sqs.change_message_visibility(
                    QueueUrl=self.queue_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                )
            else:
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=m["ReceiptHandle"])
        return len(got)

    def pause(self) -> None:
        """Stop receiving, once the poll in flight (if any) has deleted what it handled: a test that pauses the
        mapping after an answer must not find that query's message still in the queue, nor have a query sent
        after the pause received."""
        self.running.clear()
        with self._polling:
            pass

    def run(self) -> None:
        while not self.halt.is_set():
            with self._polling:
                polled = self.poll_once() if self.running.is_set() else 0
            if polled == 0:
                time.sleep(0.005)


def fresh_import(name: str) -> Any:
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@dataclass
class Stack:
    frontend: Any
    batcher: Any
    esm: EventSourceMapping
    registry: DynamoDBRegistry
    sqs: Any
    queue_url: str
    dlq_url: str
    endpoint_url: str
    holdout_x: np.ndarray
    expected: np.ndarray
    extra: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(params=["redis", "dynamodb"])
def stack(request, aws_env, demo_models, monkeypatch) -> Iterator[Stack]:  # noqa: F811
    from pathlib import Path

    import onnxruntime as ort

    root = Path(demo_models["out_dir"])
    mlp = next(m for m in demo_models["models"] if m["name"] == "mlp")
    mlp_path = str(root / mlp["path"])
    holdout = np.load(root / demo_models["dataset"]["holdout"])
    x = holdout["X"][:20].astype(np.float32)
    session = ort.InferenceSession(mlp_path, providers=["CPUExecutionProvider"])
    expected = session.run(None, {session.get_inputs()[0].name: x})[0]
    proc, url = start_endpoint(mlp_path)
    env = {
        "CLIPPER_REGISTRY_TABLE": "e2e-registry",
        "CLIPPER_REPLIES_TABLE": "e2e-replies",
        "CLIPPER_CACHE_TABLE": "e2e-cache",
        "CLIPPER_SELECTION_TABLE": "e2e-selection",
        "CLIPPER_MODEL_BUCKET": "e2e-models",
        "CLIPPER_CONFIG_TTL_S": "0",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    if request.param == "redis":
        env["REDIS_URL"] = request.getfixturevalue("redis_url")
        import redis

        redis.Redis.from_url(env["REDIS_URL"]).flushdb()  # no cached prediction from an earlier test
    else:
        monkeypatch.delenv("REDIS_URL", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        with mock_aws():
            dynamodb, sqs, s3 = boto3.client("dynamodb"), boto3.client("sqs"), boto3.client("s3")
            create_tables(dynamodb, "e2e-registry", "e2e-replies")
            dynamodb.create_table(
                TableName="e2e-cache",
                KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
            s3.create_bucket(Bucket="e2e-models")
            queue_url, dlq_url = create_queue(sqs, "e2e-model-mlp", max_receive=3)
            feedback_url, _ = create_queue(sqs, "e2e-feedback", max_receive=5)
            monkeypatch.setenv("CLIPPER_FEEDBACK_QUEUE_URL", feedback_url)
            dynamodb.create_table(
                TableName="e2e-selection",
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                AttributeDefinitions=[
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                ],
                BillingMode="PAY_PER_REQUEST",
            )
            registry = DynamoDBRegistry(dynamodb, "e2e-registry")
            registry.put_app(Application("digits", InputType.FLOATS, "-1", 3_000_000, (64,)))
            registry.link("digits", "mlp")
            registry.put_version(ModelVersion("mlp", "1", InputType.FLOATS, queue_url, url, (64,)), activate=True)
            monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "clipper-frontend")  # each function's, as the template
            frontend = fresh_import("functions.frontend.app")
            monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "clipper-batcher")
            batcher = fresh_import("functions.batcher.app")
            esm = EventSourceMapping(sqs, queue_url, batcher.handler)
            esm.start()
            try:
                extra = {"feedback_url": feedback_url, "dynamodb": dynamodb}
                yield Stack(frontend, batcher, esm, registry, sqs, queue_url, dlq_url, url, x, expected, extra)
            finally:
                esm.halt.set()
                esm.join(timeout=10)
                # the module's canary tally thread, stopped while the emulated AWS still answers (left running, it
                # read a registry that was gone each second until the session ended)
                frontend.processor.tally.stop()
    finally:
        stop(proc)
