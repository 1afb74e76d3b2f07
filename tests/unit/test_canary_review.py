"""The canary reviewer over fakes: a verdict ends the trial once, with one event and one metric; ``continue``
changes nothing."""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass

import pytest

from clipper.canary.decision import CanaryParams
from clipper.canary.evidence import VersionEvidence
from clipper.canary.review import CanaryReviewer
from clipper.core.domain import Canary
from clipper.errors import Unavailable
from tests.fakes import FakeClock, InMemoryCanaryControl, InMemoryCanaryEvidence, InMemoryRegistry, model_version

pytestmark = pytest.mark.unit

CANARY = Canary("2", 0.1, 1_700_000_000.0)


@dataclass
class ListMetrics:
    counted: list[tuple[str, str]]

    def decision(self, model: str, kind: str) -> None:
        self.counted.append((model, kind))


def world(*models: str):
    registry = InMemoryRegistry()
    for m in models or ("mlp",):
        for v in ("1", "2"):
            registry.versions[(m, v)] = model_version(m, v)
        registry.active[m] = "1"
        registry.canaries[m] = CANARY
    evidence, control, metrics = InMemoryCanaryEvidence(), InMemoryCanaryControl(registry), ListMetrics([])
    clock = FakeClock()
    reviewer = CanaryReviewer(registry, evidence, control, metrics, clock, model_names=lambda: sorted(registry.active))
    return reviewer, registry, evidence, control, metrics


def counts(evidence, current: VersionEvidence, canary: VersionEvidence, model: str = "mlp") -> None:
    evidence.add(model, CANARY.trial, "1", current)
    evidence.add(model, CANARY.trial, "2", canary)


def test_a_worse_canary_is_rolled_back_with_an_event_and_a_metric():
    reviewer, registry, evidence, control, metrics = world()
    counts(evidence, VersionEvidence(feedback=900, loss_sum=27.0), VersionEvidence(feedback=100, loss_sum=15.0))
    decision = reviewer.review("mlp")
    assert decision is not None and decision.kind == "rollback" and decision.rule == "loss-sprt"
    assert registry.canaries == {} and registry.active["mlp"] == "1"
    (event,) = control.events["mlp"]
    assert event["kind"] == "rollback" and event["rule"] == "loss-sprt" and event["reason"] == decision.reason
    assert event["trial"] == CANARY.trial and event["versions"] == {"current": "1", "canary": "2"}
    assert event["evidence"]["canary"]["loss_sum"] == 15.0 and event["at"] == FakeClock().t
    assert event["statistic"] >= event["threshold"]
    assert (event["who"], event["active_version"], event["previous_version"]) == ("reviewer", "1", "1")
    assert metrics.counted == [("mlp", "rollback")]


def test_two_reviewers_racing_record_the_decision_once():
    reviewer, registry, evidence, control, metrics = world()
    counts(evidence, VersionEvidence(feedback=900, loss_sum=27.0), VersionEvidence(feedback=100, loss_sum=15.0))
    stale = copy.deepcopy(registry)  # the second reviewer read the trial before the first ended it
    other = CanaryReviewer(stale, evidence, control, metrics, FakeClock(), model_names=lambda: ["mlp"])
    assert reviewer.review("mlp") is not None
    assert other.review("mlp") is None  # its end_canary found the trial over
    assert len(control.events["mlp"]) == 1 and metrics.counted == [("mlp", "rollback")]


def test_an_equal_canary_is_promoted():
    reviewer, registry, evidence, control, metrics = world()
    counts(evidence, VersionEvidence(feedback=1000, loss_sum=100.0), VersionEvidence(feedback=1000, loss_sum=100.0))
    decision = reviewer.review("mlp")
    assert decision is not None and decision.kind == "promote"
    assert registry.active["mlp"] == "2" and registry.canaries == {}
    assert [e["kind"] for e in control.events["mlp"]] == ["promote"]
    assert metrics.counted == [("mlp", "promote")]


def test_continue_changes_nothing():
    reviewer, registry, evidence, control, metrics = world()
    counts(evidence, VersionEvidence(feedback=10, loss_sum=1.0), VersionEvidence(feedback=3, loss_sum=0.0))
    decision = reviewer.review("mlp")
    assert decision is not None and decision.kind == "continue"
    assert registry.canaries == {"mlp": CANARY} and registry.active["mlp"] == "1"
    assert control.events == {} and metrics.counted == []


def test_the_error_guard_rolls_back_without_any_feedback():
    reviewer, registry, evidence, control, metrics = world()
    counts(evidence, VersionEvidence(queries=900, errors=9), VersionEvidence(queries=100, errors=10))
    decision = reviewer.review("mlp")
    assert decision is not None and (decision.kind, decision.rule) == ("rollback", "error-guard")
    assert registry.canaries == {} and registry.active["mlp"] == "1"
    assert [e["rule"] for e in control.events["mlp"]] == ["error-guard"]
    assert metrics.counted == [("mlp", "rollback")]


def test_no_canary_no_review():
    reviewer, registry, _evidence, control, metrics = world()
    del registry.canaries["mlp"]
    assert reviewer.review("mlp") is None and reviewer.review("unknown") is None
    assert control.events == {} and metrics.counted == []


def test_a_canary_with_its_own_params_is_decided_with_them():
    reviewer, registry, evidence, _control, _metrics = world()
    counts(evidence, VersionEvidence(feedback=10, loss_sum=0.0), VersionEvidence(feedback=10, loss_sum=0.0))
    assert reviewer.review("mlp").kind == "continue"  # the default waits for 50 labels each
    registry.canaries["mlp"] = Canary("2", 0.1, CANARY.started_at, CanaryParams(min_feedback=5))
    assert reviewer.review("mlp").rule != "min-feedback"


