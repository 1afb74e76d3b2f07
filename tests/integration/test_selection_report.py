"""The selection report end to end on moto: predictions recorded in the DynamoDB prediction cache, feedback
applied by the feedback worker with the processor the wiring builds (so with the DynamoDB feedback log in the
selection table), then ``GET /admin/apps/{app}/report`` shows the planted losses; and the log itself (day
partitions, the newest entries first when there are too many)."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from clipper.adapters.dynamodb_cache import DynamoDBPredictionCache
from clipper.adapters.dynamodb_feedback_log import DynamoDBFeedbackLog
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.admin.api import create_admin_app
from clipper.admin.report import ReportService
from clipper.admin.service import AdminService
from clipper.core.cache_keys import record_keys
from clipper.core.domain import new_incarnation
from clipper.core.messages import encode_rows
from clipper.entrypoints.feedback_worker import FeedbackWorker
from clipper.feedback import FeedbackMessage
from clipper.ports import ReceivedMessage
from clipper.report.entry import FeedbackEntry
from clipper.selection import Selection
from clipper.settings import CommonSettings
from clipper.wiring import build_feedback_processor
from tests.fakes import FakeClock, digits_app, model_version

pytestmark = pytest.mark.integration

TOKEN = "report-token"
N = 120


@pytest.fixture
def tables(aws):
    for name, keys in (("selection", ("pk", "sk")), ("cache", ("key",))):
        aws.dynamodb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": k, "KeyType": t} for k, t in zip(keys, ("HASH", "RANGE"), strict=False)],
            AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in keys],
            BillingMode="PAY_PER_REQUEST",
        )
    return aws


def rows(i: int) -> np.ndarray:
    return np.eye(64, dtype=np.float32)[i % 64 : i % 64 + 1] * (1 + i // 64)


@pytest.fixture
def logged(tables, monkeypatch):
    """N exp3 predictions recorded and their feedback applied by the worker: returns the registry and how many
    times b (always wrong) answered."""
    aws = tables
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    incarnation = new_incarnation()  # as add_app gives one
    registry.put_app(digits_app(name="digits", policy="exp3", incarnation=incarnation))
    for model in ("a", "b"):
        registry.put_version(model_version(model, "1"), activate=True)  # the version that answers
        registry.link("digits", model)
    registry.add_canary_event("b", {"kind": "decision", "decision": "rollback", "version": "2"})  # now: in range
    registry.add_canary_event("b", {"kind": "start", "version": "2", "at": 1_000_000_000.0})  # long before
    cache = DynamoDBPredictionCache(aws.dynamodb, "cache", ttl_s=3600)
    rng = random.Random(3)
    b_answers = 0
    for i in range(N):  # exp3 drew a or b half and half; a is always right, b always wrong
        chosen = "a" if rng.random() < 0.5 else "b"
        b_answers += chosen == "b"
        output = i % 10 if chosen == "a" else (i + 1) % 10
        (key,) = record_keys("digits", None, rows(i))
        selection = Selection("exp3", (chosen,), {"a": 0.5, "b": 0.5}, 0)
        record = {"selection": selection.to_dict(), "outputs": {chosen: output}, "versions": {chosen: "1"}}
        record["incarnation"] = incarnation  # what the frontend records with a prediction
        cache.put_many({key: record | {"answer": {"output": output, "default": False, "confidence": None}}})

    for k, v in {"REGISTRY_TABLE": aws.registry_table, "REPLIES_TABLE": aws.replies_table}.items():
        monkeypatch.setenv(f"CLIPPER_{k}", v)
    monkeypatch.setenv("CLIPPER_SELECTION_TABLE", "selection")
    monkeypatch.setenv("CLIPPER_CACHE_TABLE", "cache")
    processor = build_feedback_processor(CommonSettings(), aws.dynamodb)  # type: ignore[call-arg]
    worker = FeedbackWorker(Drained(), processor.process)
    messages = [
        FeedbackMessage(feedback_id=f"fb{i}", app="digits", payload=encode_rows(rows(i))[0], label=i % 10).to_json()
        for i in range(N)
    ]
    worker.handle([ReceivedMessage(f"m{i}", f"r{i}", body) for i, body in enumerate(messages)])
    worker.handle([ReceivedMessage("again", "r-again", messages[0])])  # redelivered: applied once, logged once
    # not learned, and counted for the report: three inputs never queried, one label of another kind
    unknown = [FeedbackMessage(feedback_id=f"nr{i}", app="digits", payload=encode_rows(rows(N + i))[0], label=1)
               for i in range(3)]  # fmt: skip
    mismatch = FeedbackMessage(feedback_id="lm", app="digits", payload=encode_rows(rows(1))[0], label="one")
    skipped = [ReceivedMessage(m.feedback_id, m.feedback_id, m.to_json()) for m in [*unknown, mismatch]]
    worker.handle(skipped)
    assert worker.counts == {"applied": N, "duplicate": 1, "no_record": 3, "label_mismatch": 1}
    assert processor.log is not None and processor.log.appended == N and processor.log.failures == 0
    # the skipped ones delivered again (a failed delete, a visibility timeout): not counted again (they were)
    worker.handle([ReceivedMessage(f"again-{m.message_id}", f"r-{m.message_id}", m.body) for m in skipped])
    assert processor.log.failures == 0

    return registry, b_answers


def test_the_report_shows_the_losses_planted_through_live_feedback(tables, logged):
    aws = tables
    registry, b_answers = logged
    report = ReportService(registry, DynamoDBFeedbackLog(aws.dynamodb, "selection"), FakeClock(_now()))
    # what was answered 200 but not learned is counted, by why (the worker's log said it alone)
    assert report.report("digits")["skipped"] == {"label_mismatch": 1, "no_record": 3}
    client = TestClient(create_admin_app(AdminService(registry), "token", TOKEN, report))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    got = client.get("/admin/apps/digits/report", params={"since": "1d", "window": 30}, headers=auth)
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["feedbacks"] == N and body["policy"] == "exp3" and body["truncated"] is False
    assert body["models"]["a"]["mean_loss"] == 0.0 and body["models"]["b"]["mean_loss"] == 1.0
    assert body["models"]["a"]["answers"] + body["models"]["b"]["answers"] == N
    assert [p["feedbacks"] for p in body["loss_over_time"]["points"]] == [30, 30, 30, 30]
    regret = body["exp3_regret"]
    assert regret["best_model"] == "a" and regret["regret"] == pytest.approx(b_answers)
    assert body["answers"]["mean_loss"] == pytest.approx(b_answers / N)
    assert [e["kind"] for e in body["canary"]["b"]["events"]] == ["decision"]  # the old start is out of range
    assert body["canary"]["b"]["events"][0]["decision"] == "rollback"

    assert client.get("/admin/apps/nope/report", headers=auth).status_code == 404
    bad = client.get("/admin/apps/digits/report", params={"since": "last tuesday"}, headers=auth)
    assert bad.status_code == 400 and "since" in bad.json()["cause"]
    bad = client.get("/admin/apps/digits/report", params={"window": 0}, headers=auth)
    assert bad.status_code == 400 and "window" in bad.json()["cause"]
    assert client.get("/admin/apps/digits/report").status_code == 401
    no_log = ReportService(registry, None, FakeClock())
    unlogged = TestClient(create_admin_app(AdminService(registry), "token", TOKEN, no_log))
    assert unlogged.get("/admin/apps/digits/report", headers=auth).status_code == 503


class Drained:
    """The worker's queue reader once the messages are in hand: deletes succeed."""

    def receive(self, max_messages, wait_s):
        return []

    def delete(self, receipt_handles):
        pass

    def release(self, receipt_handle, delay_s):
        pass


