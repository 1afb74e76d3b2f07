"""The feedback worker over real queue messages (moto's SQS, with a redrive policy) and the real adapters it
runs with (DynamoDB registry, selection store and prediction cache): feedback for a deleted application is
acknowledged, a message that does not decode is moved to the dead-letter queue with its reason, and the
good feedback behind them is applied, while the worker keeps polling."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from clipper.adapters.dynamodb_cache import DynamoDBPredictionCache
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
from clipper.adapters.sqs import SqsQueueReader
from clipper.adapters.sqs_dead_letter import REASON_ATTRIBUTE, SqsDeadLetterQueue
from clipper.core.cache_keys import record_keys
from clipper.core.messages import encode_rows
from clipper.entrypoints.feedback_worker import FeedbackWorker
from clipper.feedback import FeedbackMessage, FeedbackProcessor
from clipper.selection import Selection, state_key
from tests.fakes import digits_app
from tests.integration.conftest import create_queue

pytestmark = pytest.mark.integration

ROWS = np.eye(64, dtype=np.float32)[5:6]


@pytest.fixture
def world(aws):
    aws.dynamodb.create_table(
        TableName="selection",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    aws.dynamodb.create_table(
        TableName="cache",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    cache = DynamoDBPredictionCache(aws.dynamodb, "cache", ttl_s=3600)
    for name in ("gone", "kept"):  # both queried (their predictions recorded), then "gone" deleted
        registry.put_app(digits_app(name=name, policy="exp4"))
        for model in ("a", "b"):
            registry.link(name, model)
        (key,) = record_keys(name, None, ROWS)
        selection = Selection("exp4", ("a", "b"), {"a": 0.5, "b": 0.5}, 0)
        cache.put_many({key: {"selection": selection.to_dict(), "outputs": {"a": 5, "b": 0}}})
    registry.delete_app("gone")
    store = DynamoDBSelectionStore(aws.dynamodb, "selection")
    queue_url, dlq_url = create_queue(aws.sqs, "clipper-feedback", max_receive=5)
    return FeedbackProcessor(registry, store, cache), store, queue_url, dlq_url


def feedback(app: str) -> str:
    return FeedbackMessage(feedback_id=f"fb-{app}", app=app, payload=encode_rows(ROWS)[0], label=5).to_json()


def queue_depth(sqs, url: str) -> int:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return sum(int(attributes[n]) for n in names)


def test_the_worker_skips_what_it_cannot_apply_and_applies_the_rest(aws, world):
    processor, store, queue_url, dlq_url = world
    for body in (feedback("gone"), '{"v": 1, "app": "kept"}', feedback("kept")):
        aws.sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    dlq = SqsDeadLetterQueue.of(aws.sqs, queue_url)
    assert dlq is not None and dlq.url == dlq_url
    worker = FeedbackWorker(SqsQueueReader(aws.sqs, queue_url), processor.process, dead_letter=dlq.send)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop, 0, 0.05), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while sum(worker.counts.values()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert thread.is_alive()  # still polling
    stop.set()
    thread.join(timeout=10)

    assert worker.counts == {"unknown_app": 1, "dead_lettered": 1, "applied": 1}
    kept = store.load(state_key("kept"))
    assert kept is not None and kept.updates == 1 and kept.weights["a"] > kept.weights["b"]
    assert store.load(state_key("gone")) is None  # nothing learnt for the deleted application
    assert queue_depth(aws.sqs, queue_url) == 0  # every message acknowledged or moved, none left to retry
    moved = aws.sqs.receive_message(QueueUrl=dlq_url, MessageAttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in moved] == ['{"v": 1, "app": "kept"}']
    assert "not a feedback message" in moved[0]["MessageAttributes"][REASON_ATTRIBUTE]["StringValue"]