def test_review_all_reviews_every_model_and_survives_a_failing_one():
    reviewer, registry, evidence, _control, metrics = world("a", "b", "c")
    reviewer._model_names = lambda: ["a", "b", "c", "none"]
    del registry.versions[("a", "1")]  # its active version cannot be read: logged, the others go on
    for m in ("a", "b", "c"):
        counts(evidence, VersionEvidence(queries=900, errors=9), VersionEvidence(queries=100, errors=10), model=m)
    decided = reviewer.review_all()
    assert sorted(decided) == ["b", "c"]
    assert sorted(metrics.counted) == [("b", "rollback"), ("c", "rollback")]
    assert list(registry.canaries) == ["a"]


def test_the_loop_survives_failures_and_stops():
    reviewer, registry, evidence, _control, metrics = world()
    counts(evidence, VersionEvidence(queries=900, errors=9), VersionEvidence(queries=100, errors=10))
    stop = threading.Event()
    rounds = []

    def names():
        rounds.append(1)
        if len(rounds) == 1:
            raise RuntimeError("registry scan failed")  # the whole round fails
        evidence.fail = len(rounds) == 2  # then one model's review fails
        if len(rounds) == 3:
            stop.set()
        return ["mlp"]

    reviewer._model_names = names
    reviewer.run(stop, every_s=0.001)
    assert len(rounds) == 3 and registry.canaries == {} and metrics.counted == [("mlp", "rollback")]


def test_an_unavailable_registry_is_said_once_not_a_traceback_a_round(caplog):
    reviewer, *_ = world()
    rounds = []

    def names():
        rounds.append(1)
        if len(rounds) <= 3:
            raise Unavailable("dynamodb.Scan(registry): 503")
        if len(rounds) >= 5:
            stop.set()
        return []

    reviewer._model_names = names
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="clipper.canary.review"):
        reviewer.run(stop, every_s=0.001)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "canary reviews wait for the registry: dynamodb.Scan(registry): 503",
        "canary reviews go on: the registry answers again",
    ]
    assert not any(r.exc_info for r in caplog.records)


def test_with_the_touched_models_only_a_sweep_scans_for_canaries_and_each_round_reviews_the_running_ones():
    """The local feedback worker's reviews: the scan for every canary (a registry scan a second made most of moto's
    idle requests) runs at the first round and each ``sweep_s``; each round reviews the canaries that sweep found
    and still run (their error and SLO guards need no feedback) and the models whose evidence grew."""
    reviewer, registry, evidence, _control, metrics = world("mlp", "cnn")
    del registry.canaries["cnn"]  # started later: found by the next sweep, or by its feedback
    scans, reviewed, rounds = [], [], []
    reviewer._model_names = lambda: scans.append(1) or sorted(registry.canaries)
    review = reviewer.review
    reviewer.review = lambda model: reviewed.append(model) or review(model)  # type: ignore[method-assign]
    stop = threading.Event()

    def touched():
        rounds.append(1)
        if len(rounds) == 3:  # the mlp's counts cross the rate guard (no feedback): rolled back at the next round
            counts(evidence, VersionEvidence(queries=900, errors=9), VersionEvidence(queries=100, errors=10))
        if len(rounds) == 5:  # a canary of cnn starts and its feedback comes: reviewed in that round
            registry.canaries["cnn"] = CANARY
            return ["cnn"]
        if len(rounds) >= 7:
            stop.set()
        return []

    reviewer.run(stop, every_s=0.001, touched=touched, sweep_s=3600)
    assert scans == [1]  # the first round's sweep only
    assert metrics.counted == [("mlp", "rollback")] and "mlp" not in registry.canaries
    assert reviewed == ["mlp", "mlp", "mlp", "cnn", "cnn", "cnn"]  # mlp until rolled back; cnn from its feedback on
    stop.clear()
    scans.clear()
    rounds.clear()
    reviewer.run(stop, every_s=0.001, touched=touched, sweep_s=0)  # a sweep each round
    assert len(scans) == len(rounds) >= 5


def test_with_the_touched_models_an_unavailable_store_is_said_once_and_the_canary_kept(caplog):
    """A review failing on an unavailable store between sweeps is the round's failure, said once while it lasts (a
    line per canary per second before), and the canary stays among the running ones: reviewed again once the
    store answers, without waiting for the next sweep."""
    reviewer, registry, evidence, _control, metrics = world("mlp", "cnn")
    rounds = []
    stop = threading.Event()

    def touched():
        rounds.append(1)
        evidence.fail = 2 <= len(rounds) <= 5
        if len(rounds) == 6:  # the store is back: the mlp's counts cross the rate guard
            counts(evidence, VersionEvidence(queries=900, errors=9), VersionEvidence(queries=100, errors=10))
        if len(rounds) >= 7:
            stop.set()
        return []

    with caplog.at_level(logging.WARNING, logger="clipper.canary.review"):
        reviewer.run(stop, every_s=0.001, touched=touched, sweep_s=3600)
    lines = [r.getMessage() for r in caplog.records if "canary reviews" in r.getMessage() or "waits" in r.getMessage()]
    assert lines == [
        "canary reviews wait for the registry: canary evidence store down",
        "canary reviews go on: the registry answers again",
    ], lines
    assert metrics.counted == [("mlp", "rollback")] and "cnn" in registry.canaries
