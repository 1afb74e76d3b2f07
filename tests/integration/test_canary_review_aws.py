"""The canary reviewer over the registry table (moto), with the registry's own CanaryControl: a canary started by
the registry, its evidence written as the frontend and the feedback worker write it, the decision ending the trial
(a promotion switches the active version), its event and metric, once even when two reviewers race; the scheduled
function's graph."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field

import pytest

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_canary import DynamoDBCanaryEvidence
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.canary.evidence import VersionEvidence
from clipper.canary.review import CanaryReviewer
from clipper.core.domain import InputType, ModelVersion
from tests.events import LambdaContext

pytestmark = pytest.mark.integration

STARTED = 1_700_000_000.0


@dataclass
class Counted:
    counted: list[tuple[str, str]] = field(default_factory=list)

    def decision(self, model: str, kind: str) -> None:
        self.counted.append((model, kind))


@pytest.fixture
def world(aws):
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    for model in ("mlp", "tree"):
        registry.put_version(ModelVersion(model, "1", InputType.DOUBLES, "q", "e"), activate=True)
        registry.put_version(ModelVersion(model, "2", InputType.DOUBLES, "q", "e"))
    canary = registry.start_canary("mlp", "2", 0.1, STARTED)
    evidence = DynamoDBCanaryEvidence(aws.dynamodb, aws.registry_table)
    return registry, evidence, canary


def reviewer(registry, evidence, metrics):
    return CanaryReviewer(registry, evidence, registry, metrics, SystemClock(), model_names=registry.model_names)


def test_a_canary_erroring_more_is_rolled_back_once_though_two_reviewers_race(world):
    registry, evidence, canary = world
    for _ in range(9):
        evidence.add("mlp", canary.trial, "1", VersionEvidence(queries=100, errors=1))
    evidence.add("mlp", canary.trial, "2", VersionEvidence(queries=100, errors=10))
    metrics = Counted()
    first, second = reviewer(registry, evidence, metrics), reviewer(registry, evidence, metrics)
    second._running = lambda model: (canary, "1")  # it read the trial before the first ended it
    decided = first.review_all()
    assert {m: d.kind for m, d in decided.items()} == {"mlp": "rollback"}
    assert second.review("mlp") is None  # the registry's end_canary found the trial over
    head = registry.model_record("mlp").head
    assert head.canary is None and head.active_version == "1"
    (event,) = registry.canary_events("mlp")
    assert event["kind"] == "rollback" and event["rule"] == "error-guard" and event["who"] == "reviewer"
    assert event["versions"] == {"current": "1", "canary": "2"} and event["trial"] == canary.trial
    assert event["evidence"]["canary"] == VersionEvidence(queries=100, errors=10).to_dict()
    assert metrics.counted == [("mlp", "rollback")]


def test_an_equal_canary_is_promoted(world):
    registry, evidence, canary = world
    for version in ("1", "2"):
        evidence.add("mlp", canary.trial, version, VersionEvidence(feedback=1000, loss_sum=100.0))
    metrics = Counted()
    assert reviewer(registry, evidence, metrics).review("mlp").kind == "promote"
    head = registry.model_record("mlp").head
    assert head.canary is None and head.active_version == "2"
    assert [e["kind"] for e in registry.canary_events("mlp")] == ["promote"]
    assert metrics.counted == [("mlp", "promote")]


def test_the_scheduled_function_reviews_every_canary(aws, world, monkeypatch):
    registry, evidence, canary = world
    monkeypatch.setenv("CLIPPER_REGISTRY_TABLE", aws.registry_table)
    monkeypatch.setenv("CLIPPER_REPLIES_TABLE", aws.replies_table)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    evidence.add("mlp", canary.trial, "2", VersionEvidence.of_feedback(1.0))
    sys.modules.pop("functions.canary_review.app", None)
    app = importlib.import_module("functions.canary_review.app")
    assert app.handler({}, LambdaContext(function_name="canary-review")) == {"decisions": {"mlp": "continue"}}
    for _ in range(9):
        evidence.add("mlp", canary.trial, "1", VersionEvidence(queries=100, errors=1))
    evidence.add("mlp", canary.trial, "2", VersionEvidence(queries=100, errors=10))
    assert app.handler({}, LambdaContext(function_name="canary-review")) == {"decisions": {"mlp": "rollback"}}
    assert registry.model_record("mlp").head.canary is None


def test_the_wired_reviewer_reviews_the_models_with_a_running_canary(world, aws):
    """What the wired reviewer's rounds review: the models whose item holds a canary (one scan), none once the
    trial ended; the registry still lists every model."""
    from clipper.settings import CommonSettings
    from clipper.wiring import build_canary_reviewer

    registry, _evidence, canary = world
    wired = build_canary_reviewer(
        CommonSettings(registry_table=aws.registry_table, replies_table="replies"), aws.dynamodb, Counted()
    )
    assert list(wired._model_names()) == ["mlp"]
    assert registry.end_canary("mlp", canary.trial, promote=False)
    assert list(wired._model_names()) == []
    assert registry.model_names() == ["mlp", "tree"]
