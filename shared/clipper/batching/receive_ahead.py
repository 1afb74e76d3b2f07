"""Receive-ahead for the long-poll driver: receiver threads keep receiving from the model's queue while the
batcher works, into a bounded in-memory buffer from which the batcher forms its batches (Clipper's batch
wait, ``ReceiveBuffer.take``) without a receive round trip of its own.

Several receivers can be in flight at once: an SQS ReceiveMessage returns at most 10 messages, so a batch of
more than 10 needs several; one is enough on Redis Streams, whose read returns a whole batch. The buffer is
bounded (the driver sets its capacity to a small multiple of the controller's current batch size): a driver
never holds more messages than it will start on soon, so none waits out its visibility timeout in one
replica's memory while another replica idles. A receiver asks for no more than the room it reserved.

Every message is stamped twice when it enters: ``ReceivedMessage.received_ms`` (epoch ms, where the adapter
did not set it: the batch wait reported in replies starts there) and its arrival on the buffer's monotonic
clock (the batch wait T is measured on it).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from clipper.errors import ClipperError
from clipper.ports import QueueReader, ReceivedMessage

logger = logging.getLogger(__name__)

WAKE_S = 0.05  # a blocked wait rechecks its stop event at least this often
EMPTY_PAUSE_S = 0.05  # a receive that came back empty sooner than this (a short poll) is not repeated sooner
ERROR_PAUSE_S = 1.0  # after a failed receive


@dataclass(frozen=True)
class Arrival:
    message: ReceivedMessage
    at: float  # the buffer's clock when the message entered


def stamped(messages: list[ReceivedMessage], wall_ms: float) -> list[ReceivedMessage]:
    """``messages`` with ``received_ms`` set to ``wall_ms`` where the adapter did not set it."""
    return [m if m.received_ms is not None else replace(m, received_ms=wall_ms) for m in messages]


class ReceiveBuffer:
    """Received messages in arrival order, at most ``capacity`` of them (counting the receives in flight).

    ``clock`` is monotonic seconds (injected so tests can step it: every wait then also wakes at least every
    ``WAKE_S`` to read it again; on the system's clock a wait is exact, and a stop calls ``wake``, so an idle
    batcher sleeps until a message comes or its idle wait ends); ``wall`` is epoch seconds, for
    ``received_ms``."""

    def __init__(
        self,
        capacity: int,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        # One lock, two conditions: receivers wait on ``_room``, the batcher on ``_filled``; a receive that
        # delivers wakes the batcher only when it waits for a first message or its batch is now full (not
        # once per message: within the batch window its deadline wakes it).
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._filled = threading.Condition(self._lock)
        self._want = 0  # buffered messages the waiting batcher needs to be woken (0: it is not waiting)
        self._items: deque[Arrival] = deque()
        self._reserved = 0
        self._capacity = max(1, capacity)
        self._clock = clock
        self._recheck = WAKE_S if clock is not time.monotonic else math.inf
        self._wall = wall
        self.received = 0  # messages that entered, ever

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def set_capacity(self, capacity: int) -> None:
        with self._lock:
            self._capacity = max(1, capacity)
            self._room.notify_all()

    def wake(self) -> None:
        """Wake every waiter now (to see a stop event sooner)."""
        with self._lock:
            self._room.notify_all()
            self._filled.notify_all()

    def reserve(self, most: int | None, ways: int, halt: threading.Event) -> int:
        """Block until there is room, then reserve some for one receive: at most ``most`` messages (None: no
        limit) and a ``ways``-th of the capacity (so that many receives can be in flight at once). 0 once
        ``halt`` is set."""
        with self._lock:
            while not halt.is_set():
                room = self._capacity - len(self._items) - self._reserved
                if room > 0:
                    n = min(room, -(-self._capacity // max(1, ways)), room if most is None else most)
                    self._reserved += n
                    return n
                self._room.wait(WAKE_S)
            return 0

    def put(self, messages: list[ReceivedMessage], reserved: int) -> None:
        """Append what one receive returned (in its order, one arrival time) and give back its reservation."""
        with self._lock:
            self._reserved -= reserved
            if messages:
                at = self._clock()
                self._items.extend(Arrival(m, at) for m in stamped(messages, self._wall() * 1000))
                self.received += len(messages)
                if self._want and len(self._items) >= self._want:
                    self._filled.notify_all()
            if len(messages) < reserved:  # room given back
                self._room.notify_all()

    def take(
        self, limit: int, batch_wait_s: float, idle_wait_s: float, stop: threading.Event, lead: int = 0
    ) -> list[ReceivedMessage]:
        """The next members of a batch of at most ``limit`` messages (Clipper's batch formation).

        Without ``lead``: wait up to ``idle_wait_s`` for a first message ([] if none comes, or ``stop`` is set),
        then up to ``batch_wait_s`` after it arrived for more, until the batch is full. What the receivers
        deliver within that window joins; what arrives later is left for the next batch. When the first
        message arrived while the previous batch ran, its window may be over already: the batch is cut at once
        with what is buffered (``batch_wait_s`` = 0 always cuts at once). ``lead`` members were chosen already
        (deferred by the previous batch, to run as soon as possible): the batch is completed at once with what
        is buffered. ``stop`` cuts a waiting batch short."""
        room = limit - lead
        if room <= 0:
            return []
        with self._lock:
            opened = self._clock()
            if lead:
                cutoff = opened
            else:
                give_up = opened + idle_wait_s
                while not self._items:
                    left = give_up - self._clock()
                    if left <= 0 or stop.is_set():
                        return []
                    self._wait_for(1, min(left, self._recheck))
                cutoff = max(self._items[0].at + batch_wait_s, opened)
            while True:
                ready = self._count_until(cutoff, room)
                left = cutoff - self._clock()
                if ready >= room or left <= 0 or stop.is_set():
                    break
                self._wait_for(room, min(left, self._recheck))
            taken = [self._items.popleft().message for _ in range(ready)]
            self._room.notify_all()  # receivers waiting for room
            return taken

    def _wait_for(self, count: int, timeout: float) -> None:
        """Wait (the lock held) until ``count`` messages are buffered, ``wake``, or ``timeout``."""
        self._want = count
        try:
            self._filled.wait(timeout)
        finally:
            self._want = 0

    def _count_until(self, cutoff: float, most: int) -> int:
        n = 0
        for arrival in self._items:
            if n >= most or arrival.at > cutoff:
                break
            n += 1
        return n

    def drain(self) -> list[ReceivedMessage]:
        """Everything buffered (on stop: to hand back to the queue)."""
        with self._lock:
            out = [a.message for a in self._items]
            self._items.clear()
            self._room.notify_all()
            return out


class Receivers:
    """``count`` threads that receive from ``reader`` into ``buffer`` until ``halt`` is set: each long-polls
    up to ``wait_s`` for at most ``per_receive`` messages (None: no limit) and a ``count``-th of the buffer's
    capacity (the room it reserved), and ends within its wait once halted. A failed receive is logged and
    retried after a pause; messages a receive returns after the halt still enter the buffer (the driver hands
    them back)."""

    def __init__(
        self,
        reader: QueueReader,
        buffer: ReceiveBuffer,
        halt: threading.Event,
        count: int = 1,
        wait_s: float = 1.0,
        per_receive: int | None = 10,
    ) -> None:
        if count < 1:
            raise ValueError("at least one receiver is needed")
        self._reader = reader
        self._buffer = buffer
        self._halt = halt
        self._wait = wait_s
        self._per_receive = per_receive
        self._threads = [
            threading.Thread(target=self._loop, name=f"clipper-receiver-{i}", daemon=True) for i in range(count)
        ]
        self._errors_lock = threading.Lock()
        self.errors = 0  # failed receives

    @property
    def count(self) -> int:
        return len(self._threads)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for every receiver to end (after ``halt``); False if one is still in a receive."""
        give_up = time.monotonic() + timeout_s
        for t in self._threads:
            if t.ident is not None:  # started
                t.join(max(0.0, give_up - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _loop(self) -> None:
        while not self._halt.is_set():
            n = self._buffer.reserve(self._per_receive, len(self._threads), self._halt)
            if n == 0:
                continue
            got: list[ReceivedMessage] = []
            started = time.monotonic()
            pause = 0.0
            try:
                got = self._reader.receive(n, self._wait)
            except ClipperError as e:
                logger.warning("receive failed: %s", e)
                pause = ERROR_PAUSE_S
            except Exception:  # never let a receiver die: the driver would starve without a word
                logger.exception("receive failed unexpectedly")
                pause = ERROR_PAUSE_S
            finally:
                self._buffer.put(got, n)
            if pause:
                with self._errors_lock:
                    self.errors += 1
            elif not got:
                pause = EMPTY_PAUSE_S - (time.monotonic() - started)
            if pause > 0:
                self._halt.wait(pause)
