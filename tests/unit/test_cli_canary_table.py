"""``clipper canary``'s and ``clipper inspect``'s text for a model's canary: the share, the params, the evidence per
version with loss rates, the decision it would get now, the events newest first; inspect's canary column and last
decision."""

from __future__ import annotations

from clipper.cli.tables import canary_table, inspect_table
from clipper.core.domain import Canary

NOW = 1_790_000_600.0
CANARY = Canary("3", 0.1, NOW - 300).to_dict() | {"share_percent": 10}
EVENT = {"kind": "start", "who": "operator", "at": NOW - 300, "reason": "3 started on 10% of the queries beside 2"}


def test_the_status_shows_the_canary_its_evidence_the_decision_now_and_the_events():
    answer = {
        "model_name": "mlp",
        "active_version": "2",
        "canary": CANARY,
        "evidence": {
            "2": {"feedback": 40, "loss_sum": 4.0, "queries": 400, "errors": 1, "slo_misses": 0},
            "3": {"feedback": 10, "loss_sum": 3.0, "queries": 44, "errors": 0, "slo_misses": 2},
        },
        "decision_now": {"kind": "continue", "rule": "min-feedback", "reason": "continue: waiting for feedback"},
        "events": [{"kind": "rollback", "who": "reviewer", "at": NOW - 10, "reason": "worse"}, EVENT],
    }

    text = canary_table(answer, NOW)

    lines = text.splitlines()
    assert lines[0] == f"mlp: canary 3 on 10% of the queries beside 2 (trial {CANARY['trial']}, started 5 min ago)"
    assert "min_feedback 50" in lines[1] and "alpha 0.05" in lines[1]
    assert any(line.split()[:4] == ["2", "(active)", "40", "0.1000"] for line in lines), text
    assert any(line.split()[:4] == ["3", "(canary)", "10", "0.3000"] for line in lines), text
    assert "decision now: continue (min-feedback): waiting for feedback" in lines  # "continue" once
    events = lines[lines.index("last events (2)") + 2 :]
    assert events[0].split()[:5] == ["10", "s", "ago", "rollback", "reviewer"]
    assert events[1].split()[:5] == ["5", "min", "ago", "start", "operator"]


def test_without_a_canary_or_evidence_it_says_so():
    none = canary_table({"model_name": "mlp", "active_version": "2", "canary": None, "events": []}, NOW)
    assert none.splitlines()[0] == "mlp: no canary running (active version 2)" and "(none)" in none
    blind = canary_table({"model_name": "mlp", "active_version": "2", "canary": CANARY, "events": [EVENT]}, NOW)
    assert "evidence: not available from this API" in blind


def test_inspect_shows_the_canary_and_the_last_decision():
    model = {
        "active_version": "2",
        "num_replicas": 1,
        "versions": {},
        "canary": CANARY,
        "last_canary_event": EVENT,
    }
    text = inspect_table({"applications": {}, "models": {"mlp": model, "lr": model | {"canary": None}}})
    assert "3 @ 10%" in text
    assert "canaries (last decision)" in text
    assert "start by operator" in text and "3 started on 10% of the queries beside 2" in text


def test_a_share_near_100_percent_is_not_rounded_to_all_of_the_queries():
    """A share of 99.99999 % read "on 100% of the queries" (from the model lifecycle review)."""
    canary = Canary("3", 0.9999999, NOW - 300).to_dict()
    answer = {"model_name": "mlp", "active_version": "2", "canary": canary, "evidence": {}, "events": []}
    assert canary_table(answer, NOW).splitlines()[0].startswith("mlp: canary 3 on 99.99999% of the queries beside 2")
