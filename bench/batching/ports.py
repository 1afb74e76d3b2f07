"""The system under test's ports in memory: the queue over the load generator's pipe, the recording reply
channel, and the timed endpoint and driver."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from clipper.batching.core import BatchReport
from clipper.batching.longpoll import LongPollDriver
from clipper.core.messages import Reply
from clipper.core.validation import Rows
from clipper.ports import ReceivedMessage


class PipeQueue:
    """The ``QueueReader`` port over the load generator's pipe, for one trial.

    ``receive`` first moves whatever the pipe holds into an in-memory queue, then hands out up to
    ``max_messages``; when both are empty it blocks on the pipe for up to ``wait_s``. The pipe is read in the
    caller's thread (the driver's, as it reads SQS in production), so the system under test runs no extra
    thread; the generator buffers on its side, so a slow reader never slows the arrivals. Thread-safe: delete
    and release (a failed message comes back after its delay, its receive count increased) may come from any
    thread. The generator's end-of-trial record (arrival times) sets ``ended``.
    """

    POLL_SLICE_S = 0.05  # how often a blocked receive checks for close()

    def __init__(self, source: Connection, trial: int) -> None:
        self._source = source
        self._trial = trial
        self._ready: deque[tuple[str, str, int]] = deque()  # (message id, body, receive count)
        self._delayed: list[tuple[float, str, str, int]] = []
        self._in_flight: dict[str, tuple[str, str, int]] = {}
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = threading.Event()
        self.ended = threading.Event()
        self.end: tuple[Any, ...] = ()
        self.received = 0

    def close(self) -> None:
        """Wake a blocked receive (it returns what it has, or nothing)."""
        self._closed.set()

    def pending(self) -> int:
        with self._lock:
            return len(self._ready) + len(self._delayed) + len(self._in_flight)

    def receive(self, max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        deadline = time.monotonic() + wait_s
        while True:
            self.pull(0.0)
            with self._lock:
                self._promote_delayed()
                if self._ready:
                    break
            left = deadline - time.monotonic()
            if left <= 0 or self._closed.is_set():
                return []
            if self.ended.is_set():
                self._closed.wait(min(left, self.POLL_SLICE_S))
            else:
                self.pull(min(left, self.POLL_SLICE_S))
        out = []
        with self._lock:
            for _ in range(min(max_messages, len(self._ready))):
                message_id, body, count = self._ready.popleft()
                handle = f"{message_id}:{count + 1}"
                self._in_flight[handle] = (message_id, body, count + 1)
                out.append(ReceivedMessage(message_id, handle, body, count + 1))
        return out

    def pull(self, wait_s: float) -> None:
        """Move what the pipe holds into the queue, waiting up to ``wait_s`` for the first item."""
        with self._read_lock:
            timeout = wait_s
            while not self.ended.is_set() and self._source.poll(timeout):
                timeout = 0.0
                item = self._source.recv()
                if item[1] != self._trial:
                    continue  # a leftover of an earlier trial
                if item[0] == "end":
                    self.end = item
                    self.ended.set()
                else:
                    with self._lock:
                        self._ready.extend((str(next(self._ids)), body, 0) for body in item[2])
                    self.received += len(item[2])

    def delete(self, receipt_handles: list[str]) -> None:
        with self._lock:
            for handle in receipt_handles:
                self._in_flight.pop(handle, None)

    def release(self, receipt_handle: str, delay_s: int) -> None:
        with self._lock:
            item = self._in_flight.pop(receipt_handle, None)
            if item is not None:
                heapq.heappush(self._delayed, (time.monotonic() + delay_s, *item))

    def _promote_delayed(self) -> None:
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, message_id, body, count = heapq.heappop(self._delayed)
            self._ready.append((message_id, body, count))


class RecordingReplies:
    """The batcher's side of the reply channel (``ReplyPublisher``) in memory: records when each query's reply is
    published (the harness has no frontend waiting for them)."""

    def __init__(self) -> None:
        self.done_at: dict[str, float] = {}  # reply_to -> time.monotonic() at publish
        self.errors = 0
        self._lock = threading.Lock()

    def publish(self, reply_to: str, reply: Reply) -> bool:
        now = time.monotonic()
        with self._lock:
            if not reply.ok:
                self.errors += 1
                return True
            if reply_to in self.done_at:
                return False
            self.done_at[reply_to] = now
            return True

    def answered(self, reply_to: str, model: str) -> bool:
        return reply_to in self.done_at

    def publish_many(self, replies: Sequence[tuple[str, Reply]]) -> list[bool]:
        """A batch at once (the ``ReplyChannel`` port's batch method), as ``RedisReplyChannel`` does in production."""
        now = time.monotonic()
        out = []
        with self._lock:
            for reply_to, reply in replies:
                if not reply.ok:
                    self.errors += 1
                    out.append(True)
                elif reply_to in self.done_at:
                    out.append(False)
                else:
                    self.done_at[reply_to] = now
                    out.append(True)
        return out

    def answered_many(self, keys: Sequence[tuple[str, str]]) -> list[bool]:
        return [reply_to in self.done_at for reply_to, _ in keys]


class TimedEndpoint:
    """Wraps the HTTP endpoint client: records (start, rows, seconds) of every call."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[tuple[float, int, float]] = []

    def predict(self, rows: Rows) -> list[Any]:
        started = time.monotonic()
        out: list[Any] = self._inner.predict(rows)
        self.calls.append((started, len(rows), time.monotonic() - started))
        return out

    def endpoint_for(self, model: str, version: str) -> TimedEndpoint:
        return self


class TimedDriver(LongPollDriver):
    """The long-poll driver, timing how long it spends handling batches (the rest is waiting for work)."""

    busy_s = 0.0

    def handle(self, batch: list[ReceivedMessage]) -> BatchReport:
        started = time.monotonic()
        try:
            return super().handle(batch)
        finally:
            self.busy_s += time.monotonic() - started
