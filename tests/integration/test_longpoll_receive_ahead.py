"""Receive-ahead over the real queue adapters: on SQS (moto), whose receive returns at most 10 messages, a
batch holds several receives; on Redis Streams one receiver reads whole batches."""

from __future__ import annotations

import threading
import time

import pytest

from clipper.adapters.sqs import SqsQueueReader
from clipper.batching.controller import FixedController
from clipper.batching.longpoll import LongPollDriver
from tests.integration.test_sqs_longpoll import enqueue, queues, world  # noqa: F401  (fixtures)
from tests.services import redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


class SerializedSqs:
    """An SQS client whose requests to moto run one at a time: moto, a test double, can hand one message to
    two concurrent receives (SQS does that only rarely). A long poll is emulated outside the lock, so
    deletes go on while receives wait."""

    _lock = threading.Lock()

    def __init__(self, client) -> None:
        self._client = client

    def receive_message(self, WaitTimeSeconds: int = 0, **kwargs):  # boto3 spells its parameters so
        give_up = time.monotonic() + WaitTimeSeconds
        while True:
            with self._lock:
                resp = self._client.receive_message(WaitTimeSeconds=0, **kwargs)
            if resp.get("Messages") or time.monotonic() >= give_up:
                return resp
            time.sleep(0.02)

    def __getattr__(self, name):
        method = getattr(self._client, name)

        def call(*args, **kwargs):
            with self._lock:
                return method(*args, **kwargs)

        return call


def test_batches_of_thirty_from_a_queue_read_ahead(aws, queues, world):  # noqa: F811
    processor, batcher, replies, endpoint = world
    enqueue(processor, 60)
    if isinstance(queues.reader, SqsQueueReader):
        reader, options = SqsQueueReader(SerializedSqs(aws.sqs), aws.queue_url), {"receivers": 4, "receive_max": 10}
    else:
        reader, options = queues.reader, {"receivers": 1, "receive_max": None}
    driver = LongPollDriver(reader, batcher, FixedController(30), batch_wait_s=5.0, **options)  # cut when full
    stop = threading.Event()
    with driver:
        for _ in range(2):
            batch = driver.collect(stop)
            assert len(batch) == 30
            driver.handle(batch)
        assert driver.flush_acks(10.0)
    assert endpoint.calls == [30, 30] and len(replies.done) == 60 and queues.depth() == 0
