from __future__ import annotations

import asyncio
import dataclasses
import uuid

import numpy as np
import pytest
import redis

from clipper.adapters.clock import SystemClock
from clipper.adapters.redis_cache import RedisPredictionCache
from clipper.adapters.redis_fused import RedisLookupOrSend, RedisPublishAndFill
from clipper.adapters.redis_replies import RedisReplyChannel
from clipper.adapters.redis_streams import RedisStreamRequestQueue, stream_keys
from clipper.adapters.resp import RespClient
from clipper.batching.core import Batcher
from clipper.core.cache_keys import row_keys
from clipper.core.messages import QueryMessage
from tests.fakes import FakeEndpoint, FakeResolver
from tests.integration.test_round_trips import messages
from tests.services import redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def test_one_call_answers_from_the_cache_or_sends_or_waits(redis_url):  # noqa: F811
    client, look = RespClient.from_url(redis_url), redis.Redis.from_url(redis_url)
    prefix = uuid.uuid4().hex[:8]
    cache = RedisPredictionCache(client, ttl_s=60, prefix=prefix)
    queue = RedisStreamRequestQueue(client, prefix=prefix)
    fused = RedisLookupOrSend(cache, queue)
    url = "https://sqs.local/123/q-fused"
    stream = stream_keys(url, prefix).stream

    assert fused.lookup_or_send([("k1", url, "m1"), ("k2", url, "m2")], 30) == [("sent", None), ("sent", None)]
    assert [f[b"body"] for _, f in look.xrange(stream)] == [b"m1", b"m2"]
    # the same inputs again: claimed by the first query, nothing sent
    assert fused.lookup_or_send([("k1", url, "again")], 30) == [("waiting", None)]
    cache.put_many({"k1": [0.25, 0.75]})
    assert asyncio.run(fused.lookup_or_send_async([("k1", url, "m3")], 30)) == [("hit", [0.25, 0.75])]
    assert look.xlen(stream) == 2  # neither the wait nor the hit sent a message


def test_it_needs_one_client_for_the_cache_and_the_queues(redis_url):  # noqa: F811
    with pytest.raises(ValueError, match="share one Redis client"):
        RedisLookupOrSend(
            RedisPredictionCache(RespClient.from_url(redis_url)),
            RedisStreamRequestQueue(RespClient.from_url(redis_url)),
        )


class CountingClient:
    """A RespClient whose pipelines are recorded (each ``execute`` is one round trip)."""

    def __init__(self, client: RespClient) -> None:
        self._client = client
        self.pipelines: list[list[tuple]] = []

    def execute(self, commands, timeout=None):
        self.pipelines.append(list(commands))
        return self._client.execute(commands, timeout)

    def __getattr__(self, name):
        return getattr(self._client, name)


@pytest.mark.parametrize("n", [1, 20])
def test_a_batch_fills_the_cache_and_publishes_its_replies_in_one_round_trip(redis_url, n):  # noqa: F811
    counting = CountingClient(RespClient.from_url(redis_url))
    prefix = uuid.uuid4().hex[:8]
    replies = RedisReplyChannel(counting, ttl_s=60, prefix=prefix)  # type: ignore[arg-type]
    cache = RedisPredictionCache(counting, ttl_s=60, prefix=prefix)  # type: ignore[arg-type]
    batcher = Batcher(
        FakeResolver(FakeEndpoint()),
        replies,
        SystemClock(),
        cache=cache,
        publish_and_fill=RedisPublishAndFill(replies, cache),
    )
    inbound = [dataclasses.replace(m, first_delivery=True) for m in messages(n)]
    counting.pipelines.clear()
    report = batcher.process(inbound)
    assert report.answered == n
    (pipeline,) = counting.pipelines  # no duplicate check (first deliveries), one write of fill and replies
    names = [c[0] for c in pipeline]
    assert names.count("SET") == n and names.count("EVALSHA") == n
    assert max(i for i, c in enumerate(names) if c == "SET") < names.index("EVALSHA")  # cached before told
    rows = [np.full((1, 64), i, dtype=np.float32) for i in range(n)]
    keys = [k for r in rows for k in row_keys("mlp", "1", r)]
    assert cache.get_many(keys) == {k: int(FakeEndpoint().predict(r)[0]) for k, r in zip(keys, rows, strict=True)}
    for m in inbound:  # and each reply is in its inbox, once
        assert replies.answered(QueryMessage.from_json(m.body).reply_to, "mlp")


def test_publish_and_fill_needs_one_client(redis_url):  # noqa: F811
    with pytest.raises(ValueError, match="share one Redis client"):
        RedisPublishAndFill(
            RedisReplyChannel(RespClient.from_url(redis_url)), RedisPredictionCache(RespClient.from_url(redis_url))
        )