def _now() -> float:
    return time.time()


def entry(t: float, fid: str, app: str = "digits") -> FeedbackEntry:
    return FeedbackEntry(t, fid, app, None, 1, "exp3", ("a",), {"a": 1.0}, {"a": 1}, {"a": 0.0}, {"a": "1"})


def test_the_log_reads_an_apps_days_newest_first_within_the_range(tables):
    log = DynamoDBFeedbackLog(tables.dynamodb, "selection")
    day = 86400.0
    start = 1_700_000_000.0
    times = [start + k * day / 3 for k in range(9)]  # three days, three a day
    for k, t in enumerate(times):
        log.append(entry(t, f"f{k}"))
    log.append(entry(times[4], "other", app="digits#2"))  # another app's partition, even with # in its name
    got, truncated = log.entries("digits", times[1], times[7], limit=100)
    assert [e.feedback_id for e in got] == [f"f{k}" for k in range(1, 8)] and not truncated
    assert got[0] == entry(times[1], "f1")
    got, truncated = log.entries("digits", times[0], times[8], limit=4)
    assert [e.feedback_id for e in got] == ["f5", "f6", "f7", "f8"] and truncated
    item = tables.dynamodb.scan(TableName="selection")["Items"][0]
    assert int(item["expires_at"]["N"]) - float(item["sk"]["S"][:15]) / 1000 == pytest.approx(30 * day, abs=1)


