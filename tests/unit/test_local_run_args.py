"""The local stack's command line: the niceness of its background work and of the processes behind its frontend
follow the request-queue transport."""

from __future__ import annotations

import pytest

from infra.local.run import parse_args

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch):
    for name in ("CLIPPER_QUEUE_TRANSPORT", "CLIPPER_LOCAL_BACKGROUND_NICE", "CLIPPER_LOCAL_BACKEND_NICE"):
        monkeypatch.delenv(name, raising=False)


def test_background_work_runs_behind_the_queries_on_redis_streams_and_not_on_sqs():
    assert parse_args([]).background_nice == 19  # Redis Streams: no query waits for moto or the feedback worker
    assert parse_args(["--queue", "redis"]).background_nice == 19
    assert parse_args(["--queue", "sqs"]).background_nice == 0  # every query goes through moto's SQS


def test_the_niceness_can_be_set_by_flag_or_environment(monkeypatch):
    assert parse_args(["--background-nice", "0"]).background_nice == 0
    assert parse_args(["--queue", "sqs", "--background-nice", "10"]).background_nice == 10
    monkeypatch.setenv("CLIPPER_LOCAL_BACKGROUND_NICE", "5")
    assert parse_args([]).background_nice == 5
    with pytest.raises(SystemExit):
        parse_args(["--background-nice", "20"])


def test_the_processes_behind_the_frontend_yield_to_it_on_redis_streams_and_not_on_sqs(monkeypatch):
    assert parse_args([]).backend_nice == 5  # redis-server, the batchers, the model servers
    assert parse_args(["--queue", "sqs"]).backend_nice == 0  # moto is on every query's path there, at 0 too
    assert parse_args(["--backend-nice", "0"]).backend_nice == 0
    monkeypatch.setenv("CLIPPER_LOCAL_BACKEND_NICE", "3")
    assert parse_args([]).backend_nice == 3
    with pytest.raises(SystemExit):
        parse_args(["--backend-nice", "-1"])


def test_the_demo_slo_is_within_the_admin_apis_bounds(monkeypatch):
    assert parse_args(["--slo-ms", "1"]).slo_ms == 1 and parse_args(["--slo-ms", "30000"]).slo_ms == 30_000
    for bad in ("0.5", "0", "30001"):
        with pytest.raises(SystemExit):
            parse_args(["--slo-ms", bad])
    monkeypatch.setenv("CLIPPER_DEMO_SLO_MS", "0.5")
    with pytest.raises(SystemExit):
        parse_args([])
