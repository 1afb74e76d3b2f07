"""The canary reviewer over the registry table (moto): the scheduled function's graph reads a model's canary and the
trial's evidence as the frontend and the feedback worker write them, and decides.

Ending a trial is the registry's ``CanaryControl`` (``DynamoDBRegistry.end_canary``, written apart); here a control
that keeps what it is asked stands in for it, so the reads and the decision are what is tested."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_canary import DynamoDBCanaryEvidence
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.canary.evidence import VersionEvidence
from clipper.canary.review import CanaryReviewer
from clipper.core.domain import Canary, InputType, ModelVersion
from tests.events import LambdaContext

pytestmark = pytest.mark.integration

CANARY = Canary("2", 0.1, 1_700_000_000.0)


def start_canary(aws, model: str, canary: Canary) -> None:
    """A running canary on the model's item, in the layout ``DynamoDBRegistry`` reads."""
    aws.dynamodb.update_item(
        TableName=aws.registry_table,
        Key={"pk": {"S": f"MODEL#{model}"}, "sk": {"S": "MODEL"}},
        UpdateExpression="SET canary = :c",
        ExpressionAttributeValues={
            ":c": {
                "M": {
                    "version": {"S": canary.version},
                    "share": {"N": str(canary.share)},
                    "started_at": {"N": str(canary.started_at)},
                }
            }
        },
    )


@pytest.fixture
def registry(aws):
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    for model in ("mlp", "tree"):
        registry.put_version(ModelVersion(model, "1", InputType.DOUBLES, "q", "e"), activate=True)
        registry.put_version(ModelVersion(model, "2", InputType.DOUBLES, "q", "e"))
    start_canary(aws, "mlp", CANARY)
    return registry


@dataclass
class KeptControl:
    ended: list[tuple[str, str, bool]] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def end_canary(self, model: str, trial: str, promote: bool) -> bool:
        self.ended.append((model, trial, promote))
        return True

    def add_canary_event(self, model: str, event: dict[str, Any]) -> None:
        self.events.append((model, event))


@dataclass
class Counted:
    counted: list[tuple[str, str]] = field(default_factory=list)

    def decision(self, model: str, kind: str) -> None:
        self.counted.append((model, kind))


def test_a_canary_erroring_more_is_rolled_back_from_the_stored_evidence(aws, registry):
    evidence = DynamoDBCanaryEvidence(aws.dynamodb, aws.registry_table)
    for _ in range(9):
        evidence.add("mlp", CANARY.trial, "1", VersionEvidence(queries=100, errors=1))
    evidence.add("mlp", CANARY.trial, "2", VersionEvidence(queries=100, errors=10))
    control, metrics = KeptControl(), Counted()
    reviewer = CanaryReviewer(registry, evidence, control, metrics, SystemClock(), model_names=registry.model_names)
    decided = reviewer.review_all()
    assert {m: d.kind for m, d in decided.items()} == {"mlp": "rollback"}
    assert control.ended == [("mlp", CANARY.trial, False)]
    ((model, event),) = control.events
    assert model == "mlp" and event["rule"] == "error-guard" and event["versions"] == {"current": "1", "canary": "2"}
    assert event["evidence"]["canary"] == VersionEvidence(queries=100, errors=10).to_dict()
    assert metrics.counted == [("mlp", "rollback")]


def test_the_scheduled_function_reviews_every_canary(aws, registry, monkeypatch):
    monkeypatch.setenv("CLIPPER_REGISTRY_TABLE", aws.registry_table)
    monkeypatch.setenv("CLIPPER_REPLIES_TABLE", aws.replies_table)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    DynamoDBCanaryEvidence(aws.dynamodb, aws.registry_table).add(
        "mlp", CANARY.trial, "2", VersionEvidence.of_feedback(1.0)
    )
    sys.modules.pop("functions.canary_review.app", None)
    app = importlib.import_module("functions.canary_review.app")
    assert app.handler({}, LambdaContext(function_name="canary-review")) == {"decisions": {"mlp": "continue"}}
