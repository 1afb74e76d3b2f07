"""Feedback feeds a running canary's trial: each recorded output's loss, to the version that answered, once per
feedback id; in a single-model application too."""

from __future__ import annotations

import numpy as np
import pytest

from clipper.canary.evidence import VersionEvidence
from clipper.core.cache_keys import record_keys
from clipper.core.domain import Canary
from clipper.core.messages import encode_rows
from clipper.feedback import FeedbackMessage, FeedbackProcessor
from clipper.selection import Selection, state_key
from tests.fakes import (
    InMemoryCache,
    InMemoryCanaryEvidence,
    InMemoryRegistry,
    InMemorySelectionStore,
    digits_app,
    model_version,
)

pytestmark = pytest.mark.unit

CANARY = Canary("2", 0.1, 1_700_000_000.0)
ROW = np.eye(64, dtype=np.float32)[:1] * 3


def world(policy: str, models: tuple[str, ...] = ("mlp",)):
    registry = InMemoryRegistry()
    registry.apps["app"] = digits_app(name="app", policy=policy)
    registry.links["app"] = list(models)
    for m in models:
        for v in ("1", "2"):
            registry.versions[(m, v)] = model_version(m, v)
        registry.active[m] = "1"
    registry.canaries["mlp"] = CANARY
    cache, evidence = InMemoryCache(), InMemoryCanaryEvidence()
    processor = FeedbackProcessor(registry, InMemorySelectionStore(), cache, evidence=evidence)
    return processor, registry, cache, evidence


def record(cache, policy, outputs, versions=None, user=None, trial=CANARY.trial):
    """A query's record as the frontend keeps it; answered in ``trial`` (the frontend saw the canary running)."""
    (key,) = record_keys("app", user, ROW)
    selection = Selection(policy, tuple(outputs), dict.fromkeys(outputs, 1.0), 0)
    entry = {"selection": selection.to_dict(), "outputs": outputs}
    if versions is not None:
        entry["versions"] = versions
    if trial is not None and "mlp" in outputs:
        entry["trials"] = {"mlp": trial}
    cache.entries[key] = entry


def test_feedback_on_an_answer_of_another_trial_is_not_this_trials_evidence():
    processor, _, cache, evidence = world("single")
    aborted = Canary("2", 0.1, CANARY.started_at - 600)  # the same version's trial before, aborted since
    record(cache, "single", {"mlp": 7}, {"mlp": "2"}, trial=aborted.trial)
    assert processor.process(feedback("late", label=3)) == "canary_only"
    record(cache, "single", {"mlp": 7}, {"mlp": "1"}, trial=None)  # answered before any trial started
    assert processor.process(feedback("before", label=3)) == "canary_only"
    assert evidence.load("mlp", CANARY.trial) == {} and processor.take_touched() == set()
    record(cache, "single", {"mlp": 7}, {"mlp": "2"})  # in this trial: counted
    assert processor.process(feedback("in", label=3)) == "canary_only"
    assert evidence.load("mlp", CANARY.trial) == {"2": VersionEvidence(feedback=1, loss_sum=1.0)}


def feedback(fid: str, label=3, user=None) -> FeedbackMessage:
    payload, _ = encode_rows(ROW)
    return FeedbackMessage(feedback_id=fid, app="app", user=user, payload=payload, label=label)


def test_a_single_model_app_learns_for_its_canary():
    processor, _, cache, evidence = world("single")
    record(cache, "single", {"mlp": 3}, {"mlp": "2"})
    assert processor.process(feedback("f1", label=3)) == "canary_only"
    record(cache, "single", {"mlp": 7}, {"mlp": "2"})
    assert processor.process(feedback("f2", label=3)) == "canary_only"
    assert evidence.load("mlp", CANARY.trial) == {"2": VersionEvidence(feedback=2, loss_sum=1.0)}
    assert processor.take_touched() == {"mlp"} and processor.take_touched() == set()


def test_a_redelivered_feedback_counts_once():
    processor, _, cache, evidence = world("single")
    record(cache, "single", {"mlp": 5}, {"mlp": "1"})
    processor.process(feedback("f1"))
    processor.process(feedback("f1"))
    assert evidence.load("mlp", CANARY.trial) == {"1": VersionEvidence(feedback=1, loss_sum=1.0)}


