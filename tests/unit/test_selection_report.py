"""The selection report's figures on synthetic feedback log entries with known answers."""

from __future__ import annotations

import random

import pytest

from clipper.report.entry import FeedbackEntry, entry_for
from clipper.report.figures import selection_report
from clipper.selection import Selection

pytestmark = pytest.mark.unit


def one(t: float, chosen: str, loss: float, probabilities: dict[str, float], policy: str = "exp3") -> FeedbackEntry:
    return FeedbackEntry(
        time=t,
        feedback_id=f"f{t}",
        app="a",
        user=None,
        label=1,
        policy=policy,
        models=(chosen,),
        probabilities=probabilities,
        outputs={chosen: 1 if loss == 0 else 0},
        losses={chosen: loss},
        versions={chosen: "1"},
        answer=1 if loss == 0 else 0,
        answer_loss=loss,
    )


def drawn(n: int, p_a: float, loss_rate: dict[str, float], seed: int = 7) -> list[FeedbackEntry]:
    """Exp3-like: model a drawn with probability p_a, else b; each model wrong at its planted rate."""
    rng = random.Random(seed)
    out = []
    for t in range(n):
        chosen = "a" if rng.random() < p_a else "b"
        loss = 1.0 if rng.random() < loss_rate[chosen] else 0.0
        out.append(one(float(t), chosen, loss, {"a": p_a, "b": 1 - p_a}))
    return out


def test_a_model_that_is_always_wrong_shows_loss_1_and_one_always_right_0():
    entries = [
        FeedbackEntry(float(t), f"f{t}", "a", None, 3, "exp4", ("good", "bad"), {"good": 0.5, "bad": 0.5},
                      {"good": 3, "bad": 0}, {"good": 0.0, "bad": 1.0}, {"good": "1", "bad": "1"})
        for t in range(10)
    ]  # fmt: skip
    report = selection_report(entries, window=3)
    assert report["models"]["bad"]["mean_loss"] == 1.0
    assert report["models"]["good"]["mean_loss"] == 0.0
    points = report["loss_over_time"]["points"]
    assert [p["feedbacks"] for p in points] == [3, 3, 3, 1]
    assert all(p["mean_loss"] == {"bad": 1.0, "good": 0.0} for p in points)
    assert report["feedbacks"] == 10 and report["policies"] == {"exp4": 10}


def test_loss_over_time_follows_a_model_that_starts_failing():
    entries = [one(float(t), "a", 0.0 if t < 50 else 1.0, {"a": 1.0}) for t in range(100)]
    points = selection_report(entries, window=25)["loss_over_time"]["points"]
    assert [p["mean_loss"]["a"] for p in points] == [0.0, 0.0, 1.0, 1.0]
    assert [p["answer_loss"] for p in points] == [0.0, 0.0, 1.0, 1.0]


def test_exp3_regret_of_always_answering_with_the_best_model_is_zero():
    entries = [one(float(t), "a", 0.0, {"a": 0.9, "b": 0.1}) for t in range(200)]
    regret = selection_report(entries)["exp3_regret"]
    assert regret["feedbacks"] == 200 and regret["regret"] == 0.0 and regret["best_model"] == "a"
    assert regret["estimate"] == "importance_weighted"


def test_exp3_regret_counts_exactly_the_losses_of_the_worse_model():
    # a is never wrong, b always: every time b answered is one unit of regret, exactly
    entries = drawn(1000, 0.8, {"a": 0.0, "b": 1.0})
    b_answers = sum(1 for e in entries if e.models == ("b",))
    regret = selection_report(entries)["exp3_regret"]
    assert regret["regret"] == pytest.approx(b_answers) and regret["empirical"] == pytest.approx(b_answers)
    assert regret["curve"][-1]["regret"] == pytest.approx(b_answers)


def test_exp3_importance_weighting_recovers_the_planted_loss_rates_and_regret():
    n = 8000
    entries = drawn(n, 0.5, {"a": 0.2, "b": 0.7})
    regret = selection_report(entries)["exp3_regret"]
    assert regret["estimated_mean_loss"]["a"] == pytest.approx(0.2, abs=0.03)
    assert regret["estimated_mean_loss"]["b"] == pytest.approx(0.7, abs=0.03)
    assert regret["best_model"] == "a"
    # picking uniformly: expected loss 0.45 per feedback against the best's 0.2
    assert regret["regret"] / n == pytest.approx(0.25, abs=0.03)
    assert regret["empirical"] / n == pytest.approx(0.25, abs=0.03)
    assert len(regret["curve"]) <= 200 and regret["curve"][-1]["feedbacks"] == n
    assert regret["curve"][-1]["regret"] == pytest.approx(regret["regret"])


def test_exp3_regret_skips_feedback_without_the_probability_it_was_drawn_with():
    entries = [one(0.0, "a", 1.0, {}), one(1.0, "a", 0.0, {"a": 0.5, "b": 0.5})]
    regret = selection_report(entries)["exp3_regret"]
    assert regret["skipped"] == 1 and regret["feedbacks"] == 1


