"""Per-application policy parameters: the policy is built with them where the frontend selects and where feedback
updates the state, and values a policy does not take or refuses are refused naming the field."""

from __future__ import annotations

import math

import pytest

from clipper.errors import InvalidInput
from clipper.feedback import FeedbackMessage, FeedbackProcessor
from clipper.selection import PolicyParams, check_params, initial_state, policy_for, state_key
from tests.fakes import digits_app
from tests.unit.test_feedback import _payload, learning  # noqa: F401  (fixture)
from tests.unit.test_query_processor import one_hot, world  # noqa: F401  (fixture)

pytestmark = pytest.mark.unit


def test_the_policy_is_built_with_the_parameters_it_takes() -> None:
    params = PolicyParams(eta=0.7, gamma=0.3, epsilon=0.25, k=1)
    assert vars(policy_for("exp3", params))["eta"] == 0.7 and vars(policy_for("exp3", params))["gamma"] == 0.3
    assert vars(policy_for("exp4", params))["k"] == 1 and vars(policy_for("exp4", params))["eta"] == 0.7
    assert vars(policy_for("epsilon_greedy", params))["epsilon"] == 0.25
    assert policy_for("exp3", PolicyParams()) == policy_for("exp3")  # unset: the defaults


def test_a_changed_eta_changes_the_update() -> None:
    state = initial_state("exp4", ["good", "bad"])
    selection = policy_for("exp4").select(state, None)  # type: ignore[arg-type]  (exp4 draws nothing)
    outputs = {"good": 3, "bad": 0}
    for eta in (0.1, 0.5, 2.0):
        weights = policy_for("exp4", PolicyParams(eta=eta)).update(state, selection, outputs, 3).weights
        assert weights["good"] / weights["bad"] == pytest.approx(math.exp(eta))


def test_feedback_and_selection_use_the_apps_parameters(learning) -> None:  # noqa: F811
    p, registry, cache, store = learning
    feedback = FeedbackProcessor(registry, store, cache)
    for name, params in (("slow", PolicyParams(eta=0.1)), ("fast", PolicyParams(eta=1.5)), ("one", PolicyParams(k=1))):
        registry.apps[name] = digits_app(name=name, policy="exp4", policy_params=params)
        registry.links[name] = ["good", "bad"]
        p.predict(name, {"input": one_hot(7)})
        msg = FeedbackMessage(feedback_id=f"f-{name}", app=name, payload=_payload(one_hot(7)), label=7)
        assert feedback.process(msg) == "applied"
    for name, eta in (("slow", 0.1), ("fast", 1.5)):
        weights = store.states[state_key(name)].weights
        assert weights["good"] / weights["bad"] == pytest.approx(math.exp(eta)), name
    one = store.states[state_key("one")]  # k=1: only the heaviest (the first of equals) answered and was judged
    assert [(a.model, a.pulls) for a in one.arms] == [("good", 1), ("bad", 0)]
    assert p.predict("slow", {"input": one_hot(9)}).as_dict(debug=True)["debug"]["models"] == ["good", "bad"]
    assert p.predict("one", {"input": one_hot(9)}).as_dict(debug=True)["debug"]["models"] == ["good"]  # k=1


@pytest.mark.parametrize(
    ("policy", "params", "changed", "field"),
    [
        ("exp3", PolicyParams(k=2), ["k"], "k"),  # exp3 takes no k
        ("single", PolicyParams(eta=0.5), ["eta"], "eta"),
        ("epsilon_greedy", PolicyParams(gamma=0.5), ["gamma"], "gamma"),
        ("exp3", PolicyParams(gamma=1.5), ["gamma"], "gamma"),  # out of (0, 1]
        ("exp4", PolicyParams(eta=-1.0), ["eta"], "eta"),
        ("exp4", PolicyParams(k=0), ["k"], "k"),
    ],
)
def test_parameters_a_policy_does_not_take_or_refuses_are_named(policy, params, changed, field) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_params(policy, params, changed)
    assert refused.value.field == field


def test_parameters_round_trip_as_the_registry_stores_them() -> None:
    params = PolicyParams(eta=0.35, k=2)
    assert params.to_dict() == {"eta": 0.35, "k": 2}
    assert PolicyParams.from_dict({k: repr(v) for k, v in params.to_dict().items()}) == params
    assert params.with_values({"eta": None, "gamma": 0.1}) == PolicyParams(gamma=0.1, k=2)
