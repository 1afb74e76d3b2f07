from __future__ import annotations

import threading

import pytest

from clipper.batching.controller import FixedController
from clipper.batching.core import Batcher
from clipper.batching.longpoll import LongPollDriver
from clipper.ports import ReceivedMessage
from tests.fakes import FakeClock, FakeEndpoint, FakeResolver, InMemoryReplies
from tests.unit.test_batcher_core import message, one_hot, timed

pytestmark = pytest.mark.unit


class ListReader:
    """The QueueReader port over a list: what was deleted and released is recorded."""

    def __init__(self) -> None:
        self.waiting: list[ReceivedMessage] = []
        self.deleted: list[str] = []
        self.released: list[str] = []

    def add(self, inbound) -> None:
        handle = f"h-{inbound.message_id}"
        self.waiting.append(ReceivedMessage(inbound.message_id, handle, inbound.body, 1))

    def receive(self, max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        got, self.waiting = self.waiting[:max_messages], self.waiting[max_messages:]
        return got

    def delete(self, receipt_handles: list[str]) -> None:
        self.deleted += receipt_handles

    def release(self, receipt_handle: str, delay_s: int) -> None:
        self.released.append(receipt_handle)


def test_deferred_messages_stay_in_flight_and_lead_the_next_batch():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    timed(endpoint, clock, 0.002, 0.010)
    reader = ListReader()
    driver = LongPollDriver(reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(10), 0.0)
    stop = threading.Event()
    for n in (1, 4):  # two batch sizes seen: the latency model can predict
        reader.add(message(100 + n, one_hot(0, n), clock, ttl_s=1.0))
        driver.handle(driver.collect(stop))
    for i in range(1, 5):
        reader.add(message(i, one_hot(i), clock, ttl_s=0.5))
    reader.add(message(9, one_hot(9), clock, ttl_s=0.045))
    batch = driver.collect(stop)
    assert len(batch) == 5
    report = driver.handle(batch)
    assert sorted(report.deferred) == ["m3", "m4"] and driver.stats.deferred == 2
    assert "h-m3" not in reader.deleted and "h-m9" in reader.deleted and reader.released == []
    reader.add(message(5, one_hot(5), clock, ttl_s=0.5))
    nxt = driver.collect(stop)
    assert [m.message_id for m in nxt] == ["m3", "m4", "m5"]
    assert driver.handle(nxt).answered == 3
    assert {"h-m3", "h-m4", "h-m5"} <= set(reader.deleted) and driver.stats.answered == 2 + 3 + 3


def test_messages_deferred_when_the_driver_stops_go_back_to_the_queue_at_once():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    timed(endpoint, clock, 0.002, 0.010)
    reader = ListReader()
    driver = LongPollDriver(reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(10), 0.0)
    stop = threading.Event()
    for n in (1, 4):
        reader.add(message(100 + n, one_hot(0, n), clock, ttl_s=1.0))
        driver.handle(driver.collect(stop))
    for i in range(1, 5):
        reader.add(message(i, one_hot(i), clock, ttl_s=0.5))
    reader.add(message(9, one_hot(9), clock, ttl_s=0.045))
    assert sorted(driver.handle(driver.collect(stop)).deferred) == ["m3", "m4"]

    stop.set()
    driver.run(stop)

    assert sorted(reader.released) == ["h-m3", "h-m4"] and not set(reader.released) & set(reader.deleted)
