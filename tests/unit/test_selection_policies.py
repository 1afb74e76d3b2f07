from __future__ import annotations

import json
import math
import random
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clipper.errors import InvalidInput
from clipper.selection import (
    POLICIES,
    Arm,
    Combined,
    EpsilonGreedyPolicy,
    Exp3Policy,
    Exp4Policy,
    Selection,
    SelectionState,
    SinglePolicy,
    combine_outputs,
    ensure_state,
    initial_state,
    loss,
    policy_for,
    reconcile,
    resolve,
    state_for_user,
    state_key,
)
from clipper.selection.state import reweighted

pytestmark = pytest.mark.unit

MODELS = ["a", "b", "c", "d", "e", "f"]

model_counts = st.integers(min_value=1, max_value=6)
# One step of feedback: a loss in [0, 1] per model (0 and 1 drawn often).
loss_values = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(min_value=0.0, max_value=1.0))
loss_steps = st.lists(st.lists(loss_values, min_size=6, max_size=6), max_size=120)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def feed(policy, state, steps, rng):
    """Replay loss steps (each selected model outputs its loss as a score against the label 0.0); return
    each step's selection with the state after its update."""
    trace = []
    for losses in steps:
        selection = policy.select(state, rng)
        outputs = {m: losses[MODELS.index(m)] for m in selection.models}
        state = policy.update(state, selection, outputs, 0.0)
        trace.append((selection, state))
    return trace


def assert_safe(state):
    weights = list(state.weights.values())
    assert all(math.isfinite(w) and w > 0 for w in weights)
    assert math.fsum(weights) == pytest.approx(1.0, abs=1e-9)


# --- properties -----------------------------------------------------------------------------------------


@given(model_counts, loss_steps, seeds, st.floats(min_value=0.001, max_value=1.0))
def test_exp3_probabilities_sum_to_one_and_stay_above_the_floor(k, steps, seed, gamma):
    policy = Exp3Policy(gamma=gamma)
    state = initial_state("exp3", MODELS[:k])
    for selection, after in feed(policy, state, steps, random.Random(seed)):
        assert math.fsum(selection.probabilities.values()) == pytest.approx(1.0, abs=1e-9)
        assert min(selection.probabilities.values()) >= gamma / k - 1e-12
        assert len(selection.models) == 1
        assert_safe(after)


@given(model_counts, loss_steps, seeds, st.floats(min_value=0.001, max_value=1.0))
def test_epsilon_greedy_probabilities_sum_to_one_and_stay_above_the_floor(k, steps, seed, epsilon):
    policy = EpsilonGreedyPolicy(epsilon=epsilon)
    state = initial_state(policy.name, MODELS[:k])
    for selection, after in feed(policy, state, steps, random.Random(seed)):
        assert math.fsum(selection.probabilities.values()) == pytest.approx(1.0, abs=1e-9)
        assert min(selection.probabilities.values()) >= epsilon / k - 1e-12
        assert_safe(after)


@given(model_counts, loss_steps, seeds)
def test_exp4_mixing_weights_are_a_distribution(k, steps, seed):
    policy = Exp4Policy()
    state = initial_state("exp4", MODELS[:k])
    for selection, after in feed(policy, state, steps, random.Random(seed)):
        assert set(selection.models) == set(MODELS[:k])
        assert math.fsum(selection.probabilities.values()) == pytest.approx(1.0, abs=1e-9)
        assert_safe(after)


SAFE_POLICIES = [SinglePolicy(), EpsilonGreedyPolicy(), Exp3Policy(), Exp4Policy(), Exp3Policy(gamma=0.001, eta=50.0),
                 Exp4Policy(eta=1e6, min_ratio=1e-300)]  # fmt: skip


