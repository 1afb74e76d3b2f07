"""`make bench-frontdoor`'s generator over real sockets: every query is sent and counted, a `"default": true`
answer is a miss, and the plain FastAPI + ONNX Runtime server it compares the stack with answers from its
model. Small loads to 127.0.0.1, a second or so each; no timing is asserted."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import pytest

from bench.frontdoor.config import CASES, WORK_DIR
from bench.frontdoor.inputs import Bodies, base_rows
from bench.frontdoor.loadgen import Runner
from bench.frontdoor.procs import Group, free_port, wait_port
from bench.frontdoor.stats import DEFAULT, REAL, UNSENT, poisson_offsets, summarize

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    r = Runner()
    yield r
    r.close()


def serve(command: list[str], name: str, env: dict[str, str] | None = None) -> tuple[Group, int]:
    port = free_port()
    group = Group([sys.executable, *command, "--port", str(port)], WORK_DIR / f"test-{name}.log", None, env)
    try:
        wait_port(port, group.proc, name)
    except Exception:
        group.stop()
        raise
    return group, port


def trial(runner: Runner, port: int, app: str, rate: float, seconds: float, stop_early: bool = False):
    bodies = Bodies(base_rows(CASES["mlp"]), app)
    offsets = poisson_offsets(rate, seconds, np.random.default_rng(7))
    requests = [bodies.request(1 + i) for i in range(len(offsets))]
    kw = {"warmup_s": 0.0, "slo_s": 0.02, "timeout_s": 5.0, "max_connections": 8, "initial_connections": 2}
    return runner.trial("127.0.0.1", port, requests, offsets, stop_early=stop_early, **kw)


def test_every_query_is_answered_and_defaults_are_misses(runner):
    group, port = serve(["-m", "bench.frontdoor.trivial_server", "--default-every", "25"], "trivial-defaults")
    try:
        record = trial(runner, port, "trivial", 300.0, 1.0)
        stopped = trial(runner, port, "trivial", 300.0, 1.0, stop_early=True)
    finally:
        group.stop()
    n = len(record.offsets)
    defaults = int(np.sum(record.outcome == DEFAULT))
    assert n > 200 and np.all(np.isin(record.outcome, (REAL, DEFAULT)))
    assert defaults >= n // 25 - 8  # every 25th answer of each connection (at most 8 connections)
    r = summarize(record, slo_ms=1000.0, rate=300.0)
    assert r["defaults"] == defaults and r["real"] == n - defaults and not r["ok"]
    # With the early stop (the benchmark's way), the trial ends once its verdict is settled: 1 miss in ~300
    # queries is over 0.1 %, so the first default ends it and the rest are not counted.
    assert stopped.stopped_early and 1 <= np.sum(stopped.outcome == DEFAULT) <= 8
    assert np.sum(stopped.outcome == UNSENT) > n // 2
    assert not summarize(stopped, slo_ms=1000.0, rate=300.0)["ok"]


def test_a_server_without_defaults_passes_when_latency_is_no_object(runner):
    group, port = serve(["-m", "bench.frontdoor.trivial_server"], "trivial")
    try:
        record = trial(runner, port, "trivial", 300.0, 1.0)
    finally:
        group.stop()
    r = summarize(record, slo_ms=5000.0, rate=300.0)
    assert r["real"] == r["queries"] == len(record.offsets) and r["ok"]


def test_the_plain_server_answers_from_its_model(runner, demo_models):
    path = f"{demo_models['out_dir']}/mlp/1/model.onnx"
    command = ["-m", "uvicorn", "--factory", "bench.frontdoor.plain_server:create_app", "--log-level", "warning"]
    group, port = serve(command, "plain", {"FRONTDOOR_PLAIN_MODELS": f"fd-mlp={path}"})
    try:
        record = trial(runner, port, "fd-mlp", 50.0, 1.0)
    finally:
        group.stop()
    r = summarize(record, slo_ms=5000.0, rate=50.0)
    assert r["queries"] == len(record.offsets) > 20
    assert r["real"] == r["queries"] and r["errors"] == r["defaults"] == r["timeouts"] == 0


def test_the_quick_run_writes_every_trial_and_the_summary(tmp_path):
    """`python -m bench.frontdoor --quick` against the plain server and the limits (the stack is left out: it
    takes a minute to start; `make bench-frontdoor BENCH_ARGS=--quick` runs it too)."""
    import json
    import subprocess

    command = [sys.executable, "-m", "bench.frontdoor", "--quick", "--systems", "plain", "--models", "mlp"]
    done = subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "frontdoor_quick.json").read_text())
    assert (tmp_path / "frontdoor_quick.png").stat().st_size > 0
    (search,) = result["searches"]
    assert (search["system"], search["app"], search["slo_ms"]) == ("plain", "fd-mlp", 20.0)
    assert search["trials"] and search["max_rate"] in [0.0, *(t["offered_rate"] for t in search["trials"] if t["ok"])]
    fields = {"offered_rate", "achieved_rate", "p50_ms", "p90_ms", "p99_ms", "max_ms", "real", "defaults", "errors"}
    assert all(fields <= set(t) for t in search["trials"])
    assert result["raw"]["mlp"]["rows_per_s"] > 0 and result["generator_ceiling"]["trials"]
    (row,) = result["summary"]
    assert row["model"] == "mlp" and row["plain_max_rate"] == search["max_rate"]
    assert "| mlp | 20 ms |" in done.stdout
