from __future__ import annotations

import json

import pytest

from clipper.frontend.metrics import EmfQueryMetrics, InProcessMetrics
from clipper.frontend.results import Prediction, QueryResult
from tests.fakes import model_version

pytestmark = pytest.mark.unit


def ensemble_result() -> QueryResult:
    return QueryResult(
        [Prediction(1000, 3, False)],
        batch=False,
        model="good",
        version="1",
        models=["good", "slow"],
        cache_by_model={"good": ("1", 0, 1), "slow": ("2", 0, 1)},
        timings_ms={"validate": 1.0, "select": 2.0, "cache": 0.5, "enqueue": 10.0, "wait": 50.0, "combine": 0.2},
        model_timings_ms={
            "good": {"send": 4.0, "queue": 3.0, "batch_wait": 3.0, "inference": 2.0, "batch_size": 5.0, "reply": 48.0},
            "slow": {"send": 6.0, "queue": 14.0, "inference": 7.0, "batch_size": 1.0, "reply": 29.0},
        },
        model_errors=["slow"],
    )


def queue_down_result() -> QueryResult:
    """The request queue refused the query's message: no output, and no model's doing."""
    return QueryResult(
        [Prediction(1000, -1, True, "model good:1: queue unavailable (redis: connection refused)")],
        batch=False,
        model="good",
        version="1",
        models=["good"],
        versions={"good": "1"},
        cache_by_model={"good": ("1", 0, 1)},
        transport_failures=["good"],
    )


def test_emf_lines_carry_every_stage_by_app_and_by_model(capsys, monkeypatch):
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    EmfQueryMetrics()("ens", ensemble_result(), 0.07)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]

    def value(line, name):
        v = line[name]
        return v[0] if isinstance(v, list) else v

    (by_app,) = [m for m in lines if m.get("app") == "ens"]
    assert value(by_app, "QueryLatency") == pytest.approx(70.0) and value(by_app, "Queries") == 1
    assert {k: value(by_app, k) for k in ("ValidateLatency", "EnqueueLatency", "WaitLatency", "CombineLatency")} == {
        "ValidateLatency": 1.0,
        "EnqueueLatency": 10.0,
        "WaitLatency": 50.0,
        "CombineLatency": 0.2,
    }
    declared = {m["Name"] for d in by_app["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert {"QueryLatency", "SelectLatency", "CacheLatency"} <= declared
    models = {m["model"]: m for m in lines if "model" in m}
    assert value(models["good"], "BatchWaitLatency") == 3.0 and value(models["good"], "InferenceLatency") == 2.0
    assert value(models["slow"], "QueueLatency") == 14.0 and "BatchWaitLatency" not in models["slow"]
    assert value(models["good"], "BatchSize") == 5.0 and value(models["slow"], "ReplyLatency") == 29.0
    assert value(models["slow"], "ModelErrors") == 1 and value(models["good"], "ModelErrors") == 0
    assert value(models["slow"], "TransportFailures") == 0
    (by_service,) = [m for m in lines if m.get("service") == "clipper-frontend" and "Queries" in m]
    assert value(by_service, "DefaultOutputs") == 0


def test_in_process_histograms_per_stage_and_per_model_and_a_reset():
    metrics = InProcessMetrics()
    metrics("ens", ensemble_result(), 0.07)
    metrics("ens", ensemble_result(), 0.09)
    report = metrics.report()
    hists = {k: v for h in report["histograms"] for k, v in h.items()}
    counters = {k: v for c in report["counters"] for k, v in c.items()}
    assert hists["app:ens:wait_ms"]["count"] == 2 and hists["app:ens:combine_ms"]["max"] == 0.2
    assert hists["model:good:1:inference_ms"]["p50"] == 2.0 and hists["model:slow:2:queue_ms"]["p50"] == 14.0
    assert hists["model:good:1:batch_wait_ms"]["count"] == 2 and "model:slow:2:batch_wait_ms" not in hists
    assert hists["model:good:1:batch_size"]["max"] == 5.0
    assert counters["model:slow:2:num_errors"] == 2 and "model:good:1:num_errors" not in counters
    assert "model:slow:2:num_transport_failures" not in counters
    metrics.reset()
    assert metrics.report() == {"counters": [], "meters": [], "histograms": []}


def test_with_emf_disabled_nothing_is_written_and_nothing_piles_up(capsys, monkeypatch):
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")  # as the local stack runs it
    disabled = EmfQueryMetrics()
    for _ in range(3):
        disabled("ens", ensemble_result(), 0.07)
    assert capsys.readouterr().out == ""
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED")
    metrics = EmfQueryMetrics()
    metrics("ens", ensemble_result(), 0.07)

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    (by_app,) = [m for m in lines if m.get("app") == "ens"]
    latency = by_app["QueryLatency"]
    assert (latency if isinstance(latency, list) else [latency]) == [70.0]  # this query's value alone, not four
    assert "model" not in by_app  # no dimension left over from an earlier line


def test_a_queue_failure_is_counted_as_a_transport_failure_not_as_the_models_error(capsys, monkeypatch):
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    EmfQueryMetrics()("ens", queue_down_result(), 0.01)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    (by_model,) = [m for m in lines if m.get("model") == "good"]
    assert by_model["TransportFailures"] == 1 and by_model["ModelErrors"] == 0
    metrics = InProcessMetrics()
    metrics("ens", queue_down_result(), 0.01)
    counters = {k: v for c in metrics.report()["counters"] for k, v in c.items()}
    assert counters["model:good:1:num_transport_failures"] == 1 and "model:good:1:num_errors" not in counters
    assert counters["app:ens:default_predictions"] == 1


def test_a_batch_whose_rows_ended_followed_and_unavailable_counts_a_transport_failure():
    """A batch's inputs end one by one: one row waited on another query's computation that failed ("followed",
    counted there), another found the frontend's own dependency down ("unavailable"). The model did not fail; the
    transport did, and it is counted (the model's kind, the first row's, named neither)."""
    from clipper.frontend.results import ModelAnswer

    answer = ModelAnswer(model_version(), [None, None])
    answer.fail("owner's timeout", "followed")
    assert not answer.transport_failed()
    answer.row_problems = {1: ("cache unavailable", "unavailable")}
    assert answer.transport_failed()
    answer.fail("model error", "error")  # the model's own failure: its error, not the transport's
    assert not answer.transport_failed()
