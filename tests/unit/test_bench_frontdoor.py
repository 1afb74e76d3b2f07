"""The pure parts of `make bench-frontdoor`: the Poisson schedule, the verdict of a trial (a default is a miss,
a near miss is a miss), the early stop, the counting of a trial's outcomes and the rate search."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.frontdoor.inputs import Bodies
from bench.frontdoor.report import flag_generator_bound, summarize_run
from bench.frontdoor.search import find_max_rate
from bench.frontdoor.stats import (
    DEFAULT,
    ERROR,
    REAL,
    TIMEOUT,
    UNSENT,
    TrialRecord,
    certainly_fails,
    poisson_offsets,
    summarize,
    verdict,
)
from bench.frontdoor.tail import bands, stages_of

pytestmark = pytest.mark.unit


def test_poisson_schedule_has_the_rate_and_exponential_gaps():
    offsets = poisson_offsets(2000.0, 10.0, np.random.default_rng(1))
    assert np.all(np.diff(offsets) > 0) and offsets[0] >= 0 and offsets[-1] < 10.0
    assert len(offsets) == pytest.approx(20_000, rel=0.03)
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / 2000, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: coefficient of variation 1
    assert np.mean(gaps > 3 / 2000) == pytest.approx(math.exp(-3), abs=0.01)


def test_poisson_schedule_of_a_long_trial_is_not_cut_short():
    offsets = poisson_offsets(1.0, 400.0, np.random.default_rng(3))  # more arrivals than the first chunk may hold
    assert offsets[-1] > 380.0


def test_verdict_needs_p99_within_the_slo_and_999_real_in_1000():
    assert verdict(1000, within_slo=990, real=999)
    assert not verdict(1000, within_slo=989, real=1000)  # 11 over the SLO: the nearest-rank p99 is over it
    assert not verdict(1000, within_slo=1000, real=998)  # 2 misses in 1,000: under 99.9 % real
    assert not verdict(0, 0, 0)
    assert verdict(100, within_slo=99, real=100)
    assert not verdict(100, within_slo=99, real=99)  # 1 miss in 100 is 1 %


def test_certain_failure_is_called_exactly_when_the_verdict_is_lost():
    assert not certainly_fails(1000, not_within=1, misses=1)
    assert certainly_fails(1000, not_within=2, misses=2)
    assert not certainly_fails(1000, not_within=10, misses=0)
    assert certainly_fails(1000, not_within=11, misses=0)


def record(latency_ms, outcome, offsets=None, warmup_s=0.0, stopped=False):
    n = len(outcome)
    offsets = np.arange(n, dtype=float) / n if offsets is None else np.asarray(offsets, dtype=float)
    latency = np.asarray(latency_ms, dtype=float) / 1000
    return TrialRecord(
        offsets=offsets,
        latency_s=latency,
        outcome=np.asarray(outcome, dtype=np.int8),
        late_s=np.zeros(n),
        warmup_s=warmup_s,
        wall_s=1.0,
        cpu_s=0.5,
        stopped_early=stopped,
    )


def test_defaults_are_misses_even_when_fast():
    outcome = [REAL] * 998 + [DEFAULT] * 2
    r = summarize(record([5.0] * 1000, outcome), slo_ms=20.0, rate=1000.0)
    assert (r["real"], r["defaults"], r["ok"]) == (998, 2, False)
    assert r["within_slo"] == 998
    one = summarize(record([5.0] * 1000, [REAL] * 999 + [DEFAULT]), slo_ms=20.0, rate=1000.0)
    assert one["ok"] and one["defaults"] == 1


def test_defaults_are_counted_by_their_explanation_in_the_measured_window():
    offsets = [0.5, 1.1, 1.2, 1.3, 1.4]
    rec = record([5.0] * 5, [DEFAULT, DEFAULT, DEFAULT, DEFAULT, REAL], offsets=offsets, warmup_s=1.0)
    rec.causes = {
        0: "model mlp:1: timeout, no reply within the SLO of 20 ms (waited 20 ms)",  # in the warm-up: not counted
        1: "model mlp:1: timeout, no reply within the SLO of 20 ms (waited 21 ms)",
        2: "model mlp:1: timeout, no reply within the SLO of 20 ms (waited 20 ms)",
        3: "model mlp:1: queue unavailable (redis: no answer in time)",
    }
    r = summarize(rec, slo_ms=20.0, rate=5.0)
    assert r["default_causes"] == {
        "model mlp:1: timeout, no reply within the SLO of 20 ms": 2,
        "model mlp:1: queue unavailable": 1,
    }


def test_errors_and_timeouts_are_misses_and_have_no_latency():
    outcome = [REAL] * 97 + [ERROR, TIMEOUT, DEFAULT]
    r = summarize(record([1.0] * 97 + [np.nan, np.nan, 3.0], outcome), slo_ms=20.0, rate=100.0)
    assert (r["errors"], r["timeouts"], r["defaults"], r["real"]) == (1, 1, 1, 97)
    assert r["p99_ms"] is None and r["max_ms"] is None and r["p50_ms"] == 1.0
    assert not r["ok"]


def test_late_real_answers_count_against_the_p99():
    latencies = [5.0] * 989 + [25.0] * 11
    r = summarize(record(latencies, [REAL] * 1000), slo_ms=20.0, rate=1000.0)
    assert r["real"] == 1000 and not r["ok"] and r["p99_ms"] == 25.0
    r = summarize(record([5.0] * 990 + [25.0] * 10, [REAL] * 1000), slo_ms=20.0, rate=1000.0)
    assert r["ok"] and r["p99_ms"] == 5.0


def test_warmup_and_unsent_queries_are_not_counted():
    offsets = [0.1, 0.2, 1.1, 1.2, 1.3, 1.4]
    outcome = [DEFAULT, DEFAULT, REAL, REAL, REAL, UNSENT]
    r = summarize(record([5.0] * 6, outcome, offsets=offsets, warmup_s=1.0), slo_ms=20.0, rate=5.0)
    assert (r["queries"], r["real"], r["defaults"], r["ok"]) == (3, 3, 0, True)


def test_a_trial_stopped_early_fails():
    r = summarize(record([5.0] * 10, [REAL] * 10, stopped=True), slo_ms=20.0, rate=10.0)
    assert not r["ok"]


def fake(limit: float):
    """A system that passes every trial up to ``limit`` q/s."""
    seen: list[float] = []

    def measure(rate: float) -> dict:
        seen.append(rate)
        return {"offered_rate": rate, "ok": rate <= limit}

    return measure, seen


def test_search_doubles_then_bisects():
    measure, seen = fake(1234.0)
    result = find_max_rate(measure, 250.0, floor=10.0, cap=64_000.0, refine_steps=3)
    assert seen == [250.0, 500.0, 1000.0, 2000.0, 1500.0, 1250.0, 1125.0]
    assert result.rate == 1125.0 and result.at_rate == {"offered_rate": 1125.0, "ok": True}
    assert len(result.trials) == 7 and not result.capped


def test_search_halves_when_the_start_fails_and_gives_up_below_the_floor():
    measure, seen = fake(70.0)
    result = find_max_rate(measure, 250.0, floor=10.0, cap=64_000.0, refine_steps=1)
    assert seen == [250.0, 125.0, 62.5, 93.75]
    assert result.rate == 62.5
    measure, seen = fake(0.0)
    result = find_max_rate(measure, 250.0, floor=250 / 16, cap=64_000.0, refine_steps=3)
    assert seen == [250.0, 125.0, 62.5, 31.25, 15.625] and result.rate == 0.0 and result.at_rate is None


def test_search_stops_at_its_cap():
    measure, seen = fake(math.inf)
    result = find_max_rate(measure, 2000.0, floor=100.0, cap=10_000.0, refine_steps=3)
    assert seen == [2000.0, 4000.0, 8000.0, 10_000.0] and result.rate == 10_000.0 and result.capped


def test_a_near_miss_is_not_retried():
    calls: list[float] = []

    def flaky(rate: float) -> dict:
        calls.append(rate)
        return {"offered_rate": rate, "ok": rate != 1000.0 or calls.count(1000.0) > 1}

    result = find_max_rate(flaky, 500.0, floor=10.0, cap=64_000.0, refine_steps=0)
    assert calls == [500.0, 1000.0] and result.rate == 500.0


def test_bodies_are_distinct_and_keep_the_row():
    import json

    rows = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)
    bodies = Bodies(rows, "fd-mlp")
    seen = {bodies.body(n) for n in range(1, 2001)}
    assert len(seen) == 2000
    first = json.loads(bodies.body(3))["input"]
    assert first[1:] == [float(v) for v in rows[1][1:]] and first[0] == 3 * 2.0**-20
    request = bodies.request(3)
    head, _, body = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /fd-mlp/predict HTTP/1.1") and f"Content-Length: {len(body)}".encode() in head


def test_summary_ratios_and_targets_are_judged_on_redis():
    def search(system, transport, model, rate):
        return {
            "system": system,
            "transport": transport,
            "model": model,
            "slo_ms": 20.0,
            "max_rate": rate,
            "at_max": {"p99_ms": 10.0},
            "trials": [],
        }

    searches = [
        search("plain", None, "mlp", 2000.0),
        search("stack", "redis", "mlp", 999.0),
        search("stack", "sqs", "mlp", 1500.0),
    ]
    summary = summarize_run(searches, {"mlp": {"rows_per_s": 100_000.0, "batch": 256}})
    row = summary[0]
    assert row["stack"]["redis"]["over_plain"] == pytest.approx(0.4995, abs=1e-4)
    assert row["targets"][0]["met"] is False  # 0.4995x is under 0.5x: a near miss is a miss
    assert row["stack"]["sqs"]["over_plain"] == 0.75


def test_generator_bound_searches_are_flagged():
    trial = {"ok": False, "offered_rate": 4000.0, "generator_cpu_fraction": 0.95, "generator_late_p99_ms": 1.0}
    s = {"system": "plain", "transport": None, "app": "fd-mlp", "slo_ms": 20.0, "max_rate": 2000.0, "trials": [trial]}
    quiet = {**s, "trials": [{**trial, "generator_cpu_fraction": 0.3}]}
    stalled = {**s, "trials": [{**trial, "generator_cpu_fraction": 0.3, "generator_late_p99_ms": 6.0}]}
    flagged = flag_generator_bound([s, quiet, stalled], ceiling=30_000.0)
    assert flagged == [s, stalled] and quiet["generator_may_limit"] is None
    assert "late" in stalled["generator_may_limit"]


def _debug_answer(send: float, wait: float, inference: float, default: bool = False) -> dict:
    return {
        "default": default,
        "debug": {
            "timings_ms": {"validate": 0.1, "enqueue": send, "wait": wait, "combine": 0.05},
            "model_timings_ms": {
                "mlp": {"queue": 0.1, "batch_wait": 1.0, "inference": inference, "reply": wait - 1.1 - inference}
            },
        },
    }


def test_the_tail_breakdown_sorts_by_client_latency_and_leaves_defaults_out():
    latencies = [5.0] * 980 + [40.0] * 10 + [3.0] * 10
    answers = [_debug_answer(1.0, 3.0, 0.5)] * 980 + [_debug_answer(20.0, 15.0, 1.5)] * 10
    answers += [_debug_answer(0.1, 0.1, 0.1, default=True)] * 10  # fast defaults: counted, not broken down
    out = bands(latencies, answers)
    assert (out["answers"], out["broken_down"], out["defaults"]) == (1000, 990, 10)
    slow, median = out["slowest_1pct"], out["median"]
    assert slow["client_ms"] == pytest.approx(40.0)  # the ten slowest real answers, not the defaults
    assert slow["stages_ms"]["send"] == pytest.approx(20.0) and slow["stages_ms"]["inference"] == pytest.approx(1.5)
    # outside the handler: the client's latency less the frontend's stages
    assert slow["stages_ms"]["before/after handler"] == pytest.approx(40.0 - (0.1 + 20.0 + 15.0 + 0.05))
    assert median["stages_ms"]["send"] == pytest.approx(1.0)
    assert stages_of(5.0, {"default": False, "output": 1}) is None  # no debug timings


def test_the_cpu_diagnostic_has_rates_for_each_model_and_prints_a_missed_latency():
    """A rate at which nothing was answered in time has no p50 or p99: the table says so instead of failing
    (it did, for the CNN at the MLP's rates, before the JSON was written)."""
    from bench.frontdoor import tail
    from bench.frontdoor.config import CASES
    from bench.frontdoor.cpu import DEFAULT_RATES, ms

    assert set(DEFAULT_RATES) == set(CASES) == set(tail.DEFAULT_RATES)
    assert ms(None) == "miss" and ms(2.04) == "2.0"


def test_sched_reads_perf_timehist_and_bins_the_core_by_process():
    from bench.frontdoor.sched import Run, clusters, cpu_by_bin, parse_plan, parse_timehist

    text = """           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
   100.010000 [0000]  python[3852]                        0.000      0.026      10.000
   100.015000 [0000]  <idle>                              0.000      0.000      5.000
   100.030000 [0000]  python[3907/3852]                   1.000      0.013      15.000
   100.040000 [0000]  redis-server[3703]                  0.100      0.013      10.000
"""
    runs = parse_timehist(text)
    assert runs == [
        Run(100.010, 3852, "python", 10.0),
        Run(100.015, 0, "<idle>", 5.0),
        Run(100.030, 3852, "python", 15.0),  # a thread counts for its process
        Run(100.040, 3703, "redis-server", 10.0),
    ]
    bins = cpu_by_bin(runs, 100.0, 100.04, 0.02, {3852: "frontend"})
    assert bins[0] == pytest.approx({"frontend": 15.0, "idle": 5.0})  # 100.000-100.010 and 100.015-100.020
    assert bins[1] == pytest.approx({"frontend": 10.0, "other": 10.0})
    assert clusters([1.0, 1.01, 1.02, 2.0, 3.0, 3.005]) == [(1.0, 1.02, 3), (3.0, 3.005, 2), (2.0, 2.0, 1)]
    assert parse_plan("500:4,idle:2,1000:5") == [("trial", 500.0, 4.0), ("idle", 0.0, 2.0), ("trial", 1000.0, 5.0)]


def test_the_cpu_tool_counts_context_switches_of_every_thread_by_group():
    import os
    import threading

    from bench.frontdoor.cpu import groups, per_query_switches, switches

    before = switches({"frontend": os.getpid(), "gone": 2**22 + 7})
    done = threading.Event()
    worker = threading.Thread(target=lambda: [done.wait(0.001) for _ in range(50)])
    worker.start()
    worker.join()
    parked = threading.Thread(target=done.wait)  # a live thread's switches count too
    parked.start()
    after = switches({"frontend": os.getpid(), "gone": 2**22 + 7})
    done.set()
    parked.join()
    assert before["gone"] == after["gone"] == 0 and after["frontend"] > before["frontend"]
    named = groups("mlp")
    counts = per_query_switches(
        {"frontend": 10, "batcher-mlp-1": 0, "x": 0}, {"frontend": 30, "batcher-mlp-1": 10, "x": 4}, 10, named
    )
    assert counts["frontend"] == 2.0 and counts["batcher-mlp"] == 1.0 and counts["other"] == 0.4
    assert counts["total"] == 3.4