def test_an_ensemble_counts_only_the_canaried_model_and_still_updates_the_bandit():
    processor, _, cache, evidence = world("exp4", ("mlp", "tree"))
    record(cache, "exp4", {"mlp": 3, "tree": 4}, {"mlp": "2", "tree": "1"}, user="u1")
    assert processor.process(feedback("f1", user="u1")) == "applied"
    assert evidence.counts == {("mlp", CANARY.trial, "2"): VersionEvidence(feedback=1, loss_sum=0.0)}
    assert state_key("app") in processor.store.states  # the bandit learned as before
    assert state_key("app", "u1") in processor.store.states


def test_records_without_versions_and_other_versions_are_skipped():
    processor, registry, cache, evidence = world("single")
    record(cache, "single", {"mlp": 3})  # written before records kept versions
    processor.process(feedback("f1"))
    registry.versions[("mlp", "0")] = model_version("mlp", "0")
    record(cache, "single", {"mlp": 3}, {"mlp": "0"})  # neither the active version nor the canary
    processor.process(feedback("f2"))
    assert evidence.counts == {} and processor.take_touched() == set()


def test_scores_count_their_capped_absolute_error():
    processor, _, cache, evidence = world("single")
    record(cache, "single", {"mlp": 0.25}, {"mlp": "2"})
    processor.process(feedback("f1", label=1.0))
    record(cache, "single", {"mlp": 9.0}, {"mlp": "2"})
    processor.process(feedback("f2", label=1.0))  # an error of 8, capped at 1
    assert evidence.load("mlp", CANARY.trial) == {"2": VersionEvidence(feedback=2, loss_sum=1.75)}


def test_without_a_canary_a_single_model_app_still_does_not_learn():
    processor, registry, cache, evidence = world("single")
    del registry.canaries["mlp"]
    record(cache, "single", {"mlp": 3}, {"mlp": "1"})
    assert processor.process(feedback("f1")) == "not_learning"
    assert evidence.counts == {}


def test_no_record_is_no_evidence():
    processor, _, _, evidence = world("single")
    assert processor.process(feedback("f1")) == "no_record"
    assert evidence.counts == {}


def test_a_regression_apps_canary_evidence_is_judged_on_its_loss_scale():
    """An error of 30 on a score is a loss of 0.3 with the app's loss_scale of 100 (1, the cap, without it)."""
    from dataclasses import replace

    from clipper.selection import PolicyParams

    for scale, loss_sum in ((None, 1.0), (100.0, 0.3)):
        processor, registry, cache, evidence = world("single")
        registry.apps["app"] = replace(registry.apps["app"], policy_params=PolicyParams(loss_scale=scale))
        record(cache, "single", {"mlp": 1030.0}, {"mlp": "2"})
        assert processor.process(feedback("f1", label=1000.0)) == "canary_only"
        (got,) = evidence.load("mlp", CANARY.trial).values()
        assert got.feedback == 1 and got.loss_sum == pytest.approx(loss_sum)


def test_a_feedback_after_the_canary_ended_is_not_counted_as_without_a_record():
    """A review: just after a single-model application's canary was rolled back, the worker's registry copy still
    held the canary, the queries since kept no record (nothing learns from them), and their feedback was counted
    'no_record' in the selection report. Decided on the registry itself it is 'not_learning' (not counted)."""
    from clipper.core.registry_cache import CachedRegistry
    from tests.fakes import FakeClock

    _, registry, cache, evidence = world("single")
    copy = CachedRegistry(registry, FakeClock(), ttl_s=60)
    processor = FeedbackProcessor(copy, InMemorySelectionStore(), cache, evidence=evidence)
    assert copy.canary("mlp") == CANARY  # held by the copy
    del registry.canaries["mlp"]  # rolled back
    assert processor.process(feedback("after")) == "not_learning"
    registry.canaries["mlp"] = CANARY  # a canary running and truly no record: still no_record
    copy.invalidate()
    assert processor.process(feedback("none")) == "no_record"
