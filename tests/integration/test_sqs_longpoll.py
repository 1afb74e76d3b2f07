"""The queue adapters and the long-poll driver, with the batcher core and a fake model: every test runs over
SQS (moto) and over Redis Streams (a real redis-server)."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from clipper.adapters.redis_streams import RedisStreamQueueReader, RedisStreamRequestQueue
from clipper.adapters.resp import RespClient
from clipper.adapters.s3_claims import S3ClaimStore
from clipper.adapters.sqs import SqsQueueReader, SqsRequestQueue
from clipper.batching.controller import AimdController, FixedController
from clipper.batching.core import Batcher
from clipper.batching.longpoll import LongPollDriver
from clipper.core.messages import MAX_INLINE_PAYLOAD, QueryMessage
from clipper.frontend.query import QueryProcessor
from clipper.ports import QueueReader, RequestQueue
from tests.fakes import FakeEndpoint, FakeResolver, InMemoryRegistry, InMemoryReplies, digits_app, model_version
from tests.services import redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


class WallClock:
    def now(self) -> float:
        import time

        return time.time()


def depth(aws, url):
    a = aws.sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(a["ApproximateNumberOfMessages"]) + int(a["ApproximateNumberOfMessagesNotVisible"])


@dataclass
class Queues:
    """The model queue of ``aws.queue_url`` on one transport (its address is the SQS URL on both)."""

    sender: RequestQueue
    reader: QueueReader
    depth: Callable[[], int]  # messages not deleted: ready, in flight or delayed
    dead: Callable[[], int]  # messages in the dead-letter queue


@pytest.fixture(params=["sqs", "redis"])
def queues(request, aws) -> Iterator[Queues]:
    if request.param == "sqs":
        yield Queues(
            SqsRequestQueue(aws.sqs),
            SqsQueueReader(aws.sqs, aws.queue_url),
            lambda: depth(aws, aws.queue_url),
            lambda: depth(aws, aws.dlq_url),
        )
        return
    client = RespClient.from_url(request.getfixturevalue("redis_url"))
    prefix = f"test-{uuid.uuid4().hex[:8]}"  # the same queue URL in every test: keys of their own
    # the SQS queue's attributes (tests/integration/conftest.py): visibility timeout 30 s, maxReceiveCount 3
    reader = RedisStreamQueueReader(client, aws.queue_url, visibility_timeout_s=30, max_receive_count=3, prefix=prefix)

    def not_deleted() -> int:
        d = reader.depth()
        return d.ready + d.in_flight + d.delayed

    yield Queues(
        RedisStreamRequestQueue(client, prefix=prefix), reader, not_deleted, lambda: reader.depth().dead_lettered
    )
    client.close()


@pytest.fixture
def world(aws, queues):
    registry, replies, endpoint = InMemoryRegistry(), InMemoryReplies(), FakeEndpoint()
    registry.apps["digits"] = digits_app(latency_slo_micros=20_000_000)
    registry.links["digits"] = ["mlp"]
    registry.versions[("mlp", "1")] = model_version(queue_url=aws.queue_url)
    registry.active["mlp"] = "1"
    claims = S3ClaimStore(aws.s3, aws.bucket)
    ids = iter(range(1 << 20, 1 << 40, 1 << 16))
    processor = QueryProcessor(registry, queues.sender, replies, WallClock(), lambda: next(ids), claims)
    batcher = Batcher(FakeResolver(endpoint), replies, WallClock(), claims)
    return processor, batcher, replies, endpoint


def enqueue(processor, n):
    """Send n queries without waiting for their replies (the reply wait is cut to zero)."""
    processor._replies.wait = lambda *a: []
    for i in range(n):
        processor.predict("digits", {"input": [1.0 if j == i % 64 else 0.0 for j in range(64)]})


def drive(driver, done, timeout_s=30.0):
    """Run the driver's own loop (receivers and acker in the background, as in the process) until ``done()``,
    then stop it (its acknowledgements flushed)."""
    stop = threading.Event()
    worker = threading.Thread(target=driver.run, args=(stop,))
    worker.start()
    try:
        give_up = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < give_up, "the driver did not finish in time"
            time.sleep(0.01)
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()


def test_reader_receives_deletes_and_releases(aws, queues):
    for i in range(3):
        queues.sender.send(aws.queue_url, f"m{i}")
    reader = queues.reader
    got = reader.receive(10, 0)
    assert sorted(m.body for m in got) == ["m0", "m1", "m2"] and all(m.receive_count == 1 for m in got)
    reader.release(got[0].receipt_handle, 0)
    reader.delete([m.receipt_handle for m in got[1:]])
    (again,) = reader.receive(10, 0)
    assert again.body == got[0].body and again.receive_count == 2


def test_driver_batches_and_answers_every_query(queues, world):
    processor, batcher, replies, endpoint = world
    enqueue(processor, 25)
    driver = LongPollDriver(queues.reader, batcher, FixedController(10), batch_wait_s=0.05)
    drive(driver, lambda: queues.depth() == 0)
    assert driver.stats.answered == 25 and sum(endpoint.calls) == 25
    assert max(endpoint.calls) == 10  # batches were cut at the controller's size
    assert len(replies.done) == 25


def test_failing_endpoint_retries_then_dead_letters(queues, world):
    processor, batcher, replies, endpoint = world
    endpoint.fail_with = "model crashed"
    enqueue(processor, 2)
    driver = LongPollDriver(
        queues.reader,
        batcher,
        AimdController(slo_s=1.0),
        batch_wait_s=0.0,
        max_backoff_s=0,
    )
    drive(driver, lambda: queues.depth() == 0 and queues.dead() == 2)
    assert queues.depth() == 0 and queues.dead() == 2  # maxReceiveCount 3, then the DLQ
    assert driver.stats.failed == 6  # 2 messages x 3 tries
    assert all(not r.ok for rs in replies.lists.values() for r in rs)


def test_large_input_travels_through_s3_as_a_claim_check(queues, world):
    processor, batcher, replies, _endpoint = world
    from clipper.core.domain import InputType

    # a long SLO: with the whole suite loading this machine, 100 ms could pass before the batcher runs
    big = digits_app(name="big", input_type=InputType.FLOATS, input_shape=None, latency_slo_micros=20_000_000)
    processor._registry.apps["big"] = big
    processor._registry.links["big"] = ["mlp"]
    # a model registered without a row shape (the fake endpoint answers the hot index of any row): a model of [64]
    # would refuse this input with a 400 before anything is sent
    mlp = processor._registry.versions[("mlp", "1")]
    processor._registry.versions[("mlp", "1")] = dataclasses.replace(mlp, input_shape=None)
    processor._replies.wait = lambda *a: []
    n = MAX_INLINE_PAYLOAD // 4 + 100
    row = np.zeros(n, dtype=np.float32)
    row[n - 1] = 1.0
    processor.predict("big", {"input": row.tolist()})
    (msg,) = queues.reader.receive(10, 0)
    parsed = QueryMessage.from_json(msg.body)
    assert parsed.payload.s3_key and len(msg.body) < 2000
    from clipper.batching.core import Inbound

    report = batcher.process([Inbound(msg.message_id, msg.body)])
    assert report.answered == 1
    assert replies.lists[parsed.reply_to][0].outputs == [n - 1]


def test_controller_state_survives_a_new_driver(aws, queues, world):
    from clipper.adapters.dynamodb_registry import DynamoDBControllerStore

    processor, batcher, _, _ = world
    store = DynamoDBControllerStore(aws.dynamodb, aws.registry_table)
    reader = queues.reader
    first = LongPollDriver(reader, batcher, AimdController(slo_s=1.0), state_store=store, state_key=("mlp", "1"))
    enqueue(processor, 12)
    drive(first, lambda: queues.depth() == 0)
    grown = first._controller.max_batch_size()
    assert grown > 1
    first.save_state()
    # a cold start: a new controller starts at 1 but restores the stored size
    second = LongPollDriver(reader, batcher, AimdController(slo_s=1.0), state_store=store, state_key=("mlp", "1"))
    assert second._controller.max_batch_size() == grown


SQS_CHARACTERS = ((0x9, 0x9), (0xA, 0xA), (0xD, 0xD), (0x20, 0xD7FF), (0xE000, 0xFFFD), (0x10000, 0x10FFFF))


def _sqs_takes(body: str) -> bool:
    """SQS's rule for a message body (moto does not check it: InvalidMessageContents on AWS)."""
    return all(any(lo <= ord(c) <= hi for lo, hi in SQS_CHARACTERS) for c in body)


