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


def test_a_regression_apps_loss_scale_lets_feedback_tell_its_models_apart() -> None:
    """Scores in the thousands: every error is over 1, so without a scale each model loses 1 on every label and the
    bandit learns nothing; with the app's loss_scale an error of 20 is a small loss and one of 400 a large one."""
    state = initial_state("exp4", ["near", "far"])
    outputs, label = {"near": 1020.0, "far": 1400.0}, 1000.0
    for scale, near_loss, far_loss in ((None, 1.0, 1.0), (500.0, 0.04, 0.8)):
        policy = policy_for("exp4", PolicyParams(loss_scale=scale))
        selection = policy.select(state, None)  # type: ignore[arg-type]  (exp4 draws nothing)
        updated = policy.update(state, selection, outputs, label)
        assert {a.model: a.losses for a in updated.arms} == pytest.approx({"near": near_loss, "far": far_loss})
        ratio = updated.weights["near"] / updated.weights["far"]
        assert ratio == pytest.approx(math.exp(0.1 * (far_loss - near_loss)))
    exp3 = policy_for("exp3", PolicyParams(loss_scale=500.0))
    chosen = exp3.select(initial_state("exp3", ["near", "far"]), __import__("random").Random(3))
    judged = exp3.update(initial_state("exp3", ["near", "far"]), chosen, outputs, label)
    (model,) = chosen.models
    assert {a.model: a.losses for a in judged.arms}[model] == pytest.approx(0.04 if model == "near" else 0.8)


def test_combined_scores_agree_within_a_tenth_of_the_loss_scale() -> None:
    state = initial_state("exp4", ["a", "b"])
    outputs = {"a": 1000.0, "b": 1050.0}  # the weighted mean 1025: each within 25 of it
    for scale, confidence in ((None, 0.0), (500.0, 1.0)):
        policy = policy_for("exp4", PolicyParams(loss_scale=scale))
        combined = policy.combine(state, policy.select(state, None), outputs)  # type: ignore[arg-type]
        assert combined.output == pytest.approx(1025.0) and combined.confidence == confidence


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, math.nan])
def test_a_loss_scale_must_be_a_positive_number(scale) -> None:
    for policy in ("single", "epsilon_greedy", "exp3", "exp4"):
        with pytest.raises(InvalidInput, match=r"^loss_scale: "):
            policy_for(policy, PolicyParams(loss_scale=scale))
