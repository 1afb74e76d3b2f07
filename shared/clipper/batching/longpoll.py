"""The long-poll driver: a process beside the model server that long-polls its model's queue and cuts
batches with millisecond precision (the Lambda driver's batching window has whole-second granularity).

Queue I/O runs beside the batcher, never on its path:

- receive ahead (``receive_ahead``): ``receivers`` threads long-poll the queue into a bounded buffer
  (``buffer_batches`` x the controller's current batch size, and at least a full receive per receiver), each
  message stamped when it arrived;
- batch formation is Clipper's: block until the first message of a batch is there, then wait up to
  ``batch_wait_s`` after it arrived, or until the batch is full at the controller's current size, taking what
  the receivers deliver meanwhile; never a receive round trip of its own before cutting (with ``receivers``
  ahead; with none, below, the thread's own short receives within the window);
- acknowledgements (``acker``): a background thread deletes what a batch answered (or dropped as expired or
  duplicate) and releases failed messages for a retry after an exponential back-off (the queue's redrive
  policy moves a message to the dead-letter queue after ``maxReceiveCount`` tries).

With ``receivers=0`` the batcher's own thread receives instead (for a transport whose one receive returns
a whole batch: Redis Streams, the local stack's): once a batch is answered, one receive takes everything that
came meanwhile; within the batch wait the thread sleeps and takes what came with a short receive, at the
window's end, or for a long window every quarter of it until the batch is full (``WINDOW_CHECKS``). No thread
is woken per receive and none hands messages over: at the knee's rates, where queries come one or two a batch,
each wake-up and hand-off costs about as much CPU as the query's work. The window opens when the batch's oldest
message entered the queue where the transport says (``ReceivedMessage.sent_ms``: a message that came while the
last batch ran may have its window over already), else when it was received. On a ``DeletingReader`` the
deletes of a batch travel with the next receive (one round trip, no acknowledgement thread at work); a receive
that fails on an unavailable queue keeps them for the one after.

The core cuts each batch to what can still meet its earliest deadline (``Batcher.process(defer=True)``);
the messages it defers stay in flight (neither deleted nor released) and lead the next batch, which is then
completed at once with what is buffered. On stop the receivers end within their long poll, the current
batch finishes, messages still held (buffered or deferred) go back to the queue at once, the acknowledgements
are flushed and the controller's state saved. The process's entry point is ``clipper.entrypoints.batcher``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from clipper.batching.acker import BackgroundAcker
from clipper.batching.controller import BatchSizeController
from clipper.batching.core import Batcher, BatchReport, Inbound
from clipper.batching.receive_ahead import ERROR_PAUSE_S, WAKE_S, ReceiveBuffer, Receivers, stamped
from clipper.errors import ClipperError
from clipper.ports import ControllerStateStore, DeletingReader, QueueReader, ReceivedMessage

logger = logging.getLogger("clipper.batcher")

JOIN_MARGIN_S = 5.0  # beyond the long poll's wait, how long stopping waits for a receive in flight
# receivers=0: short receives within a batch wait, at most (a batch that fills is cut within a quarter of the
# window), and the shortest pause between two (the default 1 ms window: one sleep, one short receive)
WINDOW_CHECKS = 4
MIN_CHECK_S = 0.001


@dataclass
class DriverStats:
    batches: int = 0
    answered: int = 0
    expired: int = 0
    duplicates: int = 0
    failed: int = 0
    deferred: int = 0  # times a message was cut from a batch to meet deadlines (it leads the next one)
    received: int = 0  # messages the receivers took off the queue (updated with each batch and on stop)
    returned: int = 0  # messages held on stop (buffered or deferred) handed back to the queue at once
    receive_errors: int = 0  # failed receives (retried after a pause)
    ack_errors: int = 0  # failed delete or release calls (their messages come back after the visibility timeout)


class LongPollDriver:
    """``receivers``: receives in flight at once (0: none ahead, this thread receives); ``receive_max``:
    messages one receive asks for at most (SQS's 10; None: as many as the buffer has room for, for a transport
    that returns a whole batch); ``buffer_batches``: the buffer's bound in batches of the controller's current
    size (and at least ``receivers`` x ``receive_max``, so each receiver can make a full receive);
    ``idle_wait_s``: the receivers' long poll (a stop is seen within it) and how long ``collect`` waits for a
    first message; ``ack_chunk``: receipt handles per delete call; ``ack_linger_s``: how long a delete waits for
    others to share its call (``BackgroundAcker``). ``clock`` (monotonic seconds) times the batch wait; ``wall``
    (epoch seconds) dates a message's ``sent_ms`` on it. ``on_report`` sees every batch's report (the process's
    counters: EndpointErrors to CloudWatch)."""

    def __init__(
        self,
        reader: QueueReader,
        batcher: Batcher,
        controller: BatchSizeController,
        batch_wait_s: float = 0.001,
        idle_wait_s: float = 1.0,
        max_backoff_s: int = 30,
        state_store: ControllerStateStore | None = None,
        state_key: tuple[str, str] | None = None,
        save_every_s: float = 5.0,
        receivers: int = 1,
        receive_max: int | None = 10,
        buffer_batches: float = 2.0,
        ack_chunk: int = 10,
        ack_linger_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        on_report: Callable[[BatchReport], None] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if buffer_batches < 1:
            raise ValueError("the receive buffer must hold at least one batch (buffer_batches >= 1)")
        if receivers < 0:
            raise ValueError("receivers must be 0 (this thread receives) or more")
        self._reader = reader
        self._batcher = batcher
        self._controller = controller
        self._batch_wait = batch_wait_s
        self._idle_wait = idle_wait_s
        self._max_backoff = max_backoff_s
        self._store = state_store if state_key else None
        self._key = state_key
        self._save_every = save_every_s
        self._on_report = on_report
        self._pending: tuple[BatchSizeController, float] | None = None  # reconfigure(): applied between batches
        self._pending_lock = threading.Lock()
        self._saved_at = time.monotonic()
        self._saver: threading.Thread | None = None
        self._save_lock = threading.Lock()
        self._buffer_batches = buffer_batches
        self._receivers_floor = max(1, receivers) * (receive_max or 1)
        self.stats = DriverStats()
        self._carry: list[ReceivedMessage] = []  # deferred by the last batch: they lead the next one
        self._halt = threading.Event()  # ends the receivers
        self._buffer = ReceiveBuffer(self._capacity(), clock=clock)
        self._receivers = (
            Receivers(reader, self._buffer, self._halt, receivers, idle_wait_s, receive_max) if receivers else None
        )
        self._receive_max = receive_max
        self._clock, self._wall = clock, wall
        self._recheck = WAKE_S if clock is not time.monotonic else math.inf  # as ReceiveBuffer's waits
        self._received = self._receive_errors = 0  # this thread's receives (receivers=0)
        # receivers=0 on a queue whose receive can carry deletes: a batch's deletes wait for the next receive
        self._carrier = reader if receivers == 0 and isinstance(reader, DeletingReader) else None
        self._to_delete: list[str] = []
        self._acker = BackgroundAcker(reader, chunk=ack_chunk, linger_s=ack_linger_s)
        self._started = self._closed = False
        self._restore()

    def _capacity(self) -> int:
        """The buffer's bound: ``buffer_batches`` batches of the controller's current size, and at least a full
        receive for each receiver (a receive costs a round trip whatever it asks for)."""
        batches = math.ceil(self._buffer_batches * self._controller.max_batch_size())
        return max(1, batches, self._receivers_floor)

    def _restore(self) -> None:
        if self._store is None or self._key is None:
            return
        try:
            state = self._store.load(*self._key)
        except ClipperError as e:
            logger.warning("controller state not loaded: %s", e)
            return
        if state:
            self._controller.restore(state)
            logger.info("controller restored: %s", state)

    def save_state(self, wait: bool = True) -> None:
        """Write the controller's state to the store: on this thread (``wait``), or on a thread of its own, so a
        batch never waits for the store (skipped while the last such write still runs; the next one is due
        ``save_every_s`` later). Writes go one at a time, in the order their states were taken."""
        if self._store is None or self._key is None:
            return
        state = self._controller.state()  # taken here, on the thread that drives the controller
        self._saved_at = time.monotonic()
        if wait:
            self._write_state(state)
            return
        if self._saver is not None and self._saver.is_alive():
            return
        self._saver = threading.Thread(
            target=self._write_state, args=(state,), name="clipper-controller-save", daemon=True
        )
        self._saver.start()

    def _write_state(self, state: dict[str, Any]) -> None:
        assert self._store is not None and self._key is not None
        with self._save_lock:
            try:
                self._store.save(*self._key, state)
            except ClipperError as e:
                logger.warning("controller state not saved: %s", e)
            except Exception:  # a bug, on a thread where nothing else would report it
                logger.exception("controller state not saved")

    @property
    def receivers(self) -> int:
        """Receives in flight ahead of the batches (0: this thread receives)."""
        return 0 if self._receivers is None else self._receivers.count

    @property
    def buffered(self) -> int:
        """Messages received and waiting for a batch."""
        return len(self._buffer)

    def start(self) -> None:
        """Start the receivers and the acker (``collect`` and ``run`` do it when needed)."""
        if self._closed:
            raise RuntimeError("the driver was closed")
        if not self._started:
            self._started = True
            self._buffer.set_capacity(self._capacity())
            self._acker.start()
            if self._receivers is not None:
                self._receivers.start()

    def reconfigure(self, controller: BatchSizeController, batch_wait_s: float) -> None:
        """A new controller and batch wait (from any thread), applied before the next batch forms. The new
        controller starts from the old one's learned size when both adapt."""
        with self._pending_lock:
            self._pending = (controller, batch_wait_s)

    def _apply_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        controller, self._batch_wait = pending
        controller.restore(self._controller.state())
        self._controller = controller
        self._buffer.set_capacity(self._capacity())

    @property
    def controller(self) -> BatchSizeController:
        return self._controller

    @property
    def batch_wait_s(self) -> float:
        return self._batch_wait

    def collect(self, stop: threading.Event) -> list[ReceivedMessage]:
        """The next batch: the messages the last batch deferred, then what the receivers delivered within the
        batch wait (``ReceiveBuffer.take``); [] when no message came within ``idle_wait_s`` or on ``stop``."""
        self.start()
        self._apply_pending()
        limit = self._controller.max_batch_size()
        # the deferred lead, within the limit: it may have shrunk since (reconfigured, or AIMD after a slow batch)
        lead, self._carry = self._carry[:limit], self._carry[limit:]
        if self._receivers is None:
            return lead + self._take(limit - len(lead), bool(lead), stop)
        return lead + self._buffer.take(limit, self._batch_wait, self._idle_wait, stop, lead=len(lead))

    def _take(self, room: int, led: bool, stop: threading.Event) -> list[ReceivedMessage]:
        """The batch's members received on this thread (``receivers=0``): one receive (waiting up to
        ``idle_wait_s`` for a first message; none when ``led``: the batch is completed at once). Then, while the
        batch wait after the first message is not over and the batch is not full, the thread sleeps and takes
        what came with one short receive, ``WINDOW_CHECKS`` times in the window at most (the last at its end): a
        batch that fills is cut within a quarter of the window, one that does not at its end. The default window
        (1 ms) is one sleep and one short receive. A stop ends the sleep; the batch is cut with what it has."""
        if room <= 0 or stop.is_set():
            if self._to_delete:  # no receive to carry them (a lead fills the batch): the acknowledger makes them
                self._delete_carried()
            return []
        got = self._receive(room, 0.0 if led else self._idle_wait, stop, pause=not led)
        if not got or led or len(got) >= room or self._batch_wait <= 0:
            return got
        cutoff = self._opened(got) + self._batch_wait
        check_s = max(self._batch_wait / WINDOW_CHECKS, MIN_CHECK_S)
        while len(got) < room:
            left = cutoff - self._clock()
            if left <= 0:
                break  # over (or it was when the batch was received: it came while the last batch ran)
            wake = self._clock() + min(left, check_s)
            while not stop.is_set() and (pause := wake - self._clock()) > 0:
                stop.wait(min(pause, self._recheck))
            if stop.is_set():
                break
            got += self._receive(room - len(got), 0.0, stop, pause=False)
        return got

    def _opened(self, got: list[ReceivedMessage]) -> float:
        """When the batch's window opened, on ``clock``: when its oldest message entered the queue where the
        transport says (a first delivery from a Redis stream: its entry id, the server's clock, which on the
        local stack is this host's), else now (it was just received: a redelivery, or a transport that does not
        say). A clock skew moves the window by as much, bounded by the window itself."""
        now = self._clock()
        sent = [m.sent_ms for m in got if m.sent_ms is not None]
        if not sent:
            return now
        return now - max(0.0, self._wall() - min(sent) / 1000)

    def _receive(self, most: int, wait_s: float, stop: threading.Event, pause: bool = True) -> list[ReceivedMessage]:
        """One receive on this thread, carrying the deletes asked for since the last one (``DeletingReader``).
        A failed receive is logged and counted; its deletes are sent again with the next receive when the queue
        was unavailable, handed to the acknowledger otherwise (an unexpected error must not fail every receive
        after it). With ``pause`` (nothing held yet) the thread then pauses as a receiver would; without (a
        batch in hand: a lead, or its window's short receive) the batch goes on with what it has."""
        deletes, self._to_delete = self._to_delete, []
        most = most if self._receive_max is None else min(most, self._receive_max)
        try:
            if deletes:
                assert self._carrier is not None
                got = self._carrier.receive_and_delete(deletes, most, wait_s)
            else:
                got = self._reader.receive(most, wait_s)
        except Exception as e:  # never let the loop die: the driver would starve without a word
            self._receive_errors += 1
            if isinstance(e, ClipperError):
                logger.warning("receive failed: %s", e)
                self._to_delete = deletes + self._to_delete  # with the next receive: deleting twice is harmless
            else:
                logger.exception("receive failed unexpectedly")
                self._acker.delete(deletes)
            if pause:
                stop.wait(ERROR_PAUSE_S)
            return []
        if got:
            self._received += len(got)
            got = stamped(got, self._wall() * 1000)
        return got

    def handle(self, batch: list[ReceivedMessage]) -> BatchReport:
        started = time.monotonic()
        # the batch wait reported in replies runs from when the message entered the queue where the transport says
        # (with receivers=0 it may wait there while the last batch runs), else from its receipt
        inbound = [
            Inbound(m.message_id, m.body, m.received_ms if m.sent_ms is None else m.sent_ms, m.receive_count == 1)
            for m in batch
        ]
        report = self._batcher.process(inbound, defer=True)
        latency = time.monotonic() - started
        deferred = set(report.deferred)
        self._controller.observe(len(batch) - len(deferred), latency)
        self._buffer.set_capacity(self._capacity())
        failed = set(report.failed)
        # this batch's deferrals, and what a shrunk limit left of the lead it took (``collect``), by arrival
        self._carry = sorted(
            [m for m in batch if m.message_id in deferred] + self._carry, key=lambda m: m.received_ms or 0.0
        )
        answered = [m.receipt_handle for m in batch if m.message_id not in failed and m.message_id not in deferred]
        if self._carrier is not None:
            self._to_delete.extend(answered)  # with the next receive, in its round trip
        else:
            self._acker.delete(answered)  # off the batch path: the acker deletes while the next batch forms
        for m in batch:
            if m.message_id in failed:
                self._acker.release(m.receipt_handle, min(self._max_backoff, 2 ** (m.receive_count - 1)))
        s = self.stats
        s.batches += 1
        s.answered += report.answered
        s.expired += report.expired
        s.duplicates += report.duplicates
        s.failed += len(failed)
        s.deferred += len(deferred)
        self._update_io_stats()
        if self._on_report is not None:
            self._on_report(report)
        if time.monotonic() - self._saved_at >= self._save_every:
            self.save_state(wait=False)  # off the batch path: the next batch does not wait for the store
        return report

    def flush_acks(self, timeout_s: float | None = None) -> bool:
        """Wait until every delete and release asked for so far was done (or failed and was logged); the deletes
        waiting for the next receive are handed to the acknowledger first."""
        self._delete_carried()
        done = self._acker.flush(timeout_s)
        self._update_io_stats()
        return done

    def run(self, stop: threading.Event) -> None:
        self.start()
        try:
            while not stop.is_set():
                batch = self.collect(stop)
                if batch:
                    self.handle(batch)
        finally:
            self.close()

    def wake(self) -> None:
        """After ``stop`` is set from elsewhere (a signal): an idle batch wait sees it now, not at its end."""
        self._buffer.wake()

    def close(self) -> None:
        """Stop: end the receivers (within their long poll), hand every message still held back to the queue
        at once, flush the acknowledgements, save the controller's state. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._halt.set()
        self._buffer.wake()
        if self._receivers is not None and not self._receivers.join(self._idle_wait + JOIN_MARGIN_S):
            logger.warning("a receive did not end in time: what it returns comes back after its visibility timeout")
        self.release_held()
        self._delete_carried()
        self._acker.close()
        self._update_io_stats()
        self.save_state()

    def release_held(self) -> None:
        """Hand the messages deferred by the last batch, and those received for no batch yet, back to the queue
        at once, so another batcher answers them within their deadlines instead of after their visibility
        timeout."""
        held, self._carry = self._carry + self._buffer.drain(), []
        for m in held:
            self._acker.release(m.receipt_handle, 0)
        self.stats.returned += len(held)

    def _delete_carried(self) -> None:
        """The deletes waiting for the next receive, handed to the acknowledger (a stop, a flush: they wait for no
        receive)."""
        deletes, self._to_delete = self._to_delete, []
        self._acker.delete(deletes)

    def _update_io_stats(self) -> None:
        self.stats.received = self._buffer.received + self._received
        self.stats.receive_errors = self._receive_errors + (self._receivers.errors if self._receivers else 0)
        self.stats.ack_errors = self._acker.errors + getattr(self._carrier, "delete_errors", 0)

    def __enter__(self) -> LongPollDriver:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
