"""The long-poll driver's background acknowledgements: chunked deletes, failures logged and counted."""

from __future__ import annotations

import logging
import time

import pytest

from clipper.batching.acker import BackgroundAcker
from clipper.errors import Unavailable

pytestmark = pytest.mark.unit


class FlakyQueue:
    """Records delete calls; the calls numbered in ``fail`` raise as an unreachable queue does."""

    def __init__(self, fail: set[int] = frozenset(), crash: bool = False) -> None:
        self.deletes: list[list[str]] = []
        self.releases: list[tuple[str, int]] = []
        self.fail = fail
        self.crash = crash

    def receive(self, max_messages, wait_s):
        return []

    def delete(self, receipt_handles):
        self.deletes.append(list(receipt_handles))
        if len(self.deletes) in self.fail:
            if self.crash:
                raise RuntimeError("a bug in an adapter")
            raise Unavailable("queue unreachable")

    def release(self, receipt_handle, delay_s):
        self.releases.append((receipt_handle, delay_s))


def test_deletes_go_in_chunks_of_ten_and_a_failed_chunk_is_logged_counted_and_skipped(caplog):
    queue = FlakyQueue(fail={1})
    acker = BackgroundAcker(queue, chunk=10)
    acker.start()
    acker.delete([f"h{i}" for i in range(12)])
    acker.delete([f"h{i}" for i in range(12, 25)])
    with caplog.at_level(logging.WARNING, logger="clipper.batching.acker"):
        assert acker.flush(5.0)
    assert [h for chunk in queue.deletes for h in chunk] == [f"h{i}" for i in range(25)]
    assert all(len(chunk) <= 10 for chunk in queue.deletes)
    assert acker.errors == 1 and acker.deleted == 25 - len(queue.deletes[0])
    assert "queue unreachable" in caplog.text
    acker.close()


def test_an_unexpected_error_does_not_end_the_acker():
    queue = FlakyQueue(fail={1}, crash=True)
    acker = BackgroundAcker(queue, chunk=10)
    acker.start()
    acker.delete(["a"])
    assert acker.flush(5.0)
    acker.delete(["b"])
    acker.release("c", 4)
    assert acker.flush(5.0)
    assert queue.deletes == [["a"], ["b"]] and queue.releases == [("c", 4)] and acker.errors == 1
    acker.close()


def test_close_without_a_thread_does_the_work_in_the_callers_thread():
    queue = FlakyQueue()
    acker = BackgroundAcker(queue)
    acker.release("x", 0)
    acker.close()
    assert queue.releases == [("x", 0)] and acker.pending == 0


def test_deletes_within_the_linger_share_one_call_and_none_waits_much_longer():
    queue = FlakyQueue()
    acker = BackgroundAcker(queue, chunk=10, linger_s=0.3)
    acker.start()
    started = time.monotonic()
    for i in range(3):
        acker.delete([f"h{i}"])
        time.sleep(0.02)
    while acker.pending and time.monotonic() - started < 5:
        time.sleep(0.005)
    assert queue.deletes == [["h0", "h1", "h2"]]
    assert 0.25 <= time.monotonic() - started < 2
    acker.close()


def test_a_full_chunk_a_release_and_a_flush_end_the_linger_at_once():
    queue = FlakyQueue()
    acker = BackgroundAcker(queue, chunk=4, linger_s=30)
    acker.start()
    started = time.monotonic()
    acker.delete(["a", "b"])
    acker.delete(["c", "d"])  # the chunk is full
    while acker.pending and time.monotonic() - started < 5:
        time.sleep(0.005)
    assert queue.deletes == [["a", "b", "c", "d"]]
    acker.delete(["e"])
    acker.release("f", 2)
    while acker.pending and time.monotonic() - started < 5:
        time.sleep(0.005)
    assert queue.deletes[1:] == [["e"]] and queue.releases == [("f", 2)]
    acker.delete(["g"])
    assert acker.flush(5.0) and queue.deletes[2:] == [["g"]]
    acker.delete(["h"])
    acker.close()
    assert queue.deletes[3:] == [["h"]]
    assert time.monotonic() - started < 5
