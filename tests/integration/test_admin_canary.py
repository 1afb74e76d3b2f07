"""The canary operations of the admin API over HTTP, against the registry in moto: start (4xx naming the field,
404, 409), look (with live evidence when a store is wired, and the events newest first), promote and abort by
hand (each an operator's event), no switch of the active version by hand while a canary runs, deleting the
canary's version ends it, and ``get_state`` shows a model's canary and its last event."""

from __future__ import annotations

from collections import defaultdict

import pytest
from fastapi.testclient import TestClient

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.admin.api import create_admin_app
from clipper.admin.service import AdminService
from clipper.canary import VersionEvidence

pytestmark = pytest.mark.integration
TOKEN = "s3cret"
T0 = 1_790_000_000.0


class FixedClock:
    def __init__(self) -> None:
        self.t = T0

    def now(self) -> float:
        self.t += 1.0
        return self.t


class DictEvidence:
    """A ``CanaryEvidenceStore`` in memory."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], dict[str, VersionEvidence]] = defaultdict(dict)

    def add(self, model: str, trial: str, version: str, delta: VersionEvidence) -> None:
        held = self.counts[(model, trial)]
        held[version] = held.get(version, VersionEvidence()) + delta

    def load(self, model: str, trial: str) -> dict[str, VersionEvidence]:
        return dict(self.counts[(model, trial)])


def client_for(service: AdminService) -> TestClient:
    client = TestClient(create_admin_app(service, "token", TOKEN))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    return client


@pytest.fixture
def evidence() -> DictEvidence:
    return DictEvidence()


@pytest.fixture
def admin(aws, evidence) -> TestClient:
    client = client_for(
        AdminService(DynamoDBRegistry(aws.dynamodb, aws.registry_table), evidence=evidence, clock=FixedClock())
    )
    for version in ("1", "2", "3"):
        body = {"model_name": "mlp", "model_version": version, "input_type": "floats", "activate": version != "3"}
        body |= {"queue_url": f"https://sqs.local/q-mlp-{version}", "endpoint": f"http://127.0.0.1:900{version}"}
        assert client.post("/admin/add_model", json=body).status_code == 200
    return client


def call(admin: TestClient, op: str, status: int = 200, **body):
    resp = admin.post(f"/admin/{op}", json=body)
    assert resp.status_code == status, resp.text
    return resp.json()


def active(admin: TestClient) -> str:
    return str(call(admin, "get_state")["models"]["mlp"]["active_version"])


def test_start_and_look_at_a_canary_with_its_live_evidence(admin, evidence):
    started = call(
        admin, "start_canary", model_name="mlp", model_version="3", share_percent=10, params={"min_feedback": 30}
    )

    assert started["active_version"] == "2"
    canary = started["canary"]
    assert canary["version"] == "3" and canary["share"] == 0.1 and canary["share_percent"] == 10
    assert canary["params"]["min_feedback"] == 30 and canary["params"]["alpha"] == 0.05
    evidence.add("mlp", canary["trial"], "2", VersionEvidence(feedback=40, loss_sum=4.0, queries=400))
    evidence.add("mlp", canary["trial"], "3", VersionEvidence(feedback=10, loss_sum=1.0, queries=44))

    seen = call(admin, "get_canary", model_name="mlp")

    assert seen["canary"] == canary and seen["active_version"] == "2"
    assert seen["evidence"]["3"] == {"feedback": 10, "loss_sum": 1.0, "queries": 44, "errors": 0, "slo_misses": 0}
    assert seen["decision_now"]["rule"] == "min-feedback"  # 10 canary labels of the 30 this trial asks for
    assert [(e["kind"], e["who"], e["trial"]) for e in seen["events"]] == [("start", "operator", canary["trial"])]
    assert active(admin) == "2"  # a canary is never made active by starting it


def test_without_an_evidence_store_the_canary_is_shown_without_evidence(aws):
    admin = client_for(AdminService(DynamoDBRegistry(aws.dynamodb, aws.registry_table)))
    for version, activate in (("1", True), ("2", False)):
        body = {"model_name": "mlp", "model_version": version, "input_type": "floats", "activate": activate}
        body |= {"queue_url": "https://sqs.local/q", "endpoint": "http://127.0.0.1:9001"}
        call(admin, "add_model", **body)
    call(admin, "start_canary", model_name="mlp", model_version="2", share_percent=50)

    seen = call(admin, "get_canary", model_name="mlp", events=0)

    assert seen["canary"]["version"] == "2" and "evidence" not in seen and seen["events"] == []


@pytest.mark.parametrize(
    ("body", "status", "cause"),
    [
        ({"model_version": "3", "share_percent": 0}, 400, "share_percent"),
        ({"model_version": "3", "share_percent": 100}, 400, "share_percent"),
        ({"model_version": "3", "share_percent": 5e-324}, 400, "share_percent"),
        ({"model_version": "3"}, 400, "share_percent"),
        ({"model_version": "3", "share_percent": 10, "params": {"alpha": 0.7}}, 400, "params.alpha"),
        ({"model_version": "3", "share_percent": 10, "params": {"min_feedback": 0}}, 400, "params.min_feedback"),
        # past what the registry keeps exact (10**40 came back changed) or stores at all (1e200: a 503 on AWS)
        ({"model_version": "3", "share_percent": 10, "params": {"max_feedback": 10**40}}, 400, "params.max_feedback"),
        ({"model_version": "3", "share_percent": 10, "params": {"guard_ratio": 1e200}}, 400, "params.guard_ratio"),
        (
            {"model_version": "3", "share_percent": 10, "params": {"min_feedback": 90, "max_feedback": 60}},
            400,
            "max_feedback",
        ),
        ({"model_version": "3", "share_percent": 10, "params": {"bogus": 1}}, 400, "params.bogus"),
        ({"model_version": "2", "share_percent": 10}, 400, "model_version"),
        ({"model_version": "9", "share_percent": 10}, 404, "mlp:9"),
        ({"model_name": "nope", "model_version": "1", "share_percent": 10}, 404, "model 'nope'"),
    ],
)
def test_a_bad_start_is_refused_naming_the_field_and_writes_nothing(admin, body, status, cause):
    refused = call(admin, "start_canary", status, **({"model_name": "mlp"} | body))

    assert refused["cause"].startswith(cause) if status == 400 else cause in refused["cause"], refused
    assert call(admin, "get_canary", model_name="mlp")["canary"] is None
    assert call(admin, "get_canary", model_name="mlp")["events"] == []


def test_a_second_canary_is_refused_with_409(admin):
    call(admin, "start_canary", model_name="mlp", model_version="3", share_percent=10)
    refused = call(admin, "start_canary", 409, model_name="mlp", model_version="1", share_percent=10)
    assert "canary running already" in refused["cause"] and "mlp:3" in refused["cause"]


def test_promote_by_hand_then_rollback_returns_to_the_version_before_the_canary(admin):
    call(admin, "start_canary", model_name="mlp", model_version="3", share_percent=10)

    promoted = call(admin, "promote_canary", model_name="mlp")

    assert promoted["ended"] == "promote" and promoted["active_version"] == "3"
    assert active(admin) == "3" and call(admin, "get_canary", model_name="mlp")["canary"] is None
    events = call(admin, "get_canary", model_name="mlp")["events"]
    assert [(e["kind"], e["who"]) for e in events] == [("promote", "operator"), ("start", "operator")]
    assert events[0]["previous_version"] == "2"
    assert call(admin, "rollback_model", model_name="mlp")["active_version"] == "2"


def test_abort_by_hand_keeps_the_active_version_and_a_second_end_is_refused(admin):
    call(admin, "start_canary", model_name="mlp", model_version="3", share_percent=10)

    aborted = call(admin, "abort_canary", model_name="mlp")

    assert aborted["ended"] == "abort" and aborted["active_version"] == "2" and active(admin) == "2"
    again = call(admin, "abort_canary", 409, model_name="mlp")  # none runs: a state conflict, as one ended meanwhile
    assert "no canary running (active version 2)" in again["cause"]
    assert call(admin, "promote_canary", 404, model_name="nope")["error"] == "not found"
    kinds = [e["kind"] for e in call(admin, "get_canary", model_name="mlp")["events"]]
    assert kinds == ["abort", "start"]


def test_the_active_version_is_not_switched_by_hand_while_a_canary_runs(admin):
    call(admin, "start_canary", model_name="mlp", model_version="3", share_percent=10)
    add = {"model_name": "mlp", "model_version": "4", "input_type": "floats"}

    for op, body in (("set_model_version", {"model_version": "1"}), ("rollback_model", {}), ("add_model", add)):
        refused = call(admin, op, 409, **({"model_name": "mlp"} | body))
        assert "canary running" in refused["cause"] and "mlp:3" in refused["cause"], op

    assert active(admin) == "2"
    assert call(admin, "get_model", 404, model_name="mlp", model_version="4")  # refused before it was written
    assert call(admin, "get_canary", model_name="mlp")["canary"]["version"] == "3"


def test_deleting_the_canarys_version_ends_the_canary_with_an_event(admin):
    call(admin, "start_canary", model_name="mlp", model_version="3", share_percent=10)

    call(admin, "delete_versioned_model", model_name="mlp", model_version="3")

    seen = call(admin, "get_canary", model_name="mlp")
    assert seen["canary"] is None and active(admin) == "2"
    assert seen["events"][0]["kind"] == "abort" and "deleted" in seen["events"][0]["reason"]


def test_get_state_shows_the_canary_and_the_last_event(admin):
    call(admin, "start_canary", model_name="mlp", model_version="3", share_percent=25)
    model = call(admin, "get_state")["models"]["mlp"]
    assert model["canary"]["version"] == "3" and model["canary"]["share"] == 0.25
    assert model["last_canary_event"]["kind"] == "start"

    call(admin, "abort_canary", model_name="mlp")
    model = call(admin, "get_state")["models"]["mlp"]
    assert model["canary"] is None and model["last_canary_event"]["kind"] == "abort"


def test_a_change_whose_event_is_lost_answers_what_it_did_not_a_503(aws, evidence, monkeypatch):
    """Start, promote, abort and the deletion of the canary's version each change the model, then write an event.
    A failed event write (a throttle, the table unreachable) answered 503 after the change was made, and the
    retry a 503 invites answered 409 'no canary running' (or 404): as if nothing had happened (found by a
    review). Now the change's own answer, saying ``event_recorded: false``, and the event's loss is logged."""
    from clipper.errors import Unavailable

    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    admin = client_for(AdminService(registry, evidence=evidence, clock=FixedClock()))
    for version in ("1", "2", "3"):
        body = {"model_name": "mlp", "model_version": version, "input_type": "floats", "activate": version == "1"}
        body |= {"queue_url": f"https://sqs.local/q-mlp-{version}", "endpoint": f"http://127.0.0.1:900{version}"}
        assert admin.post("/admin/add_model", json=body).status_code == 200

    def lost(model: str, event: dict) -> None:
        raise Unavailable("dynamodb.PutItem(registry): ProvisionedThroughputExceededException")

    monkeypatch.setattr(registry, "add_canary_event", lost)
    started = call(admin, "start_canary", model_name="mlp", model_version="2", share_percent=10)
    assert started["canary"]["version"] == "2" and started["event_recorded"] is False
    promoted = call(admin, "promote_canary", model_name="mlp")
    assert promoted["active_version"] == "2" and promoted["event_recorded"] is False and active(admin) == "2"
    call(admin, "start_canary", model_name="mlp", model_version="3", share_percent=10)
    aborted = call(admin, "abort_canary", model_name="mlp")
    assert aborted["active_version"] == "2" and aborted["event_recorded"] is False
    call(admin, "start_canary", model_name="mlp", model_version="3", share_percent=10)
    assert call(admin, "delete_versioned_model", model_name="mlp", model_version="3") == {"deleted": "mlp:3"}
    assert call(admin, "get_canary", model_name="mlp")["canary"] is None
    monkeypatch.undo()
    ok = call(admin, "start_canary", model_name="mlp", model_version="1", share_percent=10)
    assert "event_recorded" not in ok  # written: the answer as before


def test_stopping_the_inactive_versions_keeps_a_running_canarys(admin):
    """stop_inactive_model_versions deleted a running canary's version (and so ended its trial without a word):
    it answers a share of the queries, so it is not inactive (a user's review)."""
    call(admin, "start_canary", model_name="mlp", model_version="3", share_percent=50)
    assert call(admin, "stop_inactive_model_versions", model_name="mlp") == {"deleted": ["mlp:1"]}
    assert call(admin, "get_canary", model_name="mlp")["canary"]["version"] == "3"
    call(admin, "abort_canary", model_name="mlp")
    assert call(admin, "stop_inactive_model_versions", model_name="mlp") == {"deleted": ["mlp:3"]}