def test_clipper_report_prints_a_table_and_writes_the_json_and_the_png(tables, logged, tmp_path, capsys):
    import threading

    import uvicorn

    from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
    from clipper.cli import main
    from tests.services import free_port, wait_for_port

    registry, b_answers = logged
    states = DynamoDBSelectionStore(tables.dynamodb, "selection")
    log = DynamoDBFeedbackLog(tables.dynamodb, "selection")
    report = ReportService(registry, log, FakeClock(_now()), states=states)
    admin = create_admin_app(AdminService(registry), "token", TOKEN, report)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(admin, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port(port)
    try:
        url = f"http://127.0.0.1:{port}"
        out = tmp_path / "out"
        assert main(["--url", url, "--token", TOKEN, "report", "digits", "--since", "2d", "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        lines = {line.split()[0]: line.split() for line in printed.splitlines() if line.strip()}
        assert lines["a"][1:3] == [str(N - b_answers), "0.000"] and lines["b"][1:3] == [str(b_answers), "1.000"]
        assert "not learned (on the days the range touches): 4: label_mismatch 1, no_record 3" in printed
        assert f"exp3 regret vs the best model in hindsight (a): {b_answers:.1f} over {N} feedbacks" in printed
        assert json.loads((out / "report.json").read_text())["feedbacks"] == N
        assert (out / "report.png").read_bytes()[
            :8
        ] == b"\x89PNG\r\n\x1a\n" and f"wrote {out / 'report.png'}" in printed
        assert main(["--url", url, "--token", TOKEN, "report", "nope", "--out", str(out)]) == 2  # unknown app
        assert "nope" in capsys.readouterr().err
        # the bandit state, through the client: the table, and the JSON
        assert main(["--url", url, "--token", TOKEN, "selection", "digits", "--uid", "7"]) == 0
        printed = capsys.readouterr().out
        assert "digits (exp3), user 7: the application's state (the user has none of its own yet)" in printed
        assert printed.splitlines()[3].split()[0] == "a"
        assert main(["--url", url, "--token", TOKEN, "selection", "digits", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["updates"] == N
    finally:
        server.should_exit = True
        thread.join(10)


def test_an_application_added_again_reports_its_own_feedback_only(tables, logged):
    """Deleted and added again under its name, an application is a new one (its states start afresh): its report
    counted the old one's feedback too, as its losses, regret and counts."""
    aws = tables
    registry, _ = logged
    log = DynamoDBFeedbackLog(aws.dynamodb, "selection")
    report = ReportService(registry, log, FakeClock(_now()))
    assert report.report("digits")["feedbacks"] == N  # the feedback the worker learned carried the incarnation

    registry.delete_app("digits")
    registry.put_app(digits_app(name="digits", policy="exp3", incarnation=new_incarnation()))
    again = registry.get_app("digits")
    assert report.report("digits")["feedbacks"] == 0
    newer = entry(_now() - 5, "new-1")  # before the report's clock
    log.append(FeedbackEntry(**{**newer.__dict__, "incarnation": again.incarnation}))
    assert report.report("digits")["feedbacks"] == 1


def test_the_selection_state_shows_what_feedback_taught(tables, logged, capsys):
    """``GET /admin/apps/{app}/selection`` and ``clipper selection``: the weights the next query is drawn with. A
    user could only count ``?debug=true`` choices to see that the better model gained weight."""
    from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
    from clipper.cli.report import selection_table
    from clipper.selection.state import initial_state, state_key

    aws = tables
    registry, _ = logged
    states = DynamoDBSelectionStore(aws.dynamodb, "selection")
    report = ReportService(registry, DynamoDBFeedbackLog(aws.dynamodb, "selection"), FakeClock(_now()), states=states)
    client = TestClient(create_admin_app(AdminService(registry), "token", TOKEN, report))
    auth = {"Authorization": f"Bearer {TOKEN}"}

    body = client.get("/admin/apps/digits/selection", headers=auth).json()
    assert body["learned_from"] == "application" and body["updates"] == N and body["policy"] == "exp3"
    models = {m["model"]: m for m in body["models"]}
    assert models["a"]["weight"] > 0.9 > 0.1 > models["b"]["weight"]  # a always right, b always wrong
    assert models["a"]["mean_loss"] == 0.0 and models["b"]["mean_loss"] == 1.0
    assert models["a"]["judged"] + models["b"]["judged"] == N
    assert sum(m["probability"] for m in body["models"]) == pytest.approx(1.0)
    assert models["b"]["probability"] > models["b"]["weight"]  # exp3's exploration floor

    new_user = client.get("/admin/apps/digits/selection", params={"uid": "7"}, headers=auth).json()
    assert new_user["learned_from"] == "application" and new_user["user_id"] == "7"
    assert [m["weight"] for m in new_user["models"]] == [m["weight"] for m in body["models"]]  # where it starts
    incarnation = registry.get_app("digits").incarnation
    own = initial_state("exp3", ["a", "b"], incarnation)
    assert states.save(state_key("digits", "7"), own, expected_version=0)
    user = client.get("/admin/apps/digits/selection", params={"uid": 7}, headers=auth).json()
    assert user["learned_from"] == "user" and [m["weight"] for m in user["models"]] == [0.5, 0.5]

    # a model's active version changes: its arm starts again, as the frontend draws it (found by a review)
    registry.put_version(model_version("a", "2"), activate=True)
    moved = client.get("/admin/apps/digits/selection", headers=auth).json()
    a2 = next(m for m in moved["models"] if m["model"] == "a")
    assert a2["version"] == "2" and a2["judged"] == 0 and a2["weight"] < models["a"]["weight"]
    registry.set_active_version("a", "1")  # back

    printed = selection_table(body)
    assert f"digits (exp3), the application: the application's state; {N} updates" in printed
    assert client.get("/admin/apps/nope/selection", headers=auth).status_code == 404
    assert client.get("/admin/apps/digits/selection", params={"uid": ""}, headers=auth).status_code == 400
    assert client.get("/admin/apps/digits/selection").status_code == 401
    registry.put_app(digits_app(name="fresh", policy="exp3", incarnation=new_incarnation()))
    fresh = client.get("/admin/apps/fresh/selection", headers=auth).json()
    assert fresh["learned_from"] == "initial" and fresh["models"] == [] and fresh["updates"] == 0
