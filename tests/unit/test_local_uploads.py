"""The local stack's upload dispatcher (``infra.local.uploads.UploadDispatcher``) over a fake SQS client: it
long-polls, runs at its niceness under its own thread name, handles what it received, and a stop waits for the
events in hand but not for a receive that is waiting for one."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from infra.local.uploads import UploadDispatcher

pytestmark = pytest.mark.unit


class FakeSqs:
    """receive_message waits until the test lets it answer, as a long poll does; it records the calling thread."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = list(events)
        self.calls: list[dict[str, Any]] = []
        self.threads: list[tuple[str, int]] = []  # (OS thread name, niceness) of each receive
        self.deleted: list[str] = []
        self.receiving, self.answer = threading.Event(), threading.Event()

    def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        tid = threading.get_native_id()
        self.calls.append(kwargs)
        self.threads.append(
            (Path(f"/proc/self/task/{tid}/comm").read_text().strip(), os.getpriority(os.PRIO_PROCESS, tid))
        )
        self.receiving.set()
        self.answer.wait(10)
        self.answer.clear()
        if not self.events:
            return {}
        event = self.events.pop(0)
        return {"Messages": [{"Body": json.dumps(event), "ReceiptHandle": f"h-{event['id']}"}]}

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> None:
        self.deleted.append(ReceiptHandle)


def test_it_long_polls_on_a_thread_of_its_own_at_its_niceness():
    sqs = FakeSqs([])
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    dispatcher = UploadDispatcher(sqs, "queue", lambda event: {}, nice=5)
    dispatcher.start()
    try:
        assert sqs.receiving.wait(5)
        assert sqs.calls[0]["WaitTimeSeconds"] == 20  # SQS's longest long poll: three receives a minute when idle
        assert sqs.threads == [("upload-dispatch", min(19, own + 5))]
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own  # only its own thread
    finally:
        assert dispatcher.finish(timeout_s=1)
        sqs.answer.set()
        dispatcher.join(5)


def test_a_stop_waits_for_the_event_in_hand_not_for_the_poll():
    handling, go_on = threading.Event(), threading.Event()
    handled = []

    def handle(event: dict[str, Any]) -> dict[str, Any]:
        handling.set()
        go_on.wait(10)
        handled.append(event["id"])
        return {}

    sqs = FakeSqs([{"id": "a"}])
    dispatcher = UploadDispatcher(sqs, "queue", handle)
    dispatcher.start()
    sqs.answer.set()
    assert handling.wait(5)
    assert not dispatcher.finish(timeout_s=0.2)  # halted, but the upload it holds is still being handled
    go_on.set()
    assert dispatcher.finish(timeout_s=5) and handled == ["a"] and sqs.deleted == ["h-a"]
    sqs.answer.set()  # a receive waiting meanwhile, if one was (the dispatcher receives while an upload is handled)
    dispatcher.join(5)
    assert not dispatcher.is_alive() and len(sqs.calls) <= 2  # halted: no receive after it


def test_a_stop_while_it_waits_for_an_event_returns_at_once():
    sqs = FakeSqs([])
    dispatcher = UploadDispatcher(sqs, "queue", lambda event: {})
    dispatcher.start()
    assert sqs.receiving.wait(5)
    assert dispatcher.finish(timeout_s=0.5)  # the waiting receive is left behind: the thread is a daemon
    assert dispatcher.daemon and dispatcher.is_alive()
    sqs.answer.set()
    dispatcher.join(5)
    assert not dispatcher.is_alive() and len(sqs.calls) == 1


class FlakySqs:
    """Two upload events; the first one's delete fails (moto restarting right after it was handled)."""

    def __init__(self) -> None:
        self.events = [{"id": 1}, {"id": 2}]
        self.deletes = 0
        self.handled: list[int] = []
        self.second = threading.Event()

    def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        if not self.events:
            threading.Event().wait(0.05)
            return {}
        e = self.events.pop(0)
        return {"Messages": [{"Body": json.dumps(e), "ReceiptHandle": f"h{e['id']}"}]}

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> None:
        self.deletes += 1
        if self.deletes == 1:  # moto restarting right after the first event was handled
            raise ConnectionError("Could not connect to the endpoint URL")

    def change_message_visibility(self, **kwargs: Any) -> None:
        pass