def test_text_that_sqs_refuses_travels_escaped_and_arrives_whole(aws):
    import json

    from clipper.core.domain import InputType
    from clipper.errors import InvalidInput
    from clipper.feedback import FeedbackMessage, FeedbackReceiver

    strings = ["a\ufffeb", "\uffff", "tab\tand\x01control"]  # noncharacters a JSON encoder leaves raw
    query = QueryMessage.model_validate(
        {"query_id": 1, "app": "t", "model": "m", "version": "1", "input_type": "strings", "rows": 3}
        | {"payload": {"strings": strings}, "deadline_ms": 1, "sent_ms": 0, "reply_to": "r"}
    )
    registry = InMemoryRegistry()
    registry.apps["t"] = digits_app(name="t", input_type=InputType.STRINGS, input_shape=None)
    receiver = FeedbackReceiver(registry, SqsRequestQueue(aws.sqs), aws.queue_url)
    receiver.accept("t", {"input": "x\uffff", "label": "\ufffe label \uffff"})
    SqsRequestQueue(aws.sqs).send(aws.queue_url, query.to_json())
    got = SqsQueueReader(aws.sqs, aws.queue_url).receive(10, 0)
    assert len(got) == 2 and all(_sqs_takes(m.body) for m in got)
    feedback = next(FeedbackMessage.from_json(m.body) for m in got if "feedback_id" in json.loads(m.body))
    assert feedback.label == "\ufffe label \uffff" and feedback.payload.strings == ["x\uffff"]
    sent = next(QueryMessage.from_json(m.body) for m in got if "query_id" in json.loads(m.body))
    assert sent.payload.strings == strings
    with pytest.raises(InvalidInput, match="label"):  # 3,000 characters, 18,000 bytes as they travel
        receiver.accept("t", {"input": "x", "label": "\uffff" * 3_000})


def test_a_delete_sqs_refuses_in_its_batch_answer_is_an_error_not_a_success(aws):
    from clipper.errors import Unavailable

    sender, reader = SqsRequestQueue(aws.sqs), SqsQueueReader(aws.sqs, aws.queue_url)
    for i in range(12):
        sender.send(aws.queue_url, f"m{i}")
    got = reader.receive(10, 0) + reader.receive(10, 0)
    handles = [m.receipt_handle for m in got]
    stale = handles[0] + "garbage"  # DeleteMessageBatch answers it in Failed, raising nothing
    with pytest.raises(Unavailable, match=r"1 of 12 not deleted \(ReceiptHandleIsInvalid\)"):
        reader.delete([stale, *handles[1:]])
    assert depth(aws, aws.queue_url) == 12 - (len(handles) - 1)  # the others were deleted all the same
