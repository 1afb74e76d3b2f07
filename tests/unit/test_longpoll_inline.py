"""The long-poll driver with ``receivers=0`` (Redis Streams' default): the batching thread receives itself, no
receiver thread runs ahead and no acknowledgement thread deletes; a batch's deletes travel with the next
receive; the batch wait is Clipper's, dated from when the first message entered the queue where the
transport says."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from clipper.batching.controller import FixedController
from clipper.batching.core import Batcher
from clipper.batching.longpoll import LongPollDriver
from clipper.errors import Unavailable
from clipper.ports import DeletingReader, ReceivedMessage
from tests.fakes import FakeClock, FakeEndpoint, FakeResolver, InMemoryReplies
from tests.unit.test_batcher_core import message, one_hot
from tests.unit.test_longpoll_batch_wait import SteppedClock
from tests.unit.test_longpoll_driver import ListReader, driving, ids, wait_until

pytestmark = pytest.mark.unit


class CarryingReader(ListReader):
    """A ListReader whose receive can carry deletes (``DeletingReader``): records which deletes came with which
    receive; ``fail_next`` makes the next receive fail as a whole."""

    def __init__(self) -> None:
        super().__init__()
        self.carried: list[list[str]] = []
        self.plain_deletes = 0
        self.fail_next = False
        self.fail_plain_next = False  # the next receive without deletes fails as a whole

    def delete(self, receipt_handles: list[str]) -> None:
        self.plain_deletes += 1
        super().delete(receipt_handles)

    def receive(self, max_messages: int, wait_s: float):
        if self.fail_plain_next:
            self.fail_plain_next = False
            raise Unavailable("redis queue: connection reset")
        return super().receive(max_messages, wait_s)

    def receive_and_delete(self, receipt_handles: list[str], max_messages: int, wait_s: float):
        if self.fail_next:
            self.fail_next = False
            raise Unavailable("redis queue: connection reset")
        self.carried.append(list(receipt_handles))
        with self._cond:
            self.deleted += receipt_handles
        return self.receive(max_messages, wait_s)


def make(reader: ListReader, size: int, batch_wait_s: float, **options) -> tuple[LongPollDriver, FakeClock]:
    clock = FakeClock()
    batcher = Batcher(FakeResolver(FakeEndpoint()), InMemoryReplies(), clock)
    options.setdefault("idle_wait_s", 30.0)
    return LongPollDriver(reader, batcher, FixedController(size), batch_wait_s, receivers=0, **options), clock


def test_no_thread_receives_or_deletes_beside_the_batcher_and_a_batchs_deletes_ride_the_next_receive():
    reader = CarryingReader()
    assert isinstance(reader, DeletingReader)
    driver, clock = make(reader, 2, batch_wait_s=0.0)
    stop = threading.Event()
    with driving(driver, reader, stop):
        driver.start()
        assert not [t for t in threading.enumerate() if t.name.startswith("clipper-receiver")]
        reader.add(*(message(i, one_hot(i), clock, ttl_s=60) for i in range(1, 5)))
        first = driver.collect(stop)
        assert ids(first) == ["m1", "m2"] and reader.calls == 1
        driver.handle(first)
        assert reader.deleted == []  # not yet: they wait for the next receive
        second = driver.collect(stop)
        assert ids(second) == ["m3", "m4"]
        assert reader.carried == [["h-m1", "h-m2"]] and reader.deleted == ["h-m1", "h-m2"]
        driver.handle(second)
    # stopping made the deletes still waiting (the acker's call, once)
    assert reader.deleted == ["h-m1", "h-m2", "h-m3", "h-m4"] and reader.plain_deletes == 1
    assert driver.stats.received == 4 and driver.stats.answered == 4


def test_a_failed_receive_keeps_its_deletes_for_the_next_one():
    reader = CarryingReader()
    driver, clock = make(reader, 1, batch_wait_s=0.0)
    stop = threading.Event()
    with driving(driver, reader, stop):
        reader.add(message(1, one_hot(1), clock, ttl_s=60), message(2, one_hot(2), clock, ttl_s=60))
        driver.handle(driver.collect(stop))
        reader.fail_next = True
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(driver.collect, stop).result(timeout=5) == []  # failed: paused, nothing
        assert ids(driver.collect(stop)) == ["m2"]
        assert reader.carried == [["h-m1"]]  # the failed receive's deletes, sent again
        driver.flush_acks()
        assert driver.stats.receive_errors == 1


def test_within_the_batch_wait_the_batcher_sleeps_and_takes_what_came_at_each_quarter_until_it_ends():
    reader, stepped = CarryingReader(), SteppedClock()
    driver, clock = make(reader, 10, batch_wait_s=0.010, clock=stepped)
    stop = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="batcher") as pool, driving(driver, reader, stop):
        reader.add(message(1, one_hot(1), clock, ttl_s=60))  # received at t = 100.000: cut at 100.010
        batch = pool.submit(driver.collect, stop)
        wait_until(lambda: reader.calls == 1 and any(n.startswith("batcher") for n in stepped.readers))
        reader.add(message(2, one_hot(2), clock, ttl_s=60))
        assert reader.calls == 1  # asleep: no receive before its first check, a quarter of the window
        stepped.advance(0.003)
        wait_until(lambda: reader.calls == 2)  # the check at 2.5 ms took m2
        reader.add(message(3, one_hot(3), clock, ttl_s=60))
        stepped.advance(0.003)
        wait_until(lambda: reader.calls == 3)
        assert not batch.done()
        stepped.advance(0.005)  # 11 ms: the window is over after its last check
        assert ids(batch.result(timeout=5)) == ["m1", "m2", "m3"]
        assert reader.calls <= 1 + 4  # the receive that opened it, and a short one a quarter at most


def test_a_batch_that_fills_within_its_window_is_cut_at_the_next_check_not_at_its_end():
    reader, stepped = CarryingReader(), SteppedClock()
    driver, clock = make(reader, 2, batch_wait_s=0.010, clock=stepped)
    stop = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="batcher") as pool, driving(driver, reader, stop):
        reader.add(message(1, one_hot(1), clock, ttl_s=60))
        batch = pool.submit(driver.collect, stop)
        wait_until(lambda: reader.calls == 1)
        reader.add(message(2, one_hot(2), clock, ttl_s=60))
        stepped.advance(0.003)  # the clock stops 7 ms before the window's end: only a check can cut the batch
        assert ids(batch.result(timeout=5)) == ["m1", "m2"]


def test_the_default_window_is_one_sleep_and_one_short_receive():
    reader, stepped = CarryingReader(), SteppedClock()
    driver, clock = make(reader, 10, batch_wait_s=0.001, clock=stepped)
    stop = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="batcher") as pool, driving(driver, reader, stop):
        reader.add(message(1, one_hot(1), clock, ttl_s=60))
        batch = pool.submit(driver.collect, stop)
        wait_until(lambda: reader.calls == 1 and any(n.startswith("batcher") for n in stepped.readers))
        reader.add(message(2, one_hot(2), clock, ttl_s=60))
        stepped.advance(0.0009)
        assert reader.calls == 1
        stepped.advance(0.0002)
        assert ids(batch.result(timeout=5)) == ["m1", "m2"] and reader.calls == 2


def test_the_batch_wait_starts_when_the_first_message_entered_the_queue():
    reader, stepped = CarryingReader(), SteppedClock()  # the clock never moves: a wait would never end
    wall = [1_000.0]
    driver, clock = make(reader, 10, batch_wait_s=0.010, clock=stepped, wall=lambda: wall[0])
    stop = threading.Event()
    old = ReceivedMessage("m1", "h-m1", message(1, one_hot(1), clock, ttl_s=60).body, sent_ms=wall[0] * 1000 - 12)
    reader.add_received(old)  # it came 12 ms ago, while the last batch ran: its window is over
    with ThreadPoolExecutor(1) as pool, driving(driver, reader, stop):
        assert ids(pool.submit(driver.collect, stop).result(timeout=5)) == ["m1"]
        assert reader.calls == 1  # cut at once, with no short receive after the one that took it
        fresh = ReceivedMessage("m2", "h-m2", message(2, one_hot(2), clock, ttl_s=60).body, sent_ms=wall[0] * 1000 - 4)
        reader.add_received(fresh)  # 4 ms ago: 6 ms of its window left
        batch = pool.submit(driver.collect, stop)
        wait_until(lambda: reader.calls == 2)  # the first batch's one receive, this one's
        assert not batch.done()
        stepped.advance(0.006)
        assert ids(batch.result(timeout=5)) == ["m2"]


def test_a_stop_ends_the_batch_wait_at_once():
    reader, stepped = CarryingReader(), SteppedClock()
    driver, clock = make(reader, 10, batch_wait_s=0.010, clock=stepped)
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool, driving(driver, reader, stop):
        reader.add(message(1, one_hot(1), clock, ttl_s=60))
        batch = pool.submit(driver.collect, stop)
        wait_until(lambda: reader.calls == 1)
        stop.set()
        assert ids(batch.result(timeout=5)) == ["m1"]


def test_a_deferred_lead_is_completed_with_one_short_receive_without_waiting():
    reader, stepped = CarryingReader(), SteppedClock()  # the clock never moves: a window would never end
    driver, clock = make(reader, 3, batch_wait_s=0.010, clock=stepped)  # and a receive waits 30 s for a message
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool, driving(driver, reader, stop):
        lead = ReceivedMessage("m1", "h-m1", message(1, one_hot(1), clock, ttl_s=60).body, received_ms=1.0)
        driver._carry = [lead]
        assert ids(pool.submit(driver.collect, stop).result(timeout=5)) == ["m1"]  # the queue empty: no wait
        driver._carry = [lead]
        reader.add(message(2, one_hot(2), clock, ttl_s=60))
        assert ids(pool.submit(driver.collect, stop).result(timeout=5)) == ["m1", "m2"]
        assert reader.calls == 2


def test_the_window_opens_when_the_oldest_message_of_the_batch_entered_the_queue():
    reader, stepped = CarryingReader(), SteppedClock()  # the clock never moves: a wait would never end
    wall = [1_000.0]
    driver, clock = make(reader, 10, batch_wait_s=0.010, clock=stepped, wall=lambda: wall[0])
    stop = threading.Event()
    body = message(1, one_hot(1), clock, ttl_s=60).body
    redelivered = ReceivedMessage("m1", "h-m1", body, receive_count=2)  # a redelivery: when it came is not said
    first = ReceivedMessage("m2", "h-m2", body, sent_ms=wall[0] * 1000 - 12)  # 12 ms ago: the window is over
    reader.add_received(redelivered, first)
    with ThreadPoolExecutor(1) as pool, driving(driver, reader, stop):
        assert ids(pool.submit(driver.collect, stop).result(timeout=5)) == ["m1", "m2"]


def test_a_receive_failing_on_a_bug_hands_its_deletes_to_the_acknowledger_and_the_next_receive_goes_on():
    reader = CarryingReader()
    driver, clock = make(reader, 1, batch_wait_s=0.0)
    stop = threading.Event()
    with driving(driver, reader, stop):
        reader.add(message(1, one_hot(1), clock, ttl_s=60), message(2, one_hot(2), clock, ttl_s=60))
        driver.handle(driver.collect(stop))
        calls = reader.receive_and_delete

        def broken(handles, most, wait_s):
            reader.receive_and_delete = calls
            raise ValueError("not a receipt handle")

        reader.receive_and_delete = broken
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(driver.collect, stop).result(timeout=5) == []
        assert ids(driver.collect(stop)) == ["m2"] and reader.carried == []  # nothing carried again
        driver.flush_acks()
        assert reader.deleted == ["h-m1"] and reader.plain_deletes == 1


def test_the_batch_wait_a_reply_reports_runs_from_when_the_message_entered_the_queue():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    reader = CarryingReader()
    driver = LongPollDriver(
        reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(10), 0.0, receivers=0
    )
    clock.t = 1_000.0
    with driving(driver, reader):
        sent = ReceivedMessage("m1", "h-m1", message(1, one_hot(1), clock, ttl_s=60).body, sent_ms=999_980.0)
        reader.add_received(sent)  # entered the queue 20 ms before the batch starts (it waited for the last batch)
        (m,) = driver.collect(threading.Event())
        driver.handle([m])
        (reply,) = replies.lists["1"]
        assert reply.timings["batch_wait_ms"] == pytest.approx(20, abs=0.01)


def test_a_receive_failing_within_the_window_cuts_the_batch_in_hand_without_the_error_pause():
    reader, stepped = CarryingReader(), SteppedClock()
    driver, clock = make(reader, 10, batch_wait_s=0.010, clock=stepped)
    stop = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="batcher") as pool, driving(driver, reader, stop):
        reader.add(message(1, one_hot(1), clock, ttl_s=60))
        batch = pool.submit(driver.collect, stop)
        wait_until(lambda: reader.calls == 1 and any(n.startswith("batcher") for n in stepped.readers))
        reader.fail_plain_next = True  # the window's short receive fails
        started = time.monotonic()
        stepped.advance(0.011)
        assert ids(batch.result(timeout=5)) == ["m1"]
        assert time.monotonic() - started < 0.5  # not the 1 s pause after a failed receive: m1 is in hand
        assert driver._receive_errors == 1


def test_a_lead_that_fills_the_batch_hands_the_waiting_deletes_to_the_acknowledger():
    reader = CarryingReader()
    driver, clock = make(reader, 1, batch_wait_s=0.0)
    stop = threading.Event()
    with driving(driver, reader, stop):
        reader.add(message(1, one_hot(1), clock, ttl_s=60))
        driver.handle(driver.collect(stop))
        lead = ReceivedMessage("m2", "h-m2", message(2, one_hot(2), clock, ttl_s=60).body, received_ms=1.0)
        driver._carry = [lead]  # deferred: it fills the next batch alone, no receive is made
        assert ids(driver.collect(stop)) == ["m2"] and reader.calls == 1
        wait_until(lambda: reader.deleted == ["h-m1"])  # not left waiting for a receive that may be far off


def test_flushing_makes_the_deletes_waiting_for_the_next_receive():
    reader = CarryingReader()
    driver, clock = make(reader, 1, batch_wait_s=0.0)
    stop = threading.Event()
    with driving(driver, reader, stop):
        reader.add(message(1, one_hot(1), clock, ttl_s=60))
        driver.handle(driver.collect(stop))
        assert driver.flush_acks(5.0)
        assert reader.deleted == ["h-m1"] and reader.plain_deletes == 1