@pytest.mark.parametrize("policy", SAFE_POLICIES)
@settings(max_examples=50)
@given(k=model_counts, steps=loss_steps, seed=seeds)
def test_weights_never_become_nan_or_zero(policy, k, steps, seed):
    state = initial_state(policy.name, MODELS[:k])
    for _, after in feed(policy, state, steps, random.Random(seed)):
        assert_safe(after)
        floor = getattr(policy, "min_ratio", 0.0)
        assert min(after.weights.values()) >= floor * max(after.weights.values()) * (1 - 1e-9)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=6), model_counts)
def test_reweighting_survives_any_delta(deltas, k):
    arms = initial_state("exp4", MODELS[:k]).arms
    out = reweighted(arms, dict(zip(MODELS, deltas, strict=False)))
    weights = [a.weight for a in out]
    assert all(math.isfinite(w) and w > 0 for w in weights)
    assert math.fsum(weights) == pytest.approx(1.0)


@pytest.mark.parametrize("policy", [Exp3Policy(), Exp4Policy()])
@given(k=st.integers(min_value=2, max_value=6), steps=loss_steps, seed=seeds)
def test_a_model_that_is_always_right_never_loses_weight(policy, k, steps, seed):
    state, rng = initial_state(policy.name, MODELS[:k]), random.Random(seed)
    before = state.weights["a"]
    others_erred = False
    for losses in steps:
        losses = [0.0, *losses[1:]]  # model "a" is always right
        selection = policy.select(state, rng)
        outputs = {m: losses[MODELS.index(m)] for m in selection.models}
        others_erred |= any(v >= 0.01 for m, v in outputs.items() if m != "a")
        state = policy.update(state, selection, outputs, 0.0)
        assert state.weights["a"] >= before * (1 - 1e-12)
        before = state.weights["a"]
    if others_erred:
        assert state.weights["a"] > 1.0 / k


@given(k=st.integers(min_value=2, max_value=6), seed=seeds)
def test_an_always_right_model_gains_weight_under_exp3(k, seed):
    policy, rng = Exp3Policy(), random.Random(seed)
    state = initial_state("exp3", MODELS[:k])
    for _ in range(300):
        selection = policy.select(state, rng)
        outputs = {m: 1 if m == "a" else 2 for m in selection.models}  # class labels; "a" is right
        state = policy.update(state, selection, outputs, 1)
    assert state.weights["a"] > 0.9
    assert policy.probabilities(state)["a"] == max(policy.probabilities(state).values())


@given(k=st.integers(min_value=2, max_value=6), seed=seeds)
def test_epsilon_greedy_prefers_the_always_right_model(k, seed):
    policy, rng = EpsilonGreedyPolicy(), random.Random(seed)
    state = initial_state(policy.name, MODELS[:k])
    for _ in range(200):
        selection = policy.select(state, rng)
        outputs = {m: 1 if m == "a" else 2 for m in selection.models}
        state = policy.update(state, selection, outputs, 1)
    assert max(state.weights, key=state.weights.__getitem__) == "a"
    assert policy.select(state, random.Random(0)).probabilities["a"] == pytest.approx(0.9 + 0.1 / k)


# --- serialisation --------------------------------------------------------------------------------------

arms_strategy = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=12),
        st.floats(min_value=1e-6, max_value=1.0),
        st.integers(min_value=0, max_value=10**6),
        st.floats(min_value=0.0, max_value=1e6),
    ),
    max_size=6,
    unique_by=lambda t: t[0],
)


@given(st.sampled_from(sorted(POLICIES)), arms_strategy, st.integers(0, 10**9), st.integers(0, 10**9))
def test_state_round_trips_through_json(policy, arms, version, updates):
    total = math.fsum(w for _, w, _, _ in arms)
    state = SelectionState(policy, tuple(Arm(m, w / total, p, x) for m, w, p, x in arms), version, updates)
    data = json.loads(json.dumps(state.to_dict(), allow_nan=False))
    assert SelectionState.from_dict(data) == SelectionState.from_dict(state.to_dict())
    again = SelectionState.from_dict(data)
    assert again.to_dict() == SelectionState.from_dict(again.to_dict()).to_dict()
    assert again.models == state.models and again.version == version and again.policy == policy
    for a, b in zip(again.arms, state.arms, strict=True):
        assert a.weight == pytest.approx(b.weight) and (a.pulls, a.losses) == (b.pulls, b.losses)


