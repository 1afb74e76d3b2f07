from __future__ import annotations

import json
import math

import pytest

from clipper.canary import CanaryEvidence, CanaryParams, VersionEvidence, decide
from clipper.errors import InvalidInput

pytestmark = pytest.mark.unit

PARAMS = CanaryParams()


def labels(n: int, losses: float, queries: int = 0, errors: int = 0, slo_misses: int = 0) -> VersionEvidence:
    return VersionEvidence(feedback=n, loss_sum=losses, queries=queries, errors=errors, slo_misses=slo_misses)


def test_no_verdict_before_the_minimum_feedback_however_bad_the_canary_looks():
    decision = decide(CanaryEvidence(labels(900, 27.0), labels(PARAMS.min_feedback - 1, PARAMS.min_feedback - 1.0)))

    assert decision.kind == "continue"
    assert decision.rule == "min-feedback"
    assert (decision.statistic, decision.threshold) == (PARAMS.min_feedback - 1, PARAMS.min_feedback)


def test_the_current_version_needs_the_minimum_feedback_too():
    decision = decide(CanaryEvidence(labels(10, 0.0), labels(500, 200.0)))

    assert (decision.kind, decision.rule) == ("continue", "min-feedback")


def test_a_clearly_worse_canary_is_rolled_back_at_the_minimum_feedback():
    # The decision tree (about 15% error on digits) against the MLP (about 3%).
    decision = decide(CanaryEvidence(labels(900, 27.0), labels(100, 15.0)))

    assert (decision.kind, decision.rule) == ("rollback", "loss-sprt")
    assert decision.statistic >= decision.threshold == pytest.approx(math.log(0.9 / 0.05))
    assert decision.figures["canary_loss_rate"] == pytest.approx(0.15)
    assert decision.figures["current_loss_rate"] == pytest.approx(0.03)
    assert "worse" in decision.reason


def test_an_equal_canary_is_promoted_after_enough_feedback():
    decision = decide(CanaryEvidence(labels(1800, 54.0), labels(200, 6.0)))

    assert (decision.kind, decision.rule) == ("promote", "loss-sprt")
    assert decision.statistic <= decision.threshold == pytest.approx(math.log(0.1 / 0.95))


def test_a_better_canary_is_promoted():
    decision = decide(CanaryEvidence(labels(900, 135.0), labels(100, 3.0)))

    assert decision.kind == "promote"


def test_close_evidence_continues():
    # Worse by half the margin, little feedback: neither hypothesis is favoured enough yet.
    decision = decide(CanaryEvidence(labels(450, 45.0), labels(60, 7.5)))

    assert (decision.kind, decision.rule) == ("continue", "loss-sprt")
    assert decision.figures["promote_threshold"] < decision.statistic < decision.figures["rollback_threshold"]


def test_the_same_difference_decides_sooner_with_more_feedback():
    few = decide(CanaryEvidence(labels(540, 54.0), labels(60, 9.0)))
    many = decide(CanaryEvidence(labels(5400, 540.0), labels(600, 90.0)))

    assert few.kind == "continue"
    assert many.kind == "rollback"
    assert many.figures["information"] > few.figures["information"]


@pytest.mark.parametrize(
    ("canary_losses", "kind"),
    [(0.12 * 200, "promote"), (0.13 * 200, "rollback")],  # the truncation point is half the margin: 0.125
)
def test_at_max_feedback_the_side_the_evidence_leans_to_wins(canary_losses, kind):
    evidence = CanaryEvidence(labels(200, 20.0), labels(200, canary_losses))
    decision = decide(evidence, CanaryParams(max_feedback=200, alpha=0.01, beta=0.01))

    assert (decision.kind, decision.rule) == (kind, "max-feedback")
    assert decision.threshold == 0.0
    # Below max_feedback the same difference is still undecided.
    assert decide(evidence, CanaryParams(alpha=0.01, beta=0.01)).kind == "continue"


def test_a_failing_canary_is_rolled_back_before_any_feedback():
    # This is the guard: without it, no feedback means "continue" (min-feedback).
    decision = decide(CanaryEvidence(labels(0, 0.0, queries=900, errors=1), labels(0, 0.0, queries=100, errors=20)))

    assert (decision.kind, decision.rule) == ("rollback", "error-guard")
    assert decision.statistic >= decision.threshold == pytest.approx(math.log(1 / PARAMS.guard_alpha))
    assert decision.figures["canary_rate"] == pytest.approx(0.2)
    assert decision.figures["canary_share"] == pytest.approx(0.1)
    assert "error" in decision.reason


def test_a_canary_missing_the_slo_is_rolled_back_even_when_its_loss_is_fine():
    current = labels(900, 27.0, queries=2000, slo_misses=10)
    canary = labels(100, 3.0, queries=200, slo_misses=40)

    decision = decide(CanaryEvidence(current, canary))

    assert (decision.kind, decision.rule) == ("rollback", "slo-guard")
    assert "SLO" in decision.reason


def test_errors_as_frequent_as_the_current_versions_do_not_trip_the_guard():
    current = labels(1800, 54.0, queries=9000, errors=450, slo_misses=900)
    canary = labels(200, 6.0, queries=1000, errors=50, slo_misses=100)

    assert decide(CanaryEvidence(current, canary)).kind == "promote"


def test_the_guard_waits_for_its_minimum_count_of_events():
    params = CanaryParams(guard_min_events=10)
    current = labels(0, 0.0, queries=900)

    assert decide(CanaryEvidence(current, labels(0, 0.0, queries=100, errors=9)), params).rule == "min-feedback"
    assert decide(CanaryEvidence(current, labels(0, 0.0, queries=100, errors=10)), params).rule == "error-guard"


def test_the_guard_needs_queries_on_both_sides():
    decision = decide(CanaryEvidence(labels(0, 0.0), labels(0, 0.0, queries=100, errors=100)))

    assert decision.rule == "min-feedback"


def test_the_decision_is_a_json_safe_event():
    evidence = CanaryEvidence(labels(900, 27.0, queries=1000, errors=2), labels(100, 15.0, queries=110, errors=1))
    decision = decide(evidence)

    event = json.loads(json.dumps(decision.to_dict(), allow_nan=False))

    assert event["kind"] == "rollback"
    assert event["rule"] == "loss-sprt"
    assert CanaryEvidence.from_dict(event["evidence"]) == evidence
    assert event["statistic"] == decision.statistic
    assert set(event["figures"]) >= {"current_loss_rate", "canary_loss_rate", "rollback_threshold"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("alpha", 0.0),
        ("beta", 0.6),
        ("guard_alpha", 1.0),
        ("margin", 0.0),
        ("margin", 1.5),
        ("guard_ratio", 1.0),
        ("min_feedback", 0),
        ("max_feedback", 10),
        ("guard_min_events", 0),
    ],
)
def test_parameters_out_of_range_name_the_field(field, value):
    with pytest.raises(InvalidInput) as caught:
        CanaryParams(**{field: value})

    assert caught.value.field == field
