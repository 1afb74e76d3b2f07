"""Batch formation in the long-poll driver is Clipper's: a batch waits up to T after its first message
arrived, taking what the receivers deliver meanwhile, with no receive of its own before the cut; receives run
ahead of it, several in flight, into a bounded buffer."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from clipper.batching.controller import FixedController
from clipper.batching.core import Batcher
from clipper.batching.longpoll import LongPollDriver
from clipper.batching.receive_ahead import ReceiveBuffer
from clipper.ports import ReceivedMessage
from tests.fakes import FakeClock, FakeEndpoint, FakeResolver, InMemoryReplies
from tests.unit.test_batcher_core import message, one_hot
from tests.unit.test_longpoll_driver import ListReader, driving, ids, wait_until

pytestmark = pytest.mark.unit


class SteppedClock:
    """Monotonic seconds that move only when the test steps them; notes the threads that read them."""

    def __init__(self) -> None:
        self.t = 100.0
        self.readers: set[str] = set()

    def __call__(self) -> float:
        self.readers.add(threading.current_thread().name)
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def make(reader: ListReader, size: int, batch_wait_s: float, **options) -> tuple[LongPollDriver, FakeClock]:
    clock = FakeClock()
    batcher = Batcher(FakeResolver(FakeEndpoint()), InMemoryReplies(), clock)
    options.setdefault("idle_wait_s", 30.0)  # a receive waits until the test adds messages (or hangs up)
    driver = LongPollDriver(reader, batcher, FixedController(size), batch_wait_s, **options)
    driver.start()  # its receivers run from now on
    return driver, clock


def test_messages_arriving_within_the_batch_wait_after_the_first_join_its_batch_later_ones_the_next():
    reader, stepped = ListReader(), SteppedClock()
    driver, clock = make(reader, 10, batch_wait_s=0.010, clock=stepped)
    a, b, c = (message(i, one_hot(i), clock, ttl_s=60) for i in (1, 2, 3))
    stop = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="batcher") as pool, driving(driver, reader, stop):
        reader.add(a)  # arrives at t = 100.000: its batch is cut at 100.010
        wait_until(lambda: driver.buffered == 1)
        first = pool.submit(driver.collect, stop)
        wait_until(lambda: any(name.startswith("batcher") for name in stepped.readers))  # the batch is open
        stepped.advance(0.004)
        reader.add(b)  # 4 ms after the first: joins
        wait_until(lambda: driver.buffered == 2)
        assert not first.done()
        stepped.advance(0.008)
        reader.add(c)  # 12 ms after the first: too late for this batch
        assert ids(first.result(timeout=5)) == ["m1", "m2"]
        wait_until(lambda: driver.buffered == 1)
        stepped.advance(1.0)  # c's own wait is over by the time the next batch opens
        assert ids(driver.collect(stop)) == ["m3"]


def test_a_batch_wait_of_zero_cuts_at_once_with_what_is_buffered():
    reader, stepped = ListReader(), SteppedClock()  # the clock never moves: any wait would never end
    driver, clock = make(reader, 10, batch_wait_s=0.0, clock=stepped)
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool, driving(driver, reader, stop):
        reader.add(message(1, one_hot(1), clock, ttl_s=60))
        wait_until(lambda: driver.buffered == 1)
        reader.add(message(2, one_hot(2), clock, ttl_s=60))  # a second receive
        wait_until(lambda: driver.buffered == 2)
        assert ids(pool.submit(driver.collect, stop).result(timeout=5)) == ["m1", "m2"]


def test_no_receive_round_trip_before_a_cut():
    reader = ListReader()
    driver, clock = make(reader, 10, batch_wait_s=0.005)
    stop = threading.Event()
    with driving(driver, reader):
        reader.add(*[message(i, one_hot(i), clock, ttl_s=60) for i in range(1, 4)])
        wait_until(lambda: driver.buffered == 3 and reader.in_flight == 1)  # the next long poll is waiting
        assert reader.calls == 2
        assert ids(driver.collect(stop)) == ["m1", "m2", "m3"]
        assert reader.calls == 2  # the batch was cut without a receive of its own


def test_several_receives_in_flight_fill_a_batch_far_beyond_ten_from_a_queue_that_returns_ten_at_most():
    reader = ListReader(per_receive=10, receive_s=0.02)  # SQS-like: 10 messages a receive, a round trip each
    driver, clock = make(reader, 40, batch_wait_s=2.0, receivers=4)
    reader.add(*[message(i, one_hot(i % 64), clock, ttl_s=60) for i in range(100)])
    with driving(driver, reader):
        batch = driver.collect(threading.Event())  # full at 40 long before the wait is over
        assert len(batch) == 40 and len({m.message_id for m in batch}) == 40
        assert reader.most_returned == 10 and reader.most_in_flight > 1
        assert driver.handle(batch).answered == 40


@pytest.mark.parametrize(
    ("size", "receivers", "bound"),
    [(30, 4, 60), (10, 1, 20), (1, 4, 40)],  # 2 batches of the current size, at least 10 a receiver
)
def test_the_buffer_holds_at_most_its_bound_received_ahead(size, receivers, bound):
    reader = ListReader(per_receive=10)
    driver, clock = make(reader, size, batch_wait_s=0.0, receivers=receivers, buffer_batches=2)
    reader.add(*[message(i, one_hot(i % 64), clock, ttl_s=60) for i in range(200)])
    with driving(driver, reader):
        wait_until(lambda: driver.buffered == bound)
        wait_until(lambda: reader.in_flight == 0)  # the receivers wait for room...
        assert reader.handed_out == bound and len(reader.waiting) == 200 - bound  # ...the rest stays queued
        assert len(driver.collect(threading.Event())) == size
        wait_until(lambda: driver.buffered == bound)
        assert reader.handed_out == bound + size


class ThreadCountingClock:
    """Real monotonic time; counts the reads made by one thread (the batcher's, each time it wakes)."""

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        self.reads = 0

    def __call__(self) -> float:
        if threading.current_thread().name == self.thread_name:
            self.reads += 1
        return time.monotonic()


def test_messages_arriving_within_the_batch_window_do_not_wake_the_batcher_one_by_one():
    """Within its batch window the batcher sleeps until the window ends or its batch is full: a receive that
    delivers one message does not wake it (it did, once per message, which cost a thread switch per query)."""
    clock = ThreadCountingClock("taker")
    buffer = ReceiveBuffer(capacity=1000, clock=clock)
    halt, stop = threading.Event(), threading.Event()
    taken: list[list[ReceivedMessage]] = []
    taker = threading.Thread(target=lambda: taken.append(buffer.take(100, 0.4, 5.0, stop)), name="taker")
    taker.start()
    for i in range(40):  # one message every ~5 ms, all within the 0.4 s window the first one opens
        n = buffer.reserve(1, 1, halt)
        buffer.put([ReceivedMessage(f"m{i}", f"r{i}", "{}")], n)
        time.sleep(0.005)
    taker.join(5)
    assert [m.message_id for m in taken[0]][:40] == [f"m{i}" for i in range(40)]
    # woken by its deadline checks (every WAKE_S = 50 ms: 8 in 0.4 s), not by each of the 40 deliveries
    assert clock.reads < 20, clock.reads


def test_a_batch_that_fills_within_its_window_is_cut_at_once():
    buffer = ReceiveBuffer(capacity=100)
    halt, stop = threading.Event(), threading.Event()
    taken: list[list[ReceivedMessage]] = []
    taker = threading.Thread(target=lambda: taken.append(buffer.take(5, 10.0, 5.0, stop)))
    taker.start()
    started = time.monotonic()
    for i in range(5):
        n = buffer.reserve(1, 1, halt)
        buffer.put([ReceivedMessage(f"m{i}", f"r{i}", "{}")], n)
    taker.join(5)
    assert not taker.is_alive()
    assert [m.message_id for m in taken[0]] == [f"m{i}" for i in range(5)]
    assert time.monotonic() - started < 2.0  # the full batch, not its 10 s window


def test_an_idle_batcher_sleeps_until_its_idle_wait_ends_and_a_stop_wakes_it():
    """On the system's clock a batcher waiting for a first message sleeps once for its whole idle wait (it woke
    every 50 ms to read the clock: twenty thread wake-ups a second for each idle batcher); a stop wakes it."""
    buffer = ReceiveBuffer(capacity=100)
    waits: list[float | None] = []
    wait = buffer._filled.wait
    buffer._filled.wait = lambda timeout=None: waits.append(timeout) or wait(timeout)  # type: ignore[method-assign]
    stop = threading.Event()
    taken: list[list[ReceivedMessage]] = []
    taker = threading.Thread(target=lambda: taken.append(buffer.take(5, 0.0, 0.6, stop)))
    taker.start()
    taker.join(5)
    assert taken == [[]]
    assert len(waits) <= 2 and max(w for w in waits if w is not None) > 0.5, waits

    taker = threading.Thread(target=lambda: taken.append(buffer.take(5, 0.0, 30.0, stop)))
    started = time.monotonic()
    taker.start()
    time.sleep(0.1)
    stop.set()
    buffer.wake()
    taker.join(5)
    assert not taker.is_alive() and taken[-1] == [] and time.monotonic() - started < 5
