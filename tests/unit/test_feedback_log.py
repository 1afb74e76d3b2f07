"""The feedback log from the query path to the entry: the frontend records what the query answered, the feedback
processor appends one entry per applied feedback (never for a duplicate), and a failing log fails nothing."""

from __future__ import annotations

import pytest

from clipper.feedback import FeedbackMessage, FeedbackProcessor
from clipper.report.recorder import FeedbackRecorder
from tests.fakes import FakeClock
from tests.unit.test_feedback import _payload, learning  # noqa: F401  (fixture)
from tests.unit.test_query_processor import one_hot, world  # noqa: F401  (fixture)

pytestmark = pytest.mark.unit


class ListLog:
    def __init__(self, fail: bool = False) -> None:
        self.entries: list = []
        self.fail = fail

    def append(self, entry) -> None:
        if self.fail:
            raise ConnectionError("the log's table is unreachable")
        self.entries.append(entry)

    def count_skipped(self, app, outcome, at, feedback_id=None) -> bool:
        if self.fail:
            raise ConnectionError("the log's table is unreachable")
        self.entries.append(("skipped", app, outcome, at))
        return True


def test_each_applied_feedback_is_logged_once_with_the_models_losses_and_the_answer(learning):  # noqa: F811
    p, registry, cache, store = learning
    log = ListLog()
    recorder = FeedbackRecorder(log, FakeClock(1234.5))
    feedback = FeedbackProcessor(registry, store, cache, log=recorder)
    body = p.predict("ens", {"input": one_hot(7)}).as_dict()
    msg = FeedbackMessage(feedback_id="f1", app="ens", user=None, payload=_payload(one_hot(7)), label=7)
    assert feedback.process(msg) == "applied"
    assert feedback.process(msg) == "duplicate"  # redelivered: not logged again
    (entry,) = log.entries
    assert entry.time == 1234.5 and entry.feedback_id == "f1" and entry.app == "ens" and entry.label == 7
    assert entry.policy == "exp4" and set(entry.models) == {"good", "bad"}
    assert entry.losses == {"good": 0.0, "bad": 1.0}  # "good" answers the label, "bad" always 0
    assert entry.versions == {"good": "1", "bad": "1"}
    assert entry.confidence == pytest.approx(body["confidence"]) and entry.answer == body["output"]
    assert entry.answer_loss == (0.0 if body["output"] == 7 else 1.0)
    assert recorder.appended == 1 and recorder.failures == 0


def test_a_failing_log_neither_fails_nor_retries_the_feedback(learning):  # noqa: F811
    p, registry, cache, store = learning
    recorder = FeedbackRecorder(ListLog(fail=True), FakeClock(0.0))
    feedback = FeedbackProcessor(registry, store, cache, log=recorder)
    p.predict("ens", {"input": one_hot(3)})
    msg = FeedbackMessage(feedback_id="f2", app="ens", payload=_payload(one_hot(3)), label=3)
    assert feedback.process(msg) == "applied"
    assert recorder.failures == 1 and recorder.appended == 0


def test_feedback_without_a_record_is_not_logged_but_counted(learning):  # noqa: F811
    _, registry, cache, store = learning
    log = ListLog()
    feedback = FeedbackProcessor(registry, store, cache, log=FeedbackRecorder(log, FakeClock(0.0)))
    msg = FeedbackMessage(feedback_id="f3", app="ens", payload=_payload(one_hot(9)), label=9)
    assert feedback.process(msg) == "no_record" and log.entries == [("skipped", "ens", "no_record", 0.0)]


def test_two_deliveries_that_split_the_users_and_the_apps_state_log_the_feedback_once(learning):  # noqa: F811
    from clipper.selection import state_key

    p, registry, cache, store = learning
    log = ListLog()
    feedback = FeedbackProcessor(registry, store, cache, log=FeedbackRecorder(log, FakeClock(0.0)))
    p.predict("ens", {"uid": "u", "input": one_hot(5)})
    msg = FeedbackMessage(feedback_id="twice", app="ens", user="u", payload=_payload(one_hot(5)), label=5)
    real = feedback._apply
    # the first delivery applies the user's state, then the second (a redelivery) overtakes it and applies both
    # the app's (the user's is a duplicate to it); the first finds the app's state a duplicate
    order: list[str] = []

    def apply(app, linked, versions, key, *rest):
        order.append(key)
        if key == state_key("ens") and len(order) == 2:  # the first delivery, before its app-wide update
            assert feedback_second.process(msg) == "applied"
        return real(app, linked, versions, key, *rest)

    feedback_second = FeedbackProcessor(registry, store, cache, log=FeedbackRecorder(log, FakeClock(1.0)))
    feedback._apply = apply  # type: ignore[method-assign]
    assert feedback.process(msg) == "applied"  # its user's update landed
    assert len(log.entries) == 1 and log.entries[0].time == 1.0  # logged by the one that applied the app's


def test_feedback_a_single_model_application_learns_nothing_from_by_design_is_not_counted(world):  # noqa: F811
    """Every feedback of a single-model application is "not_learning" (or only its canary's evidence): a count
    of each would be a write per feedback, and says nothing the sender can mend."""
    registry = world[1]
    from tests.unit.test_feedback import InMemoryCache, InMemorySelectionStore

    log = ListLog()
    feedback = FeedbackProcessor(
        registry, InMemorySelectionStore(), InMemoryCache(), log=FeedbackRecorder(log, FakeClock(0.0))
    )
    msg = FeedbackMessage(feedback_id="s1", app="digits", payload=_payload(one_hot(4)), label=4)
    assert feedback.process(msg) == "not_learning" and log.entries == []


def test_the_logged_losses_of_scores_are_judged_on_the_apps_loss_scale(learning):  # noqa: F811
    """The selection report counts the losses the bandit learned from: with the app's loss_scale."""
    from dataclasses import replace

    from clipper.report.entry import entry_for
    from clipper.selection import PolicyParams, Selection

    p, registry, cache, store = learning
    registry.apps["ens"] = replace(registry.apps["ens"], policy_params=PolicyParams(loss_scale=4.0))
    log = ListLog()
    feedback = FeedbackProcessor(registry, store, cache, log=FeedbackRecorder(log, FakeClock(0.0)))
    p.predict("ens", {"input": one_hot(7)})  # "good" answers 7, "bad" 0: class labels, losses 0 or 1 whatever the scale
    msg = FeedbackMessage(feedback_id="f1", app="ens", payload=_payload(one_hot(7)), label=7)
    assert feedback.process(msg) == "applied"
    assert log.entries[0].losses == {"good": 0.0, "bad": 1.0}
    selection = Selection("exp4", ("a", "b"), {"a": 0.5, "b": 0.5}, 0).to_dict()
    record = {"selection": selection, "outputs": {"a": 9.0, "b": 2.5}, "answer": {"output": 5.75, "default": False}}
    entry = entry_for(0.0, "f2", "ens", None, 8.0, record, scale=4.0)
    assert entry.losses == {"a": 0.25, "b": 1.0} and entry.answer_loss == pytest.approx(0.5625)
    calls = []
    feedback.log.record = lambda message, rec, scale=1.0, incarnation=0: calls.append(scale)  # type: ignore[union-attr,method-assign]
    p.predict("ens", {"input": one_hot(5)})
    assert (
        feedback.process(FeedbackMessage(feedback_id="f3", app="ens", payload=_payload(one_hot(5)), label=5))
        == "applied"
    )
    assert calls == [4.0]  # the processor passes the app's scale on
