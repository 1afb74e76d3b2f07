"""Redis Streams' batcher as the local stack runs it (``receivers=0``), over a real redis-server: one round trip
carries a batch's deletes and the next receive, a first delivery is dated by its entry id, and the batch wait
runs from when the first message entered the stream."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from clipper.adapters.redis_streams import RedisStreamQueueReader, RedisStreamRequestQueue
from clipper.adapters.resp import RespClient
from clipper.batching.controller import FixedController
from clipper.batching.core import Batcher
from clipper.batching.longpoll import LongPollDriver
from tests.fakes import FakeClock, FakeEndpoint, FakeResolver, InMemoryReplies
from tests.services import redis_url  # noqa: F401  (fixture)
from tests.unit.test_batcher_core import message, one_hot

pytestmark = pytest.mark.integration

URL = "https://sqs.us-east-1.amazonaws.com/123456789012/inline"


class CountingClient(RespClient):
    """The adapters' client, counting its round trips (``execute`` calls)."""

    round_trips = 0

    def execute(self, commands, timeout=None):
        self.round_trips += 1
        return super().execute(commands, timeout)


@pytest.fixture
def stream(redis_url: str) -> Iterator[tuple[RedisStreamRequestQueue, RedisStreamQueueReader, CountingClient]]:  # noqa: F811
    client = CountingClient.from_url(redis_url)
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    yield RedisStreamRequestQueue(client, prefix=prefix), RedisStreamQueueReader(client, URL, prefix=prefix), client
    client.close()


def test_a_receive_carries_the_deletes_in_its_round_trip_and_dates_first_deliveries(stream):
    queue, reader, client = stream
    before = time.time() * 1000
    queue.send(URL, "a")
    queue.send(URL, "b")
    after = time.time() * 1000
    first = reader.receive(1, 0)
    assert [m.body for m in first] == ["a"]
    assert before - 1 <= first[0].sent_ms <= after + 1  # the entry id's ms (its middle), the same host's clock
    trips = client.round_trips
    second = reader.receive_and_delete([first[0].receipt_handle], 1, 0)
    assert [m.body for m in second] == ["b"] and client.round_trips == trips + 1
    depth = reader.depth()
    assert (depth.ready, depth.in_flight) == (0, 1)  # "a" deleted, "b" in flight
    assert reader.receive_and_delete([second[0].receipt_handle], 10, 0) == []
    assert reader.depth().in_flight == 0 and reader.delete_errors == 0


def test_a_refused_carried_delete_is_counted_and_the_messages_received_are_kept(stream):
    queue, reader, _ = stream
    queue.send(URL, "a")
    got = reader.receive_and_delete(["not-an-id:1"], 10, 0)  # XACK refuses the id: the transaction is aborted
    assert [m.body for m in got] == ["a"] and reader.delete_errors == 1


def driver_of(reader: RedisStreamQueueReader, size: int, batch_wait_s: float) -> tuple[LongPollDriver, FakeClock]:
    clock = FakeClock()
    batcher = Batcher(FakeResolver(FakeEndpoint()), InMemoryReplies(), clock)
    options = {"idle_wait_s": 5.0, "receivers": 0, "receive_max": None}  # as the batcher process runs on Redis
    return LongPollDriver(reader, batcher, FixedController(size), batch_wait_s, **options), clock


def test_the_batcher_deletes_with_its_receives_and_nothing_is_left_on_stop(stream):
    queue, reader, client = stream
    driver, clock = driver_of(reader, 30, batch_wait_s=5.0)  # cut when full
    for i in range(60):
        queue.send(URL, message(i, one_hot(i % 64), clock, ttl_s=60).body)
    stop = threading.Event()
    with driver:
        first = driver.collect(stop)
        driver.handle(first)
        trips = client.round_trips
        second = driver.collect(stop)
        assert client.round_trips == trips + 1  # the first batch's deletes and this receive: one round trip
        assert (len(first), len(second)) == (30, 30) and reader.depth().in_flight == 30
        driver.handle(second)
    assert reader.depth().in_flight == 0 and driver.stats.answered == 60 and driver.stats.ack_errors == 0


def test_the_batch_wait_runs_from_when_the_first_message_entered_the_stream(stream):
    queue, reader, _ = stream
    driver, clock = driver_of(reader, 10, batch_wait_s=0.4)
    stop = threading.Event()
    body = [message(i, one_hot(i), clock, ttl_s=60).body for i in range(4)]
    with driver, ThreadPoolExecutor(1) as pool:
        # a message that came 0.6 s ago (the batcher was busy): its window is over, the batch is cut at once and a
        # message sent 0.1 s later is left for the next batch
        queue.send(URL, body[0])
        time.sleep(0.6)
        batch = pool.submit(driver.collect, stop)
        time.sleep(0.1)
        queue.send(URL, body[1])
        assert [m.body for m in batch.result(timeout=5)] == [body[0]]
        assert [m.body for m in driver.collect(stop)] == [body[1]]  # (its own window, alone)
        # a message that just came: its batch waits, and one sent 0.1 s later joins it
        batch = pool.submit(driver.collect, stop)
        queue.send(URL, body[2])
        time.sleep(0.1)
        queue.send(URL, body[3])
        assert [m.body for m in batch.result(timeout=5)] == [body[2], body[3]]


def test_deletes_ride_the_plain_read_between_scans_too(stream):
    queue, reader, client = stream
    queue.send(URL, "a")
    (a,) = reader.receive(10, 0)  # the script's scan (the first receive), not full: no scan for a second
    queue.send(URL, "b")
    trips = client.round_trips
    (b,) = reader.receive_and_delete([a.receipt_handle], 10, 0)  # between scans: one XREADGROUP, the deletes with it
    assert b.body == "b" and client.round_trips == trips + 1
    depth = reader.depth()
    assert (depth.ready, depth.in_flight) == (0, 1) and reader.delete_errors == 0  # "a" deleted


def test_a_redelivery_carries_no_time_of_entry(stream):
    queue, reader, _ = stream
    queue.send(URL, "a")
    (first,) = reader.receive(10, 0)
    assert first.sent_ms is not None and first.receive_count == 1
    reader.release(first.receipt_handle, 0)  # handed back at once: delivered again by the next scan
    (again,) = reader.receive(10, 1.0)
    assert again.message_id == first.message_id and again.receive_count == 2 and again.sent_ms is None
