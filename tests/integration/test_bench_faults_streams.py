"""The fault suite's look at a request stream (``bench.faults.streams``) on a real redis-server, with the product's
Redis Streams reader: the messages a killed batcher held are found by its pid and followed to their end,
acknowledged after a redelivery or dead-lettered."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from bench.faults.streams import held, pending_of, redelivery
from clipper.adapters.redis_streams import RedisStreamQueueReader, RedisStreamRequestQueue, stream_keys
from clipper.adapters.resp import RespClient
from tests.services import redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

VISIBILITY_S = 0.3


def killed_batcher(url: str, queue: str, pid: int, max_receive_count: int) -> list[str]:
    """A batcher of process ``pid`` receives three messages and dies before it deletes them."""
    lean = RespClient.from_url(url)
    sender = RedisStreamRequestQueue(lean)
    for i in range(3):
        sender.send(queue, f'{{"n": {i}}}')
    reader = RedisStreamQueueReader(lean, queue, VISIBILITY_S, max_receive_count, consumer=f"host:{pid}:abcd1234")
    got = reader.receive(10, 1.0)
    assert len(got) == 3
    return [m.message_id for m in got]


def test_a_killed_batchers_messages_are_found_by_its_pid_and_acknowledged_after_their_redelivery(redis_url):  # noqa: F811
    queue = f"https://sqs.us-east-1.amazonaws.com/123456789012/q-{uuid.uuid4().hex[:8]}"
    ids = killed_batcher(redis_url, queue, 4242, max_receive_count=3)
    r = redis.Redis.from_url(redis_url)
    keys = stream_keys(queue)
    assert sorted(pending_of(r, keys.stream, 4242)) == sorted(ids) and pending_of(r, keys.stream, 424) == []
    pending = held(keys, ids, time.time(), VISIBILITY_S)
    assert redelivery(r, pending, max_wait_s=0.0, grace_s=5.0)["checked"] is False  # not due within the run
    # the restarted batcher: after the visibility timeout it reads them again and answers (deletes) them
    time.sleep(VISIBILITY_S + 0.1)
    restarted = RedisStreamQueueReader(RespClient.from_url(redis_url), queue, VISIBILITY_S, 3, consumer="host:1:ef")
    again = restarted.receive(10, 1.0)
    assert sorted(m.message_id for m in again) == sorted(ids) and {m.receive_count for m in again} == {2}
    restarted.delete([m.receipt_handle for m in again])
    got = redelivery(r, pending, max_wait_s=10.0, grace_s=1.0)
    assert got["checked"] and (got["acknowledged"], got["dead_lettered"], got["still_pending"]) == (3, 0, 0)


def test_messages_never_taken_again_stay_pending_and_dead_letters_are_told_apart(redis_url):  # noqa: F811
    queue = f"https://sqs.us-east-1.amazonaws.com/123456789012/q-{uuid.uuid4().hex[:8]}"
    ids = killed_batcher(redis_url, queue, 77, max_receive_count=1)
    r = redis.Redis.from_url(redis_url)
    pending = held(stream_keys(queue), ids, time.time(), VISIBILITY_S)
    got = redelivery(r, pending, max_wait_s=10.0, grace_s=0.3)  # nobody reads the queue
    assert (got["acknowledged"], got["dead_lettered"], got["still_pending"]) == (0, 0, 3)
    # a reader that comes now finds them delivered max_receive_count times already: dead letters
    reader = RedisStreamQueueReader(RespClient.from_url(redis_url), queue, VISIBILITY_S, 1, consumer="host:2:ef")
    assert reader.receive(10, 0.0) == []
    got = redelivery(r, pending, max_wait_s=10.0, grace_s=0.3)
    assert (got["acknowledged"], got["dead_lettered"], got["still_pending"]) == (0, 3, 0)