def test_state_after_updates_round_trips_exactly():
    policy, rng = Exp3Policy(), random.Random(7)
    state = feed(policy, initial_state("exp3", ["a", "b", "c"]), [[1.0, 0.0, 0.5, 0, 0, 0]] * 30, rng)[-1][1]
    assert state.version == 30
    assert SelectionState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_state_reads_back_dynamodb_numbers():
    state = initial_state("exp4", ["a", "b"])
    data = state.to_dict()
    stored = {**data, "version": Decimal(3), "arms": [{**a, "weight": Decimal(str(a["weight"])),
              "pulls": Decimal(a["pulls"]), "losses": Decimal("0")} for a in data["arms"]]}  # fmt: skip
    back = SelectionState.from_dict(stored)
    assert back.version == 3 and back.weights == {"a": 0.5, "b": 0.5}


@pytest.mark.parametrize(
    "data",
    [
        {"policy": "exp3", "arms": []},
        {"policy": "exp3", "version": 1, "arms": [{"model": "a", "weight": 0.0}]},
        {"policy": "exp3", "version": 1, "arms": [{"model": "a", "weight": float("nan")}]},
        {"policy": "exp3", "version": 1, "arms": [{"model": "a", "weight": 1}, {"model": "a", "weight": 1}]},
        {"policy": "exp3", "version": -1, "arms": []},
        {"schema": 99, "policy": "exp3", "version": 1, "arms": []},
        {"policy": "exp3", "version": 1, "arms": [{"weight": 1}]},
    ],
)
def test_a_corrupt_state_is_refused(data):
    with pytest.raises(ValueError):
        SelectionState.from_dict(data)


def test_selection_round_trips():
    selection = Exp3Policy().select(initial_state("exp3", ["x", "y"]), random.Random(1))
    back = Selection.from_dict(json.loads(json.dumps(selection.to_dict())))
    assert back == Selection(selection.policy, selection.models, dict(selection.probabilities), 0)
    with pytest.raises(ValueError):
        Selection.from_dict({"models": ["x"]})


# --- Exp3 -----------------------------------------------------------------------------------------------


def test_exp3_draws_models_with_their_probabilities():
    policy = Exp3Policy(gamma=0.2)
    state = SelectionState("exp3", (Arm("a", 0.7), Arm("b", 0.2), Arm("c", 0.1)))
    rng = random.Random(3)
    draws = [policy.select(state, rng).models[0] for _ in range(20_000)]
    expected = policy.probabilities(state)
    assert expected == pytest.approx({"a": 0.8 * 0.7 + 0.2 / 3, "b": 0.8 * 0.2 + 0.2 / 3, "c": 0.8 * 0.1 + 0.2 / 3})
    for m, p in expected.items():
        assert draws.count(m) / len(draws) == pytest.approx(p, abs=0.015)


def test_exp3_importance_weights_the_chosen_models_loss():
    policy = Exp3Policy(gamma=0.5, eta=0.1)
    state = initial_state("exp3", ["a", "b"])
    selection = Selection("exp3", ("a",), {"a": 0.25, "b": 0.75})
    new = policy.update(state, selection, {"a": 7}, 3)  # wrong: loss 1, picked with p = 0.25
    assert math.log(new.weights["b"] / new.weights["a"]) == pytest.approx(0.1 / 0.25)
    assert new.version == state.version + 1 and new.updates == 1
    assert new.arm("a") == Arm("a", new.weights["a"], 1, 1.0) and new.arm("b").pulls == 0
    assert state.weights == {"a": 0.5, "b": 0.5}  # the old state is untouched


