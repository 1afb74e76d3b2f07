"""The long-poll driver over a fake queue: deferred messages, acknowledgements off the batch path, stop."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from clipper.batching.controller import FixedController
from clipper.batching.core import Batcher
from clipper.batching.longpoll import LongPollDriver
from clipper.ports import ReceivedMessage
from tests.fakes import FakeClock, FakeEndpoint, FakeResolver, InMemoryReplies
from tests.unit.test_batcher_core import message, one_hot, timed

pytestmark = pytest.mark.unit


class ListReader:
    """The QueueReader port over a list, thread-safe as a queue client is: a receive returns what is waiting
    (at most ``per_receive``, after ``receive_s`` of round trip) or waits up to its ``wait_s`` for a message
    (until ``hang_up``). What was received, deleted and released is recorded; ``delete_gate``, when set to an
    Event, holds each delete until it is set (a slow queue)."""

    def __init__(self, per_receive: int | None = None, receive_s: float = 0.0) -> None:
        self._cond = threading.Condition()
        self.waiting: list[ReceivedMessage] = []
        self.deleted: list[str] = []
        self.released: list[str] = []
        self.delays: dict[str, int] = {}
        self.per_receive = per_receive
        self.receive_s = receive_s
        self.delete_gate: threading.Event | None = None
        self.calls = self.in_flight = self.most_in_flight = self.most_returned = self.handed_out = 0
        self.hung_up = False

    def add(self, *inbound) -> None:
        """Make messages visible, all at once."""
        with self._cond:
            for m in inbound:
                self.waiting.append(ReceivedMessage(m.message_id, f"h-{m.message_id}", m.body, 1))
            self._cond.notify_all()

    def add_received(self, *received: ReceivedMessage) -> None:
        with self._cond:
            self.waiting.extend(received)
            self._cond.notify_all()

    def hang_up(self) -> None:
        """End every wait now (the test is over)."""
        with self._cond:
            self.hung_up = True
            self._cond.notify_all()

    def receive(self, max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        with self._cond:
            self.calls += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(self.receive_s)
            with self._cond:
                self._cond.wait_for(lambda: self.waiting or self.hung_up, wait_s)
                n = min(max_messages, self.per_receive or max_messages)
                got, self.waiting = self.waiting[:n], self.waiting[n:]
                self.handed_out += len(got)
                self.most_returned = max(self.most_returned, len(got))
                return got
        finally:
            with self._cond:
                self.in_flight -= 1

    def delete(self, receipt_handles: list[str]) -> None:
        if self.delete_gate is not None:
            self.delete_gate.wait(5.0)
        with self._cond:
            self.deleted += receipt_handles

    def release(self, receipt_handle: str, delay_s: int) -> None:
        with self._cond:
            self.released.append(receipt_handle)
            self.delays[receipt_handle] = delay_s


def wait_until(condition, timeout_s: float = 5.0) -> None:
    give_up = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.002)


@contextlib.contextmanager
def driving(driver: LongPollDriver, reader: ListReader, stop: threading.Event | None = None):
    """The driver for one test; at the end ``stop`` is set, and its receivers and acker are stopped."""
    try:
        yield driver
    finally:
        if stop is not None:
            stop.set()
        reader.hang_up()
        driver.close()


def ids(batch: list[ReceivedMessage]) -> list[str]:
    return [m.message_id for m in batch]


def test_deferred_messages_stay_in_flight_and_lead_the_next_batch():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    timed(endpoint, clock, 0.002, 0.010)
    reader = ListReader()
    driver = LongPollDriver(reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(10), 0.0)
    stop = threading.Event()
    with driving(driver, reader):
        for n in (1, 4):  # two batch sizes seen: the latency model can predict
            reader.add(message(100 + n, one_hot(0, n), clock, ttl_s=1.0))
            driver.handle(driver.collect(stop))
        reader.add(
            *[message(i, one_hot(i), clock, ttl_s=0.5) for i in range(1, 5)], message(9, one_hot(9), clock, 0.045)
        )
        batch = driver.collect(stop)
        assert len(batch) == 5
        report = driver.handle(batch)
        assert sorted(report.deferred) == ["m3", "m4"] and driver.stats.deferred == 2
        assert driver.flush_acks(5.0)
        assert "h-m3" not in reader.deleted and "h-m9" in reader.deleted and reader.released == []
        reader.add(message(5, one_hot(5), clock, ttl_s=0.5))
        wait_until(lambda: driver.buffered == 1)
        nxt = driver.collect(stop)  # the deferred lead; the batch is completed at once with what is buffered
        assert ids(nxt) == ["m3", "m4", "m5"]
        assert driver.handle(nxt).answered == 3
        assert driver.flush_acks(5.0)
        assert {"h-m3", "h-m4", "h-m5"} <= set(reader.deleted) and driver.stats.answered == 2 + 3 + 3


def test_a_deferred_lead_is_held_to_the_batch_limit_when_the_limit_shrank():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    timed(endpoint, clock, 0.002, 0.010)
    reader = ListReader()
    driver = LongPollDriver(reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(10), 0.0)
    stop = threading.Event()
    with driving(driver, reader):
        for n in (1, 4):
            reader.add(message(100 + n, one_hot(0, n), clock, ttl_s=1.0))
            driver.handle(driver.collect(stop))
        reader.add(
            *[message(i, one_hot(i), clock, ttl_s=0.5) for i in range(1, 9)], message(9, one_hot(9), clock, 0.045)
        )
        report = driver.handle(driver.collect(stop))
        assert len(report.deferred) == 6
        driver.reconfigure(FixedController(2), 0.0)  # the registry's settings, or AIMD after a slow batch
        batches = [driver.collect(stop) for _ in range(3)]  # the lead was returned whole: 6 messages
        assert [len(b) for b in batches] == [2, 2, 2]
        assert sorted(ids([m for b in batches for m in b])) == sorted(report.deferred)


def test_a_deferred_lead_cut_by_a_smaller_limit_keeps_its_rest_across_the_batches_that_follow():
    """The rest of a lead over a shrunk limit waited in the carry, and the next batch's handling replaced the
    carry with its own deferrals: those messages were neither answered, deleted nor released (their queries
    timed out with seconds left; they came back after the visibility timeout)."""
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    timed(endpoint, clock, 0.002, 0.010)
    reader = ListReader()
    driver = LongPollDriver(reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(10), 0.0)
    stop = threading.Event()
    with driving(driver, reader):
        for n in (1, 4):
            reader.add(message(100 + n, one_hot(0, n), clock, ttl_s=1.0))
            driver.handle(driver.collect(stop))
        reader.add(
            *[message(i, one_hot(i), clock, ttl_s=0.5) for i in range(1, 9)], message(9, one_hot(9), clock, 0.045)
        )
        deferred = driver.handle(driver.collect(stop)).deferred
        assert len(deferred) == 6
        driver.reconfigure(FixedController(2), 0.0)
        handled: list[str] = []
        for _ in range(3):  # each batch handled before the next is collected, as run() does
            batch = driver.collect(stop)
            handled += ids(batch)
            driver.handle(batch)
        assert sorted(handled) == sorted(deferred)
        assert driver.flush_acks(5.0)
        assert {f"h-{m}" for m in deferred} <= set(reader.deleted)
        assert driver.stats.answered == 2 + 3 + 6


def test_messages_deferred_when_the_driver_stops_go_back_to_the_queue_at_once():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    timed(endpoint, clock, 0.002, 0.010)
    reader = ListReader()
    driver = LongPollDriver(reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(10), 0.0)
    stop = threading.Event()
    for n in (1, 4):
        reader.add(message(100 + n, one_hot(0, n), clock, ttl_s=1.0))
        driver.handle(driver.collect(stop))
    reader.add(*[message(i, one_hot(i), clock, ttl_s=0.5) for i in range(1, 5)], message(9, one_hot(9), clock, 0.045))
    assert sorted(driver.handle(driver.collect(stop)).deferred) == ["m3", "m4"]

    stop.set()
    reader.hang_up()
    driver.run(stop)

    assert sorted(reader.released) == ["h-m3", "h-m4"] and not set(reader.released) & set(reader.deleted)
    assert reader.delays == {"h-m3": 0, "h-m4": 0} and driver.stats.returned == 2


def test_acknowledgements_leave_the_batch_path_a_slow_delete_does_not_delay_the_next_batch():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    reader = ListReader()
    reader.delete_gate = threading.Event()  # every delete waits here until the test opens it
    driver = LongPollDriver(reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(10), 0.0)
    stop = threading.Event()
    with driving(driver, reader):
        reader.add(message(1, one_hot(1), clock, ttl_s=60))
        first = driver.handle(driver.collect(stop))
        reader.add(message(2, one_hot(2), clock, ttl_s=60))
        second = driver.handle(driver.collect(stop))  # while the first batch's delete is still held
        assert first.answered == second.answered == 1 and endpoint.calls == [1, 1]
        assert reader.deleted == []  # neither delete has gone through: both batches ran without waiting
        reader.delete_gate.set()
        assert driver.flush_acks(5.0)
        assert sorted(reader.deleted) == ["h-m1", "h-m2"]


def test_failed_messages_are_released_with_exponential_back_off():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(fail_with="model crashed"), InMemoryReplies()
    reader = ListReader()
    driver = LongPollDriver(
        reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(10), 0.0, max_backoff_s=3
    )
    stop = threading.Event()
    body = message(1, one_hot(1), clock, ttl_s=60).body
    with driving(driver, reader):
        for count in (1, 2, 3):  # the queue delivers it again after each release
            reader.add_received(ReceivedMessage("m1", f"h{count}", body, count))
            assert driver.handle(driver.collect(stop)).failed == ["m1"]
        assert driver.flush_acks(5.0)
        assert reader.delays == {"h1": 1, "h2": 2, "h3": 3} and reader.deleted == []  # 1, 2, 4 capped at 3
        assert driver.stats.failed == 3


def test_stop_flushes_acknowledgements_and_returns_what_the_receivers_buffered():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    reader = ListReader()
    reader.delete_gate = threading.Event()
    driver = LongPollDriver(reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(1), 0.0)
    stop = threading.Event()
    reader.add(message(1, one_hot(1), clock, ttl_s=60))
    driver.handle(driver.collect(stop))  # its delete is held at the gate
    reader.add(message(2, one_hot(2), clock, ttl_s=60), message(3, one_hot(3), clock, ttl_s=60))
    wait_until(lambda: driver.buffered == 2)  # received ahead
    opener = threading.Timer(0.2, reader.delete_gate.set)
    opener.start()

    stop.set()
    reader.hang_up()
    try:
        driver.run(stop)
        assert reader.deleted == ["h-m1"]  # flushed before run returned
        assert sorted(reader.released) == ["h-m2", "h-m3"] and set(reader.delays.values()) == {0}
    finally:
        opener.join()
    s = driver.stats
    assert (s.received, s.answered, s.returned, s.batches) == (3, 1, 2, 1)


def test_a_stop_ends_the_receivers_long_polls_within_their_wait():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    reader = ListReader()  # never hung up: each receive waits its whole long poll
    driver = LongPollDriver(
        reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(4), receivers=3, idle_wait_s=0.3
    )
    stop = threading.Event()
    worker = threading.Thread(target=driver.run, args=(stop,))
    worker.start()
    reader.add(message(1, one_hot(1), clock, ttl_s=60))
    wait_until(lambda: driver.stats.answered == 1 and reader.in_flight == 3)
    stop.set()
    worker.join(10)
    assert not worker.is_alive() and reader.in_flight == 0
    assert not [t for t in threading.enumerate() if t.name.startswith(("clipper-receiver", "clipper-acker"))]
    assert reader.deleted == ["h-m1"] and driver.stats.batches == 1


def test_a_stop_and_a_wake_end_an_idle_batch_wait_at_once():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    reader = ListReader()
    driver = LongPollDriver(
        reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(4), idle_wait_s=20.0
    )
    stop = threading.Event()
    worker = threading.Thread(target=driver.run, args=(stop,))
    worker.start()
    wait_until(lambda: reader.in_flight == 1)
    time.sleep(0.1)  # the batcher waits for a first message, up to its 20 s idle wait
    stop.set()
    reader.hang_up()
    driver.wake()  # what the batcher's signal handler does (from a thread)
    started = time.monotonic()
    worker.join(10)
    assert not worker.is_alive() and time.monotonic() - started < 5  # not the rest of the 20 s


def test_received_messages_are_stamped_and_replies_report_their_batch_wait():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    reader = ListReader()
    driver = LongPollDriver(reader, Batcher(FakeResolver(endpoint), replies, clock), FixedController(10), 0.0)
    clock.t = time.time()
    with driving(driver, reader):
        before_ms = time.time() * 1000
        reader.add(message(1, one_hot(1), clock, ttl_s=60))
        (m,) = driver.collect(threading.Event())
        assert m.received_ms is not None and before_ms <= m.received_ms <= time.time() * 1000
        clock.t = (m.received_ms + 7) / 1000  # the batcher's clock: the batch starts 7 ms after the receive
        driver.handle([m])
        (reply,) = replies.lists["1"]
        assert reply.timings["batch_wait_ms"] == pytest.approx(7, abs=0.01)


class GatedStateStore:
    """A controller-state store whose writes wait for ``gate`` (a slow store); it records what was written."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.saved: list[dict] = []
        self.writing = threading.Event()

    def load(self, model: str, version: str):
        return None

    def save(self, model: str, version: str, state: dict) -> None:
        self.writing.set()
        self.gate.wait(5.0)
        self.saved.append(state)


def test_the_controller_state_is_saved_off_the_batch_path_and_the_last_state_at_stop():
    """A save that falls due after a batch is written on a thread of its own: the batches go on while the store
    holds it, no second write starts meanwhile, and the stop's save waits for it and comes last."""
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    reader, store = ListReader(), GatedStateStore()
    driver = LongPollDriver(
        reader,
        Batcher(FakeResolver(endpoint), replies, clock),
        FixedController(10),
        0.0,
        state_store=store,
        state_key=("mlp", "1"),
        save_every_s=0.0,  # a save falls due after every batch
    )
    stop = threading.Event()
    with driving(driver, reader):
        for i in range(1, 4):  # three batches while the first save is held by the store
            reader.add(message(i, one_hot(i), clock, ttl_s=60))
            assert driver.handle(driver.collect(stop)).answered == 1
        assert store.writing.is_set() and store.saved == [] and endpoint.calls == [1, 1, 1]
        store.gate.set()
    assert len(store.saved) == 2  # the held one, then the stop's (none started while the first was held)