def test_the_dispatcher_keeps_running_after_a_failed_delete():
    """As it survives a failed receive: a thread ended by one failed delete left every later upload unregistered
    until the stack restarted (found by a review)."""
    sqs = FlakySqs()

    def handle(event: dict[str, Any]) -> dict[str, Any]:
        sqs.handled.append(event["id"])
        if event["id"] == 2:
            sqs.second.set()
        return {"outcomes": []}

    d = UploadDispatcher(sqs, "q", handle, wait_s=0)
    d.start()
    try:
        # the second upload event must still be handled after the first one's delete failed
        assert sqs.second.wait(3), f"dispatcher thread alive={d.is_alive()}, handled={sqs.handled}"
    finally:
        d.halt.set()


class BatchSqs:
    """Answers its events in one receive, then nothing (after a short wait, as a long poll would)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.deleted: list[str] = []

    def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        got, self.events = self.events, []
        if not got:
            threading.Event().wait(0.05)
        return {"Messages": [{"Body": json.dumps(e), "ReceiptHandle": f"h-{e['id']}"} for e in got]}

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> None:
        self.deleted.append(ReceiptHandle)


def upload(event_id: str, model: str, version: str = "1") -> dict[str, Any]:
    """An upload's event as EventBridge delivers it, with an id for the test."""
    return {"id": event_id, "detail": {"object": {"key": f"models/{model}/{version}/model.onnx"}}}


class Handler:
    """Records which events started and ended; an event named in ``hold`` waits until the test releases it."""

    def __init__(self, *hold: str) -> None:
        self.started: list[str] = []
        self.ended: list[str] = []
        self.threads: set[tuple[str, int]] = set()  # (OS thread name, niceness) of the threads that handled them
        self.release = {e: threading.Event() for e in hold}
        self.changed = threading.Condition()

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        tid = threading.get_native_id()
        comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        with self.changed:
            self.started.append(event["id"])
            self.threads.add((comm, os.getpriority(os.PRIO_PROCESS, tid)))
            self.changed.notify_all()
        if event["id"] in self.release:
            assert self.release[event["id"]].wait(10)
        with self.changed:
            self.ended.append(event["id"])
            self.changed.notify_all()
        return {"outcomes": []}

    def wait(self, what: Any) -> bool:
        with self.changed:
            return self.changed.wait_for(what, timeout=5)


def test_a_slow_upload_holds_only_its_own_versions_later_events_and_those_keep_their_order():
    """One thread handled every upload: a model whose validation took its whole time limit held every other
    model's upload behind it."""
    handler = Handler("slow-1")
    sqs = BatchSqs([upload("slow-1", "slow"), upload("slow-2", "slow"), upload("other", "other")])
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    dispatcher = UploadDispatcher(sqs, "queue", handler, wait_s=0, nice=5)
    dispatcher.start()
    try:
        # handled while slow-1 still is
        assert handler.wait(lambda: "other" in handler.ended and "slow-1" in handler.started)
        assert sorted(handler.started) == ["other", "slow-1"]
        assert "slow-1" not in handler.ended and "slow-2" not in handler.started  # its own version's next waits
        handler.release["slow-1"].set()
        assert handler.wait(lambda: "slow-2" in handler.ended)
        assert [e for e in handler.ended if e.startswith("slow")] == ["slow-1", "slow-2"]
        assert sorted(sqs.deleted) == ["h-other", "h-slow-1", "h-slow-2"]
        # on threads of their own at the dispatcher's niceness (the validation processes they start inherit it)
        assert handler.threads == {("upload-lane", min(19, own + 5))}
    finally:
        for release in handler.release.values():
            release.set()
        assert dispatcher.finish(timeout_s=5)


def test_at_most_workers_events_are_handled_at_once():
    handler = Handler("a", "b", "c")
    sqs = BatchSqs([upload("a", "a"), upload("b", "b"), upload("c", "c")])
    dispatcher = UploadDispatcher(sqs, "queue", handler, wait_s=0, workers=2)
    dispatcher.start()
    try:
        assert handler.wait(lambda: len(handler.started) == 2)
        threading.Event().wait(0.2)
        first = list(handler.started)
        assert len(first) == 2  # the third waits for a slot
        for e in first:
            handler.release[e].set()
        assert handler.wait(lambda: len(handler.started) == 3)
    finally:
        for release in handler.release.values():
            release.set()
        assert dispatcher.finish(timeout_s=5)


