"""Acknowledgements off the batch path: a background thread deletes the messages a batch answered (in
chunks: SQS's DeleteMessageBatch takes 10) and releases the failed ones for a retry after their back-off,
while the driver goes on with the next batch.

Deletes linger: after the first one the thread waits up to ``linger_s`` for more (or until a chunk is full)
and deletes them in one call, so a queue answering one message at a time costs one delete call and one
wake-up of this thread per ``linger_s``, not per batch (and on SQS fewer billed requests). A delete that
lingers is late by at most ``linger_s``; were the process to die meanwhile, its messages come back after
their visibility timeout and their duplicate answers are dropped, as for any failed delete. Releases,
``flush`` and ``close`` do not wait out a linger.

Nothing accepted is lost when an acknowledgement fails: it is logged and counted, and the message comes back
after its visibility timeout (the reply channel answers it once: a duplicate answer is dropped). A release
that fails leaves the message to its visibility timeout, the longest back-off there is. ``close`` flushes.
"""

from __future__ import annotations

import logging
import threading
import time

from clipper.errors import ClipperError
from clipper.ports import QueueReader

logger = logging.getLogger(__name__)

DEFAULT_LINGER_S = 0.02  # clipper-batcher's --ack-linger-ms default, and what the cost model assumes


class BackgroundAcker:
    """Deletes and releases of one queue, done by one thread: each pass does the deletes asked for so far, in
    order and in chunks, then the releases (a message is either deleted or released, never both, so the two
    kinds need no order between them).

    ``chunk``: receipt handles per delete call. ``max_backlog``: asks not yet done beyond which ``delete`` and
    ``release`` block until the thread catches up (a queue that cannot keep up slows the batcher down rather
    than letting acknowledgements pile up past their messages' visibility timeout). ``linger_s``: how long
    a delete waits for others to share its call (0: none)."""

    def __init__(self, reader: QueueReader, chunk: int = 10, max_backlog: int = 10_000, linger_s: float = 0.0) -> None:
        if chunk < 1 or max_backlog < 1 or linger_s < 0:
            raise ValueError("chunk and max_backlog must be at least 1, linger_s at least 0")
        self._reader = reader
        self._chunk = chunk
        self._max_backlog = max_backlog
        self._linger = linger_s
        self._lingering = False  # the thread waits for more deletes: a delete wakes it only when a chunk is full
        self._hurry = False  # a flush waits: end the linger now
        self._cond = threading.Condition()
        self._deletes: list[str] = []
        self._releases: list[tuple[str, int]] = []
        self._asked = 0  # handles asked for, ever
        self._done = 0  # handles whose delete or release was attempted
        self._closing = False
        self._thread: threading.Thread | None = None
        self.deleted = 0
        self.released = 0
        self.errors = 0  # failed delete or release calls

    def start(self) -> None:
        with self._cond:
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._loop, name="clipper-acker", daemon=True)
                self._thread.start()

    def delete(self, receipt_handles: list[str]) -> None:
        if receipt_handles:
            with self._cond:
                self._wait_for_room()
                self._deletes.extend(receipt_handles)
                self._asked += len(receipt_handles)
                if not self._lingering or len(self._deletes) >= self._chunk:
                    self._cond.notify_all()

    def release(self, receipt_handle: str, delay_s: int) -> None:
        with self._cond:
            self._wait_for_room()
            self._releases.append((receipt_handle, delay_s))
            self._asked += 1
            self._cond.notify_all()  # a pending release ends the linger

    def _wait_for_room(self) -> None:
        while self._thread is not None and self._thread.is_alive() and self._asked - self._done >= self._max_backlog:
            self._cond.wait()

    @property
    def pending(self) -> int:
        with self._cond:
            return self._asked - self._done

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything asked for so far was done (or tried); False on timeout. Without a running
        thread, does it in the caller's thread."""
        with self._cond:
            target = self._asked
            running = self._thread is not None and self._thread.is_alive()
            if running:
                self._hurry = True
                self._cond.notify_all()
                return self._cond.wait_for(lambda: self._done >= target, timeout_s)
        self._work_off()
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Do what is pending, then end the thread (what it leaves undone, the caller's thread does)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("acknowledgements not flushed in %.0f s: their messages come back later", timeout_s)
                return
        self._work_off()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._deletes or self._releases or self._closing))
                if self._closing and not (self._deletes or self._releases):
                    return
                self._wait_for_company()
            self._work_off()

    def _wait_for_company(self) -> None:
        """The linger (holding the condition's lock): until ``linger_s`` passed, a chunk is full, or a release,
        flush or close asks for it to end."""
        until = time.monotonic() + self._linger
        self._lingering = True
        try:
            while not (self._hurry or self._closing or self._releases or len(self._deletes) >= self._chunk):
                left = until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        finally:
            self._lingering = False
            self._hurry = False

    def _work_off(self) -> None:
        """One pass over everything asked for so far."""
        with self._cond:
            deletes, self._deletes = self._deletes, []
            releases, self._releases = self._releases, []
        for start in range(0, len(deletes), self._chunk):
            chunk = deletes[start : start + self._chunk]
            try:
                self._reader.delete(chunk)
                self.deleted += len(chunk)
            except Exception as e:  # logged and counted: never lose the acker thread
                self._failed("delete", e, len(chunk))
            self._finished(len(chunk))
        for handle, delay_s in releases:
            try:
                self._reader.release(handle, delay_s)
                self.released += 1
            except Exception as e:  # as above
                self._failed("release", e, 1)
            self._finished(1)

    def _failed(self, what: str, e: Exception, count: int) -> None:
        self.errors += 1
        if isinstance(e, ClipperError):
            # Safe: the messages come back after their visibility timeout and are answered once.
            logger.warning("%s of %d messages failed: %s", what, count, e)
        else:
            logger.error("%s of %d messages failed unexpectedly", what, count, exc_info=e)

    def _finished(self, count: int) -> None:
        with self._cond:
            self._done += count
            self._cond.notify_all()
