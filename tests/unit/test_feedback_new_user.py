"""A new user's first feedback moves that user's weights exactly as one Exp3/Exp4 update from the prior
(the app-wide state before this feedback), and the app-wide state by one update too: the feedback is applied
once to each state, never twice to the new user's copy."""

from __future__ import annotations

import numpy as np
import pytest

from clipper.core.cache_keys import record_keys
from clipper.core.messages import encode_rows
from clipper.errors import NotFound
from clipper.feedback import FeedbackMessage, FeedbackProcessor
from clipper.selection import Arm, Selection, SelectionState, policy_for, state_for_user, state_key
from tests.fakes import InMemoryCache, InMemoryRegistry, InMemorySelectionStore, digits_app

pytestmark = pytest.mark.unit

ROWS = np.eye(64, dtype=np.float32)[3:4]


def world(policy: str, selection: Selection, outputs: dict[str, int], user: str | None):
    registry = InMemoryRegistry()
    registry.apps["app"] = digits_app(name="app", policy=policy)
    registry.links["app"] = ["a", "b", "c"]
    cache, store = InMemoryCache(), InMemorySelectionStore()
    (key,) = record_keys("app", user, ROWS)
    cache.entries[key] = {"selection": selection.to_dict(), "outputs": outputs}
    # a prior the app learnt from earlier feedback (other users'): weights apart from uniform
    arms = (Arm("a", 0.5, 4, 1.0), Arm("b", 0.3, 4, 2.0), Arm("c", 0.2, 4, 3.0))
    store.states[state_key("app")] = SelectionState(policy, arms, version=7, updates=4)
    return FeedbackProcessor(registry, store, cache), store


def feedback(user: str | None, fid: str = "f1") -> FeedbackMessage:
    return FeedbackMessage(feedback_id=fid, app="app", user=user, payload=encode_rows(ROWS)[0], label=3)


CASES = {
    # exp3: "b" was drawn (with probability 0.3) and was wrong: its weight falls by exp(-eta / 0.3)
    "exp3": (Selection("exp3", ("b",), {"a": 0.5, "b": 0.3, "c": 0.2}, 7), {"b": 0}),
    # exp4: every model answered; "a" right, "b" and "c" wrong
    "exp4": (Selection("exp4", ("a", "b", "c"), {"a": 0.5, "b": 0.3, "c": 0.2}, 7), {"a": 3, "b": 0, "c": 1}),
}


@pytest.mark.parametrize("policy", sorted(CASES))
def test_a_new_users_first_feedback_is_one_update_from_the_prior(policy):
    selection, outputs = CASES[policy]
    processor, store = world(policy, selection, outputs, user="new-user")
    prior = store.states[state_key("app")]
    once = policy_for(policy).update(state_for_user(prior, None), selection, outputs, 3)

    assert processor.process(feedback("new-user")) == "applied"

    user_state = store.states[state_key("app", "new-user")]
    assert user_state.weights == pytest.approx(once.weights, rel=1e-12)
    twice = policy_for(policy).update(once, selection, outputs, 3)
    assert user_state.weights != pytest.approx(twice.weights, rel=1e-6)  # the update moves them: not a no-op
    assert user_state.updates == 1
    assert [a.pulls for a in user_state.arms] == [a.pulls for a in once.arms]
    # the app-wide state moved by one update from the same prior, too
    app_state = store.states[state_key("app")]
    assert app_state.weights == pytest.approx(policy_for(policy).update(prior, selection, outputs, 3).weights)
    assert app_state.updates == prior.updates + 1


@pytest.mark.parametrize("policy", sorted(CASES))
def test_a_redelivered_first_feedback_changes_neither_state(policy):
    selection, outputs = CASES[policy]
    processor, store = world(policy, selection, outputs, user="new-user")
    assert processor.process(feedback("new-user")) == "applied"
    before = dict(store.states)
    assert processor.process(feedback("new-user")) == "duplicate"
    assert store.states == before


def test_a_known_users_feedback_is_one_update_of_their_own_state():
    selection, outputs = CASES["exp4"]
    processor, store = world("exp4", selection, outputs, user="known")
    own = SelectionState("exp4", (Arm("a", 0.2), Arm("b", 0.2), Arm("c", 0.6)), version=2, updates=1)
    store.states[state_key("app", "known")] = own
    assert processor.process(feedback("known")) == "applied"
    expected = policy_for("exp4").update(own, selection, outputs, 3)
    assert store.states[state_key("app", "known")].weights == pytest.approx(expected.weights, rel=1e-12)


def test_a_user_whose_state_was_learned_under_the_previous_policy_starts_from_the_apps_as_a_new_user_does():
    """After set_app_policy a returning user's state (of the old policy) was reset to uniform weights, while a
    new user started from the application's state learned under the new policy: in the worker and in the
    frontend's selection alike."""
    selection, outputs = CASES["exp4"]
    processor, store = world("exp4", selection, outputs, user="back")
    old = SelectionState("exp3", (Arm("a", 0.1), Arm("b", 0.1), Arm("c", 0.8)), version=5, updates=9)
    store.states[state_key("app", "back")] = old
    prior = store.states[state_key("app")]
    assert state_for_user(prior, old).weights == pytest.approx(state_for_user(prior, None).weights)
    assert processor.process(feedback("back")) == "applied"
    once = policy_for("exp4").update(state_for_user(prior, None), selection, outputs, 3)
    mine = store.states[state_key("app", "back")]
    assert mine.weights == pytest.approx(once.weights, rel=1e-12) and mine.policy == "exp4"
    assert mine.version > old.version  # the conditional write continues the stored item's versions


def test_feedback_for_an_application_deleted_between_its_reads_is_dropped():
    """The application read, then gone when its links are read (the DynamoDB registry reads both from one item
    collection, and an entry of the registry cache can expire between the two): nothing is left to teach."""
    selection, outputs = CASES["exp4"]
    processor, store = world("exp4", selection, outputs, user=None)
    registry = processor.registry

    class DeletedAfterGetApp(InMemoryRegistry):
        def get_app(self, name):
            app = registry.get_app(name)
            registry.apps.pop(name)
            registry.links.pop(name)
            return app

        def linked_models(self, app):
            if app not in registry.apps:  # as the DynamoDB registry answers for a deleted application
                raise NotFound("application", app)
            return registry.linked_models(app)

    processor.registry = DeletedAfterGetApp()
    before = dict(store.states)
    assert processor.process(feedback(None)) == "unknown_app"
    assert store.states == before