def ensemble(t: int, confidence: float, wrong: bool, default: bool = False) -> FeedbackEntry:
    return FeedbackEntry(
        float(t), f"f{t}", "a", None, 1, "exp4", ("x", "y"), {"x": 0.5, "y": 0.5},
        {"x": 0 if wrong else 1, "y": 1}, {"x": 1.0 if wrong else 0.0, "y": 0.0}, {"x": "1", "y": "1"},
        answer=0 if wrong else 1, default=default, confidence=confidence,
        answer_loss=None if default else (1.0 if wrong else 0.0),
    )  # fmt: skip


def test_exp4_error_by_confidence_bucket_is_the_planted_rate():
    entries = [ensemble(t, 0.65, wrong=t < 30) for t in range(100)]  # 30% wrong at confidence 0.65
    entries += [ensemble(100 + t, 1.0, wrong=t < 5) for t in range(100)]  # 5% wrong at full confidence
    entries += [ensemble(200 + t, 0.65, wrong=False, default=True) for t in range(7)]  # defaults: not judged
    cal = selection_report(entries, buckets=10)["exp4_calibration"]
    by_low = {round(b["low"], 1): b for b in cal["buckets"]}
    assert by_low[0.6]["error"] == pytest.approx(0.3) and by_low[0.6]["judged"] == 100
    assert by_low[0.6]["defaults"] == 7 and by_low[0.6]["feedbacks"] == 107
    assert by_low[0.6]["mean_confidence"] == pytest.approx(0.65)
    assert by_low[0.9]["error"] == pytest.approx(0.05)  # confidence 1.0 falls in the last bucket
    assert by_low[0.0]["error"] is None and by_low[0.0]["judged"] == 0
    assert cal["error"] == pytest.approx(35 / 200)
    assert cal["member_loss"] == {"x": pytest.approx(35 / 200), "y": 0.0} and cal["best_member"] == "y"


def test_per_version_split_and_canary_decisions():
    entries = [
        FeedbackEntry(float(t), f"f{t}", "a", None, 1, "exp3", ("m",), {"m": 1.0}, {"m": 1},
                      {"m": 0.0 if t % 2 else 1.0}, {"m": "2" if t % 2 else "1"})
        for t in range(10)
    ]  # fmt: skip
    events = {"m": [{"decision": "promote", "version": "2"}]}
    report = selection_report(entries, canary_events=events)
    assert report["canary"]["m"]["versions"] == {
        "1": {"answers": 5, "mean_loss": 1.0},
        "2": {"answers": 5, "mean_loss": 0.0},
    }
    assert report["canary"]["m"]["events"] == events["m"]
    assert selection_report(entries[:1])["canary"] == {}  # one version, no decision: nothing to say
    assert selection_report(entries)["canary"]["m"]["events"] == []  # two versions answered: a canary ran


def test_an_empty_log_gives_an_empty_report():
    report = selection_report([])
    assert report["feedbacks"] == 0 and report["models"] == {} and report["loss_over_time"]["points"] == []
    assert report["exp3_regret"]["regret"] is None and report["exp4_calibration"]["error"] is None


def test_entry_from_a_prediction_record():
    selection = Selection("exp4", ("x", "y"), {"x": 0.7, "y": 0.3})
    record = {
        "selection": selection.to_dict(),
        "outputs": {"x": 4, "y": 5},
        "versions": {"x": "2", "y": "1"},
        "answer": {"output": 4, "default": False, "confidence": 0.7},
    }
    e = entry_for(10.0, "f1", "a", "u", 5, record)
    assert e.losses == {"x": 1.0, "y": 0.0} and e.answer_loss == 1.0 and e.confidence == 0.7
    assert e.probabilities == {"x": 0.7, "y": 0.3} and e.versions == {"x": "2", "y": "1"}
    assert FeedbackEntry.from_dict(e.to_dict()) == e
    record["answer"] = {"output": -1, "default": True, "confidence": 0.4}
    assert entry_for(10.0, "f1", "a", None, 5, record).answer_loss is None  # the default is not judged
    del record["answer"]  # a record from before answers were recorded
    old = entry_for(10.0, "f1", "a", None, 5, record)
    assert old.answer_loss is None and old.confidence is None and old.losses == {"x": 1.0, "y": 0.0}


def test_a_model_that_gave_no_output_counts_the_loss_the_bandit_counted():
    """The bandit charges a selected model that gave no output a loss of 1; the report's losses came from the
    outputs alone, so its table disagreed with the weights."""
    selection = Selection("exp3", ("x",), {"x": 0.5, "y": 0.5})
    record = {"selection": selection.to_dict(), "outputs": {}, "missing": ["x"], "versions": {"x": "1"}}
    assert entry_for(10.0, "f1", "a", None, 5, record).losses == {"x": 1.0}
