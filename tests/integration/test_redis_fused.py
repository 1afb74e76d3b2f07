from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from clipper.adapters.redis_cache import RedisPredictionCache
from clipper.adapters.redis_fused import RedisLookupOrSend
from clipper.adapters.redis_streams import RedisStreamRequestQueue, stream_keys
from clipper.adapters.resp import RespClient
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
