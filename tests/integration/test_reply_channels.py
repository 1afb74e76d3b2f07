from __future__ import annotations

import threading
import time

import pytest
import redis

from clipper.adapters.dynamodb_replies import DynamoDBReplyChannel
from clipper.adapters.redis_replies import RedisReplyChannel
from clipper.core.messages import Reply
from clipper.errors import Unavailable
from tests.services import redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", "dynamodb"])
def channel(request):
    if request.param == "redis":
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        client.flushdb()
        return RedisReplyChannel(client, ttl_s=60)
    aws = request.getfixturevalue("aws")
    return DynamoDBReplyChannel(aws.dynamodb, aws.replies_table, ttl_s=60, poll_interval_s=0.005)


def ok(model: str = "mlp", outputs=(1,)) -> Reply:
    return Reply(query_id=1, model=model, version="1", outputs=list(outputs))


def test_publish_then_wait(channel):
    assert channel.publish("q1", ok())
    (reply,) = channel.wait("q1", 1, timeout_s=1.0)
    assert reply.outputs == [1] and channel.answered("q1", "mlp")
    assert not channel.answered("q1", "other")


def test_duplicate_success_is_dropped(channel):
    assert channel.publish("q2", ok())
    assert not channel.publish("q2", ok(outputs=(9,)))
    assert [r.outputs for r in channel.wait("q2", 2, timeout_s=0.2)] == [[1]]


def test_error_then_retry_success(channel):
    err = Reply(query_id=1, model="mlp", version="1", error="boom", error_kind="endpoint")
    assert channel.publish("q3", err)
    assert not channel.answered("q3", "mlp")
    assert channel.publish("q3", ok())
    assert channel.answered("q3", "mlp")


def test_wait_returns_empty_at_the_timeout(channel):
    start = time.monotonic()
    assert channel.wait("nobody", 1, timeout_s=0.15) == []
    assert time.monotonic() - start < 1.0  # bounded by the timeout, not by a network default


def test_wait_collects_several_models(channel):
    def later():
        time.sleep(0.05)
        channel.publish("q4", ok("a"))
        channel.publish("q4", ok("b"))

    t = threading.Thread(target=later)
    t.start()
    got = channel.wait("q4", 2, timeout_s=2.0)
    t.join()
    assert sorted(r.model for r in got) == ["a", "b"]


def test_redis_down_is_unavailable():
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    channel = RedisReplyChannel(client)
    with pytest.raises(Unavailable):
        channel.publish("q", ok())
    with pytest.raises(Unavailable):
        channel.wait("q", 1, 0.1)


def test_redis_batch_publication_answers_each_query_once(redis_url):  # noqa: F811
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    channel = RedisReplyChannel(client, ttl_s=60)
    err = Reply(query_id=3, model="mlp", version="1", error="boom", error_kind="endpoint")
    assert channel.publish("b1", ok(outputs=(7,)))
    assert channel.answered_many([("b1", "mlp"), ("b2", "mlp"), ("b1", "other")]) == [True, False, False]
    got = channel.publish_many([("b1", ok(outputs=(8,))), ("b2", ok(outputs=(2,))), ("b3", err), ("b2", ok())])
    assert got == [False, True, True, False]
    assert 0 < client.ttl("clipper:reply:{b2}") <= 60
    assert [r.outputs for r in channel.wait("b1", 2, timeout_s=0.1)] == [[7]]
    assert [r.outputs for r in channel.wait("b2", 2, timeout_s=0.1)] == [[2]]
    (failed,) = channel.wait("b3", 1, timeout_s=0.1)
    assert failed.error == "boom" and not channel.answered("b3", "mlp")
    assert channel.answered_many([]) == [] and channel.publish_many([]) == []


def test_redis_batch_methods_down_are_unavailable():
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    channel = RedisReplyChannel(client)
    with pytest.raises(Unavailable):
        channel.publish_many([("q", ok())])
    with pytest.raises(Unavailable):
        channel.answered_many([("q", "mlp")])
