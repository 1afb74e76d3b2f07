"""A bandit arm stands for the version of its model that answers: when the active version changes (a rollout, a
rollback, a promoted canary), what the arm learned judged a version that no longer answers, so it starts again
as a newly linked model does; feedback on an answer of a version that no longer serves judges nothing."""

from __future__ import annotations

import pytest

from clipper.feedback import FeedbackMessage, FeedbackProcessor
from clipper.selection import Arm, SelectionState, follow_versions, state_for_user, state_key
from tests.fakes import model_version
from tests.unit.test_feedback import _payload, learning  # noqa: F401  (fixture)
from tests.unit.test_query_processor import one_hot, world  # noqa: F401  (fixture)

pytestmark = pytest.mark.unit


def state(*arms: Arm, version: int = 4) -> SelectionState:
    return SelectionState("exp3", arms, version=version)


def test_an_arm_of_another_version_starts_again_with_the_mean_weight_of_the_others():
    before = state(Arm("a", 0.6, 10, 2.0, "1"), Arm("b", 0.3, 5, 4.0, "1"), Arm("c", 0.1, 5, 5.0, "1"))
    after = follow_versions(before, {"a": "2", "b": "1", "c": "1"})
    a, b, c = after.arms
    assert (a.version, a.pulls, a.losses) == ("2", 0, 0.0) and (b.pulls, c.pulls) == (5, 5)
    assert a.weight == pytest.approx(0.2 / 0.6) and b.weight / c.weight == pytest.approx(3.0)
    assert sum(x.weight for x in after.arms) == pytest.approx(1.0) and after.version == 5


def test_an_arm_that_does_not_know_its_version_takes_the_active_one_and_keeps_what_it_learned():
    before = state(Arm("a", 0.7, 3, 1.0), Arm("b", 0.3, 3, 2.0, "4"))
    after = follow_versions(before, {"a": "9", "b": "4"})
    assert after.arms == (Arm("a", 0.7, 3, 1.0, "9"), Arm("b", 0.3, 3, 2.0, "4"))
    assert follow_versions(after, {"a": "9", "b": "4"}) is after  # nothing to follow: the same state
    assert follow_versions(after, {"b": "4"}) is after  # a model without an active version: left as it is


def test_the_arms_versions_are_stored_and_a_state_without_them_still_reads():
    s = state(Arm("a", 0.5, 1, 0.0, "2"), Arm("b", 0.5))
    assert SelectionState.from_dict(s.to_dict()) == s
    assert "version" not in s.to_dict()["arms"][1]


def test_a_new_users_epsilon_greedy_copy_keeps_the_accuracy_the_application_learned():
    from clipper.selection import EpsilonGreedyPolicy, Selection

    app = SelectionState("epsilon_greedy", (Arm("good", 0.9, 100, 5.0), Arm("bad", 0.1, 100, 90.0)), version=7)
    user = state_for_user(app, None)
    assert [a.pulls for a in user.arms] == [100, 100] and user.version == 0
    missed = EpsilonGreedyPolicy().update(user, Selection("epsilon_greedy", ("good",)), {"good": 0}, 1)
    assert missed.weights["good"] > missed.weights["bad"]  # one miss does not undo a hundred answers
    exp3 = state_for_user(state(Arm("a", 0.5, 9, 1.0, "1"), Arm("b", 0.5, 9, 1.0, "1")), None)
    assert [(a.pulls, a.losses, a.version) for a in exp3.arms] == [(0, 0.0, "1"), (0, 0.0, "1")]


def test_after_a_rollout_feedback_relearns_the_model_and_ignores_answers_of_the_old_version(learning):  # noqa: F811
    p, registry, cache, store = learning
    feedback = FeedbackProcessor(registry, store, cache)
    for i in range(1, 20):  # "bad" always answers 0: it falls behind
        p.predict("ens", {"input": one_hot(i)})
        assert feedback.process(FeedbackMessage(feedback_id=f"a{i}", app="ens", payload=_payload(one_hot(i)), label=i))
    learned = store.states[state_key("ens")]
    assert learned.weights["good"] > 5 * learned.weights["bad"] and learned.arm("bad").version == "1"
    p.predict("ens", {"input": one_hot(30)})  # answered by bad:1, fed back after the rollout below

    registry.versions[("bad", "2")] = model_version("bad", "2")
    registry.active["bad"] = "2"  # bad:2 is rolled out
    chosen = p.selector.state_for(registry.get_app("ens"), ["good", "bad"], None)
    assert chosen.arm("bad").version == "2" and chosen.weights["bad"] == pytest.approx(0.5)  # what queries use

    late = FeedbackMessage(feedback_id="late", app="ens", payload=_payload(one_hot(30)), label=30)
    assert feedback.process(late) == "applied"
    after = store.states[state_key("ens")]
    bad = after.arm("bad")
    assert (bad.version, bad.pulls, bad.losses) == ("2", 0, 0.0)  # bad:1's wrong answer judged nothing
    assert after.arm("good").pulls == learned.arm("good").pulls + 1  # good still answers: judged


def test_feedback_whose_every_answer_came_from_a_version_no_longer_served_is_counted_not_applied(learning):  # noqa: F811
    """It judged nothing, yet was answered "applied" (the state's updates counted it): the report's applied count
    overstated what was learned."""
    p, registry, cache, store = learning
    registry.links["ens"] = ["bad"]  # one model: its answer is the only one
    feedback = FeedbackProcessor(registry, store, cache)
    p.predict("ens", {"input": one_hot(3)})
    assert feedback.process(FeedbackMessage(feedback_id="f0", app="ens", payload=_payload(one_hot(3)), label=3))
    before = store.states[state_key("ens")]
    p.predict("ens", {"input": one_hot(31)})  # answered by bad:1
    registry.versions[("bad", "2")] = model_version("bad", "2")
    registry.active["bad"] = "2"
    late = FeedbackMessage(feedback_id="late", app="ens", payload=_payload(one_hot(31)), label=31)
    assert feedback.process(late) == "version_changed"
    assert store.states[state_key("ens")].updates == before.updates


def test_a_model_linked_to_an_epsilon_greedy_application_starts_with_its_optimistic_estimate():
    """It got the mean weight of the others until its first feedback recomputed the weights, so it was not the
    greedy choice ("every model is tried early" did not hold for a model linked later)."""
    from clipper.selection import EpsilonGreedyPolicy, ensure_state

    learned = SelectionState("epsilon_greedy", (Arm("good", 0.6, 100, 10.0), Arm("bad", 0.4, 100, 40.0)), version=3)
    linked = ensure_state(learned, "epsilon_greedy", ["good", "bad", "new"])
    assert max(linked.arms, key=lambda a: a.weight).model == "new"  # estimate 1 against 0.9 and 0.6
    assert linked.weights["new"] == pytest.approx(1.0 / (1.0 + 91 / 101 + 61 / 101))
    import random

    assert EpsilonGreedyPolicy(epsilon=0.01).select(linked, random.Random(0)).models == ("new",)
    assert ensure_state(linked, "epsilon_greedy", ["good", "bad", "new"]) is linked  # nothing to follow