def test_exp3_does_not_judge_a_model_that_did_not_reply():
    policy = Exp3Policy()
    state = initial_state("exp3", ["a", "b"])
    new = policy.update(state, Selection("exp3", ("a",), {"a": 0.5, "b": 0.5}), {}, 3)
    assert new.weights == state.weights and new.version == 1 and new.arm("a").pulls == 0


def test_exp3_combines_the_one_reply():
    policy, state = Exp3Policy(), initial_state("exp3", ["a", "b"])
    selection = Selection("exp3", ("b",), {"a": 0.5, "b": 0.5})
    assert policy.combine(state, selection, {"b": 4}) == Combined(4, 1.0, ("b",), ())
    late = policy.combine(state, selection, {}, {"b"})
    assert not late.answered and late.missing == ("b",) and late.confidence == 0.0


# --- Exp4 -----------------------------------------------------------------------------------------------


def weighted(**weights):
    return SelectionState("exp4", tuple(Arm(m, w) for m, w in weights.items()))


def test_exp4_queries_every_model_heaviest_first_or_the_top_k():
    state = weighted(a=0.2, b=0.5, c=0.3)
    assert Exp4Policy().select(state, random.Random(0)).models == ("b", "c", "a")
    assert Exp4Policy(k=2).select(state, random.Random(0)).models == ("b", "c")


def test_exp4_weighted_vote_and_confidence():
    policy, state = Exp4Policy(), weighted(a=0.6, b=0.2, c=0.2)
    selection = policy.select(state, random.Random(0))
    combined = policy.combine(state, selection, {"a": 1, "b": 2, "c": 2})
    assert combined.output == 1 and combined.confidence == pytest.approx(0.6)
    combined = policy.combine(state, selection, {"a": 1, "b": 1, "c": 2})
    assert combined.output == 1 and combined.confidence == pytest.approx(0.8)
    assert combined.used == ("a", "b", "c") and combined.missing == ()


def test_exp4_weighted_mean_of_scores():
    policy, state = Exp4Policy(tolerance=0.1), weighted(a=0.5, b=0.25, c=0.25)
    combined = policy.combine(state, policy.select(state, random.Random(0)), {"a": 1.0, "b": 1.0, "c": 2.0})
    assert combined.output == pytest.approx(1.25)
    assert combined.confidence == 0.0  # nobody within 0.1 of the mean
    combined = policy.combine(state, policy.select(state, random.Random(0)), {"a": 1.0, "b": 1.1, "c": 1.0})
    assert combined.output == pytest.approx(1.025) and combined.confidence == pytest.approx(1.0)


def test_exp4_combines_what_arrived_and_reports_the_stragglers():
    policy, state = Exp4Policy(), weighted(a=0.5, b=0.3, c=0.2)
    selection = policy.select(state, random.Random(0))
    combined = policy.combine(state, selection, {"b": 7, "c": 7}, missing={"a"})
    assert combined.output == 7 and combined.used == ("b", "c") and combined.missing == ("a",)
    assert combined.confidence == pytest.approx(0.5)  # the straggler does not agree
    # a model absent from the outputs is missing too, and a NaN score counts as no reply
    combined = policy.combine(state, selection, {"b": 0.5, "c": float("nan")})
    assert combined.output == 0.5 and combined.missing == ("a", "c")
    assert not policy.combine(state, selection, {}, {"a", "b", "c"}).answered


def test_exp4_tie_goes_to_the_heaviest_models_output():
    policy, state = Exp4Policy(), weighted(a=0.4, b=0.4, c=0.2)
    combined = policy.combine(state, policy.select(state, random.Random(0)), {"a": "cat", "b": "dog"}, {"c"})
    assert combined.output == "cat" and combined.confidence == pytest.approx(0.4)


