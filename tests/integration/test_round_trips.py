"""Round trips to DynamoDB do not grow with the work: calls counted per batch (batcher) and per query (frontend)
on the DynamoDB reply channel and prediction cache under moto."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_cache import DynamoDBPredictionCache
from clipper.adapters.dynamodb_replies import DynamoDBReplyChannel
from clipper.batching.core import Batcher, Inbound
from clipper.core.messages import QueryMessage, Reply, encode_rows
from clipper.frontend.query import QueryProcessor
from tests.fakes import FakeEndpoint, FakeResolver, InMemoryRegistry, ListQueue, digits_app, model_version

pytestmark = pytest.mark.integration


class Counting:
    """The client's calls by operation name."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(*args, **kwargs)

        return call


@pytest.fixture
def cache_table(aws):
    aws.dynamodb.create_table(
        TableName="cache",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return "cache"


def messages(n: int, rows: int = 1) -> list[Inbound]:
    out = []
    for i in range(n):
        payload, _ = encode_rows(np.full((rows, 64), i, dtype=np.float32))
        msg = QueryMessage(
            query_id=i,
            app="digits",
            model="mlp",
            version="1",
            input_type="floats",
            rows=rows,
            payload=payload,
            deadline_ms=2**42,
            sent_ms=0,
            reply_to=f"reply-{i:032x}",
        )
        out.append(Inbound(f"m{i}", msg.to_json()))
    return out


@pytest.mark.parametrize("n", [10, 100])
def test_a_batch_costs_the_same_dynamodb_calls_whatever_its_size(aws, cache_table, n):
    dynamodb = Counting(aws.dynamodb)
    replies = DynamoDBReplyChannel(dynamodb, aws.replies_table, ttl_s=60)
    cache = DynamoDBPredictionCache(dynamodb, cache_table, ttl_s=60)
    batcher = Batcher(FakeResolver(FakeEndpoint()), replies, SystemClock(), cache=cache)
    report = batcher.process(messages(n))
    assert report.answered == n
    # one duplicate check, one transaction of replies, one batch of cache entries (up to 100 / 100 / 25 items)
    assert dynamodb.calls == Counter(batch_get_item=1, transact_write_items=1, batch_write_item=(n + 24) // 25)
    dynamodb.calls.clear()
    again = batcher.process(messages(n))  # every one a redelivery: checked in one call, nothing written
    assert again.duplicates == n and dynamodb.calls == Counter(batch_get_item=1)


def test_duplicates_in_a_batch_of_replies_are_found_in_one_retry(aws):
    dynamodb = Counting(aws.dynamodb)
    replies = DynamoDBReplyChannel(dynamodb, aws.replies_table, ttl_s=60)
    ok = [(f"q{i}", Reply(query_id=i, model="mlp", version="1", outputs=[i])) for i in range(20)]
    assert replies.publish_many(ok[::2]) == [True] * 10
    dynamodb.calls.clear()
    assert replies.publish_many(ok) == [i % 2 == 1 for i in range(20)]
    assert dynamodb.calls == Counter(transact_write_items=2)  # cancelled once, then the new ones


def test_an_input_batch_of_100_rows_costs_a_few_calls_not_one_per_row(aws, cache_table):
    dynamodb = Counting(aws.dynamodb)
    registry = InMemoryRegistry()
    registry.apps["digits"] = digits_app(latency_slo_micros=50_000)
    registry.links["digits"] = ["mlp"]
    registry.versions[("mlp", "1")] = model_version()
    registry.active["mlp"] = "1"
    cache = DynamoDBPredictionCache(dynamodb, cache_table, ttl_s=60)
    replies = DynamoDBReplyChannel(dynamodb, aws.replies_table, ttl_s=60, poll_interval_s=0.01)
    queue = ListQueue()
    processor = QueryProcessor(registry, queue, replies, SystemClock(), lambda: 1 << 16, cache=cache)
    rows = [[float(i)] * 64 for i in range(100)]
    result = processor.predict("digits", {"input_batch": rows})
    assert len(result.predictions) == 100 and len(queue.sent) == 1  # one message for the 100 rows
    # one lookup, one transaction of 100 claims, the reply polls until the deadline, one transaction releasing them
    polls = dynamodb.calls.pop("query")
    assert dynamodb.calls == Counter(batch_get_item=1, transact_write_items=2)
    assert polls >= 1
