"""The feedback worker's loop (``clipper.entrypoints.feedback_worker``) over a fake queue: what one message does
never stops it; with the cache off it skips feedback; feedback for a deleted application is dropped."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from clipper.core.messages import encode_rows
from clipper.entrypoints.feedback_worker import HOLD_MAX_S, FeedbackWorker
from clipper.errors import Unavailable
from clipper.feedback import FeedbackMessage, FeedbackProcessor
from clipper.ports import ReceivedMessage
from tests.fakes import InMemoryCache, InMemoryRegistry, InMemorySelectionStore, digits_app

pytestmark = pytest.mark.unit


class FakeQueue:
    def __init__(self, bodies: list[str], failures: list[Exception] | None = None) -> None:
        self.waiting = [ReceivedMessage(f"m{i}", f"r{i}", b) for i, b in enumerate(bodies)]
        self.deleted: list[str] = []
        self.failures = list(failures or [])
        self.receives = 0

    def receive(self, max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        self.receives += 1
        if self.failures:
            raise self.failures.pop(0)
        got, self.waiting = self.waiting[:max_messages], self.waiting[max_messages:]
        return got

    def delete(self, receipt_handles: list[str]) -> None:
        self.deleted.extend(receipt_handles)

    def release(self, receipt_handle: str, delay_s: int) -> None:
        raise AssertionError("the worker leaves failed messages to their visibility timeout")


def message(app: str = "digits-exp3", feedback_id: str = "f1") -> str:
    payload = encode_rows(np.ones((1, 64), dtype=np.float32))[0]
    return FeedbackMessage(feedback_id=feedback_id, app=app, payload=payload, label=1).to_json()


def processor() -> FeedbackProcessor:
    registry = InMemoryRegistry()
    registry.apps["digits-exp3"] = digits_app(name="digits-exp3", policy="exp3")
    return FeedbackProcessor(registry, InMemorySelectionStore(), InMemoryCache())


def test_one_bad_message_does_not_stop_the_others(caplog):
    calls = []

    def apply(msg: FeedbackMessage):
        calls.append(msg.feedback_id)
        if msg.feedback_id == "bug":
            raise KeyError("selection")  # an unforeseen error
        if msg.feedback_id == "down":
            raise Unavailable("cache down")
        return "applied"

    queue = FakeQueue([message(feedback_id=f) for f in ("a", "bug", "down", "b")] + ["not json"])
    worker = FeedbackWorker(queue, apply)
    assert worker.handle(queue.receive(10, 0)) == ["r0", "r3"]
    assert calls == ["a", "bug", "down", "b"]
    assert queue.deleted == ["r0", "r3"]  # the others stay for a retry, then the dead-letter queue
    assert "failed unexpectedly" in caplog.text and "KeyError" in caplog.text
    assert worker.counts == {"applied": 2}


def test_feedback_for_a_deleted_application_is_dropped_not_retried():
    queue = FakeQueue([message(app="gone")])
    worker = FeedbackWorker(queue, processor().process)
    worker.handle(queue.receive(10, 0))
    assert queue.deleted == ["r0"] and worker.counts == {"unknown_app": 1}


def test_without_the_cache_feedback_is_skipped_with_its_reason(caplog):
    caplog.set_level("INFO", logger="clipper.feedback_worker")  # other tests may leave it at WARNING
    queue = FakeQueue([message(), message(feedback_id="f2")])
    worker = FeedbackWorker(queue, None, "the prediction cache is off")
    worker.handle(queue.receive(10, 0))
    assert queue.deleted == ["r0", "r1"] and worker.counts == {"skipped": 2}
    assert "feedback skipped: the prediction cache is off" in caplog.text


def test_the_loop_survives_a_queue_that_fails_and_stops_when_asked():
    stop = threading.Event()
    queue = FakeQueue([message()], failures=[Unavailable("moto restarting"), RuntimeError("anything")])

    def apply(msg: FeedbackMessage):
        stop.set()
        return "applied"

    worker = FeedbackWorker(queue, apply)
    thread = threading.Thread(target=worker.run, args=(stop, 0, 0.01), daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and queue.receives == 3 and queue.deleted == ["r0"]


def test_the_loop_survives_a_failure_outside_any_one_message(caplog):
    """A batch that cannot be handled (here its delete fails with an error no adapter translated) is logged; its
    messages come back after their visibility timeout, and the worker goes on with the next batch."""
    stop = threading.Event()

    class DeleteFailsOnce(FakeQueue):
        def receive(self, max_messages, wait_s):
            return super().receive(1, wait_s)  # one message a batch

        def delete(self, receipt_handles):
            if receipt_handles == ["r0"]:
                raise RuntimeError("connection reset")  # not a ClipperError
            super().delete(receipt_handles)

    queue = DeleteFailsOnce([message(feedback_id="first"), message(feedback_id="second")])
    applied = []

    def apply(msg: FeedbackMessage):
        applied.append(msg.feedback_id)
        if msg.feedback_id == "second":
            stop.set()
        return "applied"

    worker = FeedbackWorker(queue, apply)
    thread = threading.Thread(target=worker.run, args=(stop, 0, 0.01), daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and applied == ["first", "second"]
    assert queue.deleted == ["r1"]
    assert "not handled" in caplog.text and "connection reset" in caplog.text


def test_a_message_that_does_not_decode_is_dead_lettered_at_once():
    moved: list[tuple[str, str]] = []
    queue = FakeQueue(["not json", message()])
    worker = FeedbackWorker(queue, processor().process, dead_letter=lambda body, why: moved.append((body, why)))
    assert worker.handle(queue.receive(10, 0)) == ["r0", "r1"]
    assert [body for body, _ in moved] == ["not json"] and "not a feedback message" in moved[0][1]
    assert worker.counts == {"dead_lettered": 1, "no_record": 1}


def test_a_poison_message_stays_when_it_cannot_be_dead_lettered():
    def dead_letter(body, why):
        raise Unavailable("dead-letter queue down")

    queue = FakeQueue(["not json"])
    worker = FeedbackWorker(queue, processor().process, dead_letter=dead_letter)
    assert worker.handle(queue.receive(10, 0)) == [] and queue.deleted == []  # the redrive policy moves it later


class HeldQueue(FakeQueue):
    """A receive that waits, as SQS's long poll does, until the test lets it answer."""

    def __init__(self, bodies: list[str]) -> None:
        super().__init__(bodies)
        self.waits: list[float] = []
        self.receiving, self.answer = threading.Event(), threading.Event()

    def receive(self, max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        self.waits.append(wait_s)
        self.receiving.set()
        self.answer.wait(10)
        self.answer.clear()
        return super().receive(max_messages, wait_s)


def test_the_loop_long_polls_and_a_stop_does_not_wait_for_the_poll():
    queue = HeldQueue([message(feedback_id="f1")])
    worker = FeedbackWorker(queue, lambda m: "applied")
    stop = threading.Event()
    loop = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    loop.start()
    assert queue.receiving.wait(5)
    assert queue.waits == [20]  # SQS's longest long poll: an idle queue costs three receives a minute
    stop.set()
    assert worker.finish(timeout_s=0.5)  # nothing in hand: the receive that waits is left behind
    queue.answer.set()  # the receive that was waiting answers after the stop: what it got is still handled
    loop.join(5)
    assert not loop.is_alive() and queue.deleted == ["r0"]


def test_a_stop_waits_for_the_messages_in_hand():
    handling, go_on = threading.Event(), threading.Event()

    def apply(msg: FeedbackMessage) -> str:
        handling.set()
        go_on.wait(10)
        return "applied"

    queue = HeldQueue([message(feedback_id="f1")])
    worker = FeedbackWorker(queue, apply)
    stop = threading.Event()
    loop = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    loop.start()
    queue.answer.set()
    assert handling.wait(5)
    stop.set()
    assert not worker.finish(timeout_s=0.2)  # still applying it
    go_on.set()
    assert worker.finish(timeout_s=5) and queue.deleted == ["r0"]
    loop.join(5)
    assert not loop.is_alive()


def test_with_a_durable_time_applied_feedback_is_acknowledged_once_on_disk():
    """The local stack's moto keeps the bandit states in memory, copied to disk every few seconds: feedback
    acknowledged as soon as it was applied was lost by a kill -9 of the stack (21 of 30 accepted in a fault hunt).
    Held until the copy's time passes it, it comes back after its visibility timeout instead."""
    now = [100.0]
    durable = [0.0]
    queue = FakeQueue([message(feedback_id=f"f{i}") for i in range(3)])
    worker = FeedbackWorker(queue, lambda m: "applied", durable_at=lambda: durable[0], clock=lambda: now[0])

    assert worker.handle(queue.receive(2, 0)) == [] and queue.deleted == [] and worker.held == 2
    now[0] = 101.0
    durable[0] = 100.5  # a copy that began after the first batch was handled
    assert worker.handle(queue.receive(2, 0)) == ["r0", "r1"]  # the first batch only: the second is newer
    assert queue.deleted == ["r0", "r1"] and worker.held == 1
    other = FakeQueue([])  # at exit, through another reader (the receiving one may be in a blocking read)
    durable[0] = 101.5
    assert worker.release(other) == ["r2"] and other.deleted == ["r2"] and worker.held == 0


def test_held_feedback_is_released_while_the_queue_is_quiet():
    durable = [0.0]
    queue = FakeQueue([message(feedback_id="f1")])
    worker = FeedbackWorker(queue, lambda m: "applied", durable_at=lambda: durable[0], clock=lambda: 5.0)
    stop = threading.Event()
    waits: list[float] = []
    receive = queue.receive

    def receiving(max_messages, wait_s):
        waits.append(wait_s)
        if len(waits) == 2:
            durable[0] = 6.0  # the next copy
        if len(waits) == 3:
            stop.set()
        return receive(max_messages, wait_s)

    queue.receive = receiving  # type: ignore[method-assign]
    worker.run(stop, wait_s=20)
    assert queue.deleted == ["r0"] and waits == [20, 2, 20]  # held: back within 2 s; released: long polls again


def test_a_copy_that_began_while_the_feedback_was_applied_does_not_release_it():
    """The copy may have read the state before the feedback's write: only one begun after the writes holds it."""
    now = [100.0]

    def apply(m: FeedbackMessage) -> str:
        now[0] = 102.0  # the write lands at 102; a copy began at 101
        return "applied"

    queue = FakeQueue([message()])
    worker = FeedbackWorker(queue, apply, durable_at=lambda: 101.0, clock=lambda: now[0])
    assert worker.handle(queue.receive(1, 0)) == [] and worker.held == 1


def test_feedback_is_held_no_longer_than_under_its_visibility_timeout(caplog):
    """A state copy that keeps failing (a full disk) would have each applied message delivered again after the
    visibility timeout (180 s), again and again, then dead-lettered though applied."""
    now = [0.0]
    queue = FakeQueue([message()])
    worker = FeedbackWorker(queue, lambda m: "applied", durable_at=lambda: 0.0, clock=lambda: now[0])
    assert worker.handle(queue.receive(1, 0)) == []
    now[0] = HOLD_MAX_S - 1
    assert worker.release(queue) == []
    now[0] = HOLD_MAX_S + 1
    assert worker.release(queue) == ["r0"] and worker.held == 0
    assert "acknowledged without a state copy after 120 s" in caplog.text


def test_feedback_applied_to_a_moto_that_died_is_let_go_to_be_applied_again(caplog):
    """moto died and its restore put back the copy begun at 100: what was applied after that went with it. The next
    copy (of the restored state) begins after the death and would have acknowledged it, lost for good."""
    now = [101.0]
    durable = [100.0]
    lost: list[tuple[float, float] | None] = [None]
    queue = FakeQueue([message(feedback_id=f"f{i}") for i in range(2)])
    worker = FeedbackWorker(
        queue, lambda m: "applied", durable_at=lambda: durable[0], clock=lambda: now[0], lost=lambda: lost[0]
    )
    assert worker.handle(queue.receive(1, 0)) == []  # applied at 101 to the moto that dies at 102
    lost[0] = (100.0, 102.0)
    now[0] = 110.0
    durable[0] = 105.0  # the restored state's first copy
    assert worker.handle(queue.receive(1, 0)) == []  # applied at 110: held
    assert worker.held == 1 and queue.deleted == []  # r0 let go unacknowledged: it comes back
    assert "went with moto's restart" in caplog.text
    durable[0] = 111.0
    assert worker.release(queue) == ["r1"]
