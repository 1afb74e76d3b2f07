"""Trials against one system: a trial at a fixed offered rate (schedule, distinct requests, the generator, the
figures), the settling between trials, and the rate search over them."""

from __future__ import annotations

import http.client
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from bench.frontdoor.config import (
    INITIAL_CONNECTIONS,
    MAX_CONNECTIONS,
    MAX_QUERIES_PER_TRIAL,
    REQUEST_TIMEOUT_S,
    SEED,
    ModelCase,
    Plan,
    log,
)
from bench.frontdoor.inputs import Bodies, Serials
from bench.frontdoor.loadgen import Runner
from bench.frontdoor.search import SearchResult, find_max_rate
from bench.frontdoor.stats import poisson_offsets, summarize

SETTLE_PROBES = 3  # consecutive prompt answers that say the system has drained


@dataclass
class Target:
    """A system under test as the generator sees it."""

    system: str  # "stack", "plain" or "trivial"
    transport: str | None  # the stack's request-queue transport
    port: int
    host: str = "127.0.0.1"


class Trials:
    def __init__(self, plan: Plan, runner: Runner, serials: Serials, bodies: dict[str, Bodies]) -> None:
        self.plan, self.runner, self.serials, self.bodies = plan, runner, serials, bodies
        self.count = 0
        self.baseline_ms: dict[tuple[str, str | None, str], float] = {}

    def duration_s(self, rate: float, max_s: float | None = None) -> float:
        p = self.plan
        measured = min(max_s or p.max_trial_s, max(p.min_trial_s, p.target_queries / rate))
        return min(p.warmup_s + measured, max(1.0, MAX_QUERIES_PER_TRIAL / rate))

    def trial(self, target: Target, case: ModelCase, rate: float, max_s: float | None = None) -> dict[str, Any]:
        self.count += 1
        duration = self.duration_s(rate, max_s)
        offsets = poisson_offsets(rate, duration, np.random.default_rng(SEED + self.count))
        bodies = self.bodies[case.app]
        requests = [bodies.request(s) for s in self.serials.take(len(offsets))]
        record = self.runner.trial(
            target.host,
            target.port,
            requests,
            offsets,
            warmup_s=self.plan.warmup_s,
            slo_s=case.slo_ms / 1000,
            timeout_s=REQUEST_TIMEOUT_S,
            max_connections=MAX_CONNECTIONS,
            initial_connections=INITIAL_CONNECTIONS,
        )
        del requests
        result: dict[str, Any] = {
            "system": target.system,
            "transport": target.transport,
            "app": case.app,
            "model": case.name,
        }
        result |= summarize(record, case.slo_ms, rate)
        result["settle_s"] = self.settle(target, case)
        _say(result, case.slo_ms)
        return result

    def search(self, target: Target, case: ModelCase, cap: float) -> SearchResult:
        label = target.system + (f" ({target.transport})" if target.transport else "")
        log(f"{label}, {case.app}: searching the highest rate with p99 <= {case.slo_ms:g} ms, >= 99.9 % real answers")
        self.warm(target, case)
        result = find_max_rate(
            lambda rate: self.trial(target, case, rate),
            case.start_rate,
            floor=case.start_rate * self.plan.floor_fraction,
            cap=cap,
            refine_steps=self.plan.refine_steps,
        )
        log(
            f"{label}, {case.app}: highest rate {result.rate:,.0f} q/s"
            + (" (the search's cap: the system may do more)" if result.capped else "")
            + f" after {len(result.trials)} trials"
        )
        return result

    # -- probes: warm-up before a search, settling after each trial ------------------------------------------
    def warm(self, target: Target, case: ModelCase, probes: int = 20) -> None:
        """Sequential queries before a search (the first ones pay connections and first runs): the median of
        the last half is the system's idle latency, which the settling compares with."""
        times = [self.probe(target, case)[0] for _ in range(probes)]
        finite = [t for t in times[probes // 2 :] if math.isfinite(t)]
        idle = statistics.median(finite) if finite else math.inf
        self.baseline_ms[(target.system, target.transport, case.app)] = idle
        log(f"  idle latency (median of {len(finite)} sequential probes): {idle:.2f} ms")

    def settle(self, target: Target, case: ModelCase) -> float:
        """Wait until the system answers ``SETTLE_PROBES`` probes in a row promptly (a real answer within
        max(SLO, 1.5x its idle latency)): the backlog of the trial before is gone. At most settle_max_s."""
        started = time.monotonic()
        idle = self.baseline_ms.get((target.system, target.transport, case.app), case.slo_ms)
        prompt_ms = max(case.slo_ms, 1.5 * idle) if math.isfinite(idle) else case.slo_ms
        time.sleep(0.2)
        in_a_row = 0
        while in_a_row < SETTLE_PROBES and time.monotonic() - started < self.plan.settle_max_s:
            latency, real = self.probe(target, case)
            in_a_row = in_a_row + 1 if real and latency <= prompt_ms else 0
            if in_a_row == 0:
                time.sleep(0.1)
        return round(time.monotonic() - started, 2)

    def probe(self, target: Target, case: ModelCase) -> tuple[float, bool]:
        """One query on a fresh connection: (latency in ms, whether a model answered it)."""
        body = self.bodies[case.app].body(self.serials.take(1)[0])
        conn = http.client.HTTPConnection(target.host, target.port, timeout=REQUEST_TIMEOUT_S * 5)
        started = time.perf_counter()
        try:
            conn.request("POST", self.bodies[case.app].path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read()
            latency = (time.perf_counter() - started) * 1000
            real = response.status == 200 and orjson.loads(raw).get("default") is not True
            return latency, real
        except (OSError, http.client.HTTPException, orjson.JSONDecodeError):
            return math.inf, False
        finally:
            conn.close()


def _say(r: dict[str, Any], slo_ms: float) -> None:
    def ms(value: float | None) -> str:
        return f"{value:8.2f}" if value is not None else "     inf"

    flag = "ok  " if r["ok"] else "FAIL"
    late = r["generator_late_p99_ms"]
    log(
        f"  {r['app']} {r['offered_rate']:9,.0f} q/s: {flag} p50 {ms(r['p50_ms'])} p99 {ms(r['p99_ms'])} ms "
        f"(SLO {slo_ms:g}), {r['real']}/{r['queries']} real, {r['defaults']} defaults, {r['errors']} errors, "
        f"{r['timeouts']} timeouts; achieved {r['achieved_rate']:,.0f} q/s; generator CPU "
        f"{r['generator_cpu_fraction']:.0%}, late p99 {late if late is not None else '-'} ms"
        + ("; stopped early (the verdict was settled)" if r["stopped_early"] else "")
        + f"; settled in {r['settle_s']:.1f} s"
        + "".join(
            f"\n      default: {cause or '(no explanation)'} x{n}" for cause, n in r.get("default_causes", {}).items()
        )
    )