def test_a_stop_starts_none_of_the_events_waiting_in_a_lane():
    handler = Handler("first")
    sqs = BatchSqs([upload("first", "m"), upload("second", "m")])
    dispatcher = UploadDispatcher(sqs, "queue", handler, wait_s=0)
    dispatcher.start()
    assert handler.wait(lambda: handler.started == ["first"])
    dispatcher.halt.set()
    handler.release["first"].set()
    assert dispatcher.finish(timeout_s=5)
    threading.Event().wait(0.2)
    # the second stays in the queue, unhandled: the next start finds its upload (lost_uploads) and hands it over
    assert handler.ended == ["first"] and sqs.deleted == ["h-first"]


class QueueSqs:
    """A queue of events: each receive answers as many as it asks for (up to 10), recording how many events the
    handler held (received and not ended) when it asked, and how many it asked for."""

    def __init__(self, events: list[dict[str, Any]], handler: Handler) -> None:
        self.events, self.handler = events, handler
        self.received = 0
        self.asks: list[tuple[int, int]] = []  # (events held by the handler, MaxNumberOfMessages)
        self.deleted: list[str] = []

    def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        with self.handler.changed:
            self.asks.append((self.received - len(self.handler.ended), kwargs["MaxNumberOfMessages"]))
        got, self.events = self.events[: kwargs["MaxNumberOfMessages"]], self.events[kwargs["MaxNumberOfMessages"] :]
        self.received += len(got)
        if not got:
            threading.Event().wait(0.05)
        return {"Messages": [{"Body": json.dumps(e), "ReceiptHandle": f"h-{e['id']}"} for e in got]}

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> None:
        self.deleted.append(ReceiptHandle)


def test_it_receives_only_while_its_lanes_have_room_for_what_it_receives():
    """It received batches of 10 whatever its workers held: the events waited in memory while their visibility
    timeout ran, and could come back and be handled twice."""
    names = [f"e{i}" for i in range(5)]
    handler = Handler(*names)
    sqs = QueueSqs([upload(n, n) for n in names], handler)  # each its own version: a lane each
    dispatcher = UploadDispatcher(sqs, "queue", handler, wait_s=0, workers=2)
    dispatcher.start()
    try:
        assert handler.wait(lambda: len(handler.started) == 2)
        threading.Event().wait(0.3)  # were it to receive while full, it would have by now (it polls at once)
        assert sqs.received == 2 and len(handler.started) == 2  # the others are still in the queue, not in memory
        for name in names:  # one by one: each end makes room for one more
            assert handler.wait(lambda name=name: name in handler.started)
            handler.release[name].set()
        assert handler.wait(lambda: len(handler.ended) == 5)
        assert sorted(sqs.deleted) == sorted(f"h-{n}" for n in names)
        # never asked for more than the room the held events left
        assert all(held + asked <= 2 for held, asked in sqs.asks), sqs.asks
    finally:
        for release in handler.release.values():
            release.set()
        assert dispatcher.finish(timeout_s=5)


def test_a_backlog_of_one_versions_uploads_does_not_keep_another_versions_from_being_received():
    """The room counts a version's lane once: with its events counted one by one, a slow version whose file was
    put again three times filled the room, and another version's upload was not even received until they drained."""
    handler = Handler("slow-1")
    sqs = QueueSqs([*(upload(f"slow-{i}", "slow") for i in range(1, 5)), upload("other", "other")], handler)
    dispatcher = UploadDispatcher(sqs, "queue", handler, wait_s=0, workers=4)
    dispatcher.start()
    try:
        assert handler.wait(lambda: "other" in handler.ended)
        assert handler.started == ["slow-1", "other"]  # slow-1 still in hand, its version's others behind it
        handler.release["slow-1"].set()
        assert handler.wait(lambda: len(handler.ended) == 5)
        assert [e for e in handler.ended if e.startswith("slow")] == ["slow-1", "slow-2", "slow-3", "slow-4"]
    finally:
        handler.release["slow-1"].set()
        assert dispatcher.finish(timeout_s=5)