def test_exp4_votes_on_lists():
    outputs = {"a": [1, 2], "b": [1, 2], "c": [3]}
    combined = combine_outputs({"a": 1, "b": 1, "c": 1}, ["a", "b", "c"], outputs)
    assert combined.output == [1, 2] and combined.confidence == pytest.approx(2 / 3)


def test_exp4_update_judges_every_model():
    policy = Exp4Policy(eta=0.5)
    state = initial_state("exp4", ["a", "b", "c"])
    selection = policy.select(state, random.Random(0))
    new = policy.update(state, selection, {"a": 1, "b": 2, "c": 1}, 1)
    assert math.log(new.weights["a"] / new.weights["b"]) == pytest.approx(0.5)
    assert new.weights["a"] == pytest.approx(new.weights["c"])
    assert [a.pulls for a in new.arms] == [1, 1, 1] and new.arm("b").losses == 1.0


# --- single and epsilon-greedy --------------------------------------------------------------------------


def test_single_always_picks_the_first_linked_model_and_only_counts():
    policy, state = SinglePolicy(), initial_state("single", ["mlp", "logreg"])
    rng = random.Random(0)
    for _ in range(20):
        selection = policy.select(state, rng)
        assert selection.models == ("mlp",) and selection.probabilities == {"mlp": 1.0, "logreg": 0.0}
        state = policy.update(state, selection, {"mlp": 0}, 1)
    assert state.weights == {"mlp": 0.5, "logreg": 0.5}
    assert state.arm("mlp") == Arm("mlp", 0.5, 20, 20.0) and state.version == 20


def test_epsilon_greedy_tries_every_model_then_exploits():
    policy, rng = EpsilonGreedyPolicy(epsilon=0.1), random.Random(5)
    state = initial_state(policy.name, ["a", "b", "c"])
    truth = {"a": 0.5, "b": 0.9, "c": 0.2}  # accuracy of each model
    picks = []
    for _ in range(2000):
        selection = policy.select(state, rng)
        m = selection.models[0]
        picks.append(m)
        state = policy.update(state, selection, {m: 1 if rng.random() < truth[m] else 0}, 1)
    assert set(picks[:30]) == {"a", "b", "c"}  # the optimistic prior makes it try each model early
    assert picks[-500:].count("b") / 500 == pytest.approx(0.9 + 0.1 / 3, abs=0.04)
    assert state.arm("b").mean_loss == pytest.approx(0.1, abs=0.03)


# --- the state's life cycle and contextual selection ----------------------------------------------------


def test_reconcile_gives_a_new_model_the_mean_weight_and_drops_an_unlinked_one():
    state = SelectionState("exp3", (Arm("a", 0.6, 3, 1.0), Arm("b", 0.3), Arm("c", 0.1)), version=4)
    assert reconcile(state, ["a", "b", "c"]) is state
    new = reconcile(state, ["b", "a", "d"])
    assert new.models == ("b", "a", "d") and new.version == 5
    assert new.weights["d"] == pytest.approx(new.weights["a"] * 0.45 / 0.6)  # mean of a and b
    assert math.fsum(new.weights.values()) == pytest.approx(1.0)
    assert new.arm("a").pulls == 3
    assert reconcile(state, []).arms == ()


def test_ensure_state_starts_fresh_for_a_new_app_or_a_new_policy():
    assert ensure_state(None, "exp4", ["a", "b"]) == initial_state("exp4", ["a", "b"])
    old = SelectionState("exp3", (Arm("a", 0.9), Arm("b", 0.1)), version=7)
    switched = ensure_state(old, "exp4", ["a", "b"])
    assert switched.policy == "exp4" and switched.version == 8 and switched.weights == {"a": 0.5, "b": 0.5}
    assert ensure_state(old, "exp3", ["a", "b"]) is old


def test_no_linked_model_selects_nothing():
    for name in POLICIES:
        policy = policy_for(name)
        state = initial_state(name, [])
        selection = policy.select(state, random.Random(0))
        assert selection.models == ()
        assert not policy.combine(state, selection, {}).answered


def test_state_keys_are_distinct_and_escaped():
    assert state_key("digits") == "app/digits"
    assert state_key("digits", "u 1") == "app/digits/user/u%201"
    assert state_key("a/user/b") != state_key("a", "b")
    with pytest.raises(InvalidInput) as e:
        state_key("digits", "")
    assert e.value.field == "user_id"


def test_a_new_user_starts_from_a_copy_of_the_app_state():
    app = SelectionState("exp3", (Arm("a", 0.8, 50, 2.0), Arm("b", 0.2, 5, 4.0)), version=55, updates=55)
    user = state_for_user(app, None)
    assert user.weights == app.weights and user.version == 0 and user.updates == 0
    assert all(a.pulls == 0 for a in user.arms)
    known = SelectionState("exp3", (Arm("a", 0.1), Arm("b", 0.9)), version=3)
    assert state_for_user(app, known) is known


# --- names, parameters, losses, the response ------------------------------------------------------------


def test_policy_for_knows_the_four_policies():
    assert {name: policy_for(name).name for name in POLICIES} == {n: n for n in POLICIES}
    assert set(POLICIES) == {"single", "epsilon_greedy", "exp3", "exp4"}


def test_an_unknown_policy_name_names_the_field():
    with pytest.raises(InvalidInput) as e:
        policy_for("exp5")
    assert e.value.field == "policy" and "exp3" in str(e.value) and "'exp5'" in str(e.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Exp3Policy(gamma=0),
        lambda: Exp3Policy(eta=-1),
        lambda: Exp3Policy(min_ratio=0),
        lambda: Exp4Policy(k=0),
        lambda: Exp4Policy(eta=float("inf")),
        lambda: Exp4Policy(tolerance=-1),
        lambda: EpsilonGreedyPolicy(epsilon=0),
    ],
)
def test_bad_parameters_are_refused(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize(
    ("output", "label", "expected"),
    [
        (3, 3, 0.0),
        (3, 4, 1.0),
        ("cat", "cat", 0.0),
        ("3", 3, 1.0),
        (True, 1, 0.0),
        ([1, 2], [1, 2], 0.0),
        (0.25, 0.0, 0.25),
        (3, 3.5, 0.5),
        (10.0, 0.0, 1.0),
        (float("nan"), 1.0, 1.0),
        (None, 1, 1.0),
    ],
)
def test_loss(output, label, expected):
    assert loss(output, label) == pytest.approx(expected)


def test_resolve_answers_the_default_when_nothing_arrived_or_the_app_asks():
    nothing = Combined(None, 0.0, (), ("mlp",))
    r = resolve(nothing, "-1")
    assert r.output == "-1" and r.default and "missing: mlp" in (r.explanation or "")
    unsure = Combined(7, 0.4, ("a", "b"), ())
    kept = resolve(unsure, "-1", threshold=0.5)
    assert kept.output == 7 and not kept.default and kept.low_confidence and "0.400" in (kept.explanation or "")
    replaced = resolve(unsure, "-1", threshold=0.5, default_when_unsure=True)
    assert replaced.output == "-1" and replaced.default and replaced.low_confidence
    sure = resolve(Combined(7, 0.9, ("a",), ()), "-1", threshold=0.5)
    assert (sure.output, sure.default, sure.low_confidence, sure.explanation) == (7, False, False, None)
    assert Combined(7, 0.9, ("a",), ()).confident(0.9) and not nothing.confident(0.0)


_ONE_MODEL_OUTPUTS = [
    0.3,
    -2.5,
    1.0,
    7,
    0,
    True,
    False,
    None,
    "7",
    [1, 2],
    {"a": 1},
    math.nan,
    math.inf,
    -math.inf,
    1e308,
]


@pytest.mark.parametrize("output", _ONE_MODEL_OUTPUTS, ids=repr)
def test_one_selected_model_combines_as_the_general_combination_does(output: object) -> None:
    from clipper.selection.combining import _combine_many

    for weight in (None, -1.0, 0.0, 1e-300, 0.3, 1.0, 3.0, math.inf, math.nan):
        for replied in (True, False):
            for missing in (frozenset(), frozenset({"m"})):
                for tolerance in (0.0, 0.1, 1.0):
                    weights = {"other": 2.0} if weight is None else {"m": weight, "other": 2.0}
                    outputs = {"m": output, "other": 1} if replied else {"other": 1}
                    one = combine_outputs(weights, ["m"], outputs, missing, tolerance)
                    general = _combine_many(weights, ["m"], outputs, missing, tolerance)
                    case = (weight, replied, missing, tolerance)
                    assert (one.used, one.missing, one.confidence) == (
                        general.used,
                        general.missing,
                        general.confidence,
                    ), case
                    assert repr(one.output) == repr(general.output), case  # NaN-safe; 1 and 1.0 told apart


def test_the_score_of_the_one_model_that_replied_is_answered_exactly():
    # (w * v) / w is not always v (1 ulp off for about one score in six at w = 1/3): the mean of one score is it
    rng = random.Random(5)
    third = 1 / 3
    for _ in range(200):
        v = rng.random()
        for selected in (["a"], ["a", "b", "c"]):
            combined = combine_outputs({"a": third, "b": third, "c": third}, selected, {"a": v})
            assert combined.output == v and combined.used == ("a",)


def test_a_nan_weight_in_a_vote_answers_with_no_confidence_rather_than_raising():
    # max(tally) is NaN and equals no tally: the winner was looked for with next(...) and raised StopIteration
    for order in (["a", "b"], ["b", "a"]):
        combined = combine_outputs({"a": math.nan, "b": 1.0}, order, {"a": 1, "b": 2})
        assert combined.answered and combined.output in (1, 2) and combined.confidence == 0.0


def test_exp3_weighs_a_draw_by_its_probability_when_models_were_unlinked_since():
    """Drawn among four models at the floor (gamma / 4); two unlinked before the label came: the importance
    weight is still 1 / (gamma / 4), not clipped to the floor of the two left."""
    policy = Exp3Policy(gamma=0.5, eta=0.1)
    selection = Selection("exp3", ("a",), {"a": 0.125, "b": 0.625, "c": 0.125, "d": 0.125})
    state = initial_state("exp3", ["a", "b"])
    new = policy.update(state, selection, {"a": 7}, 3)  # wrong: loss 1
    assert math.log(new.weights["b"] / new.weights["a"]) == pytest.approx(0.1 / 0.125)


def test_update_judges_a_missing_model_as_the_worst_loss_and_only_if_it_was_asked():
    from clipper.selection.policies import MISSING_LOSS, Exp4Policy
    from clipper.selection.state import initial_state

    policy = Exp4Policy()
    state = initial_state("exp4", ["a", "b", "c"])
    selection = policy.select(state, random.Random(0))
    updated = policy.update(state, selection, {"a": 1}, 1, missing=frozenset({"b", "z"}))
    arms = {arm.model: arm for arm in updated.arms}
    assert (arms["a"].losses, arms["b"].losses, arms["c"].pulls) == (0.0, MISSING_LOSS, 0)  # c: not named, not judged
    assert arms["b"].pulls == 1 and updated.weights["a"] > updated.weights["b"]
    narrow = type(selection)(selection.policy, ("a",), selection.probabilities, selection.state_version)
    alone = policy.update(state, narrow, {"a": 1}, 1, missing=frozenset({"b"}))  # b was not asked: not judged
    assert {arm.model: arm.pulls for arm in alone.arms} == {"a": 1, "b": 0, "c": 0}
