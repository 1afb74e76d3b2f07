"""Front-door benchmark: the whole local stack on one core, driven at its HTTP front door as a user meets it,
beside a plain FastAPI + ONNX Runtime server and the raw in-process limit, on the same core and models.

What runs where (2 cores)::

    core 0: the system under test, one at a time: the server that answers at once (the generator's ceiling),
            the raw ONNX Runtime limit, the plain server (uvicorn), the local stack (infra/local/run.py and
            every process it starts: moto, redis-server, model servers, batchers, the frontend) for each
            request-queue transport
    core 1: this process: the open-loop generator (uvloop, pre-encoded requests, keep-alive connections)

For each model (the digits MLP at a 20 ms SLO, the 3x32x32 CNN at 100 ms) and each system it searches the
highest offered rate (Poisson arrivals, every input distinct) whose trial passes: nearest-rank p99 latency,
from each query's scheduled send time, within the SLO and at least 99.9 % real answers (a ``"default": true``
answer, an error or a timeout is a miss). The search doubles from a start rate until a trial fails, then
bisects (3 steps); a trial sends for a 1 s warm-up (not counted) plus 3,000 / rate seconds, within 5 to 15 s;
each rate is tried once (a near miss is a miss). A trial stops as soon as its verdict is a certain failure.
After each trial the benchmark waits until the system answers 3 probes in a row promptly (at most 20 s).

The package: ``config`` (cases, plans), ``stats`` (schedule, counting, verdict), ``search`` (the rate search),
``inputs`` (distinct requests), ``loadgen`` (the generator), ``trials`` (a trial, settling, a search against a
system), ``procs`` (pinned process groups), ``stack`` (the local stack and its registration), ``plain_server``,
``trivial_server``, ``raw`` (the raw limit), ``report`` (summary, table, plot).

Run ``python -m bench.frontdoor [--quick] [--models mlp,cnn] [--transports redis,sqs] [--systems
plain,stack]`` from the repository root (``make bench-frontdoor``). It prints its progress and a summary table,
and writes ``bench/results/frontdoor.json`` and ``frontdoor.png`` (``--quick``: ``frontdoor_quick.*``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench.frontdoor.config import (
    CASES,
    CEILING_CASE,
    FULL,
    GENERATOR_CORE,
    MODELS_DIR,
    QUICK,
    RATE_CAP,
    RESULTS,
    SUT_CORE,
    TRANSPORTS,
    WORK_DIR,
    ModelCase,
    Plan,
    log,
)
from bench.frontdoor.inputs import Bodies, Serials, base_rows
from bench.frontdoor.loadgen import Runner
from bench.frontdoor.procs import Group, can_pin, free_port, pin_self, wait_port
from bench.frontdoor.report import flag_generator_bound, plot, summarize_run, table
from bench.frontdoor.search import SearchResult
from bench.frontdoor.stack import LocalStack, cnn_path
from bench.frontdoor.trials import Target, Trials


def search_record(target: Target, case: ModelCase, result: SearchResult) -> dict[str, Any]:
    return {
        "system": target.system,
        "transport": target.transport,
        "app": case.app,
        "model": case.name,
        "slo_ms": case.slo_ms,
        "max_rate": round(result.rate, 1),
        "reached_rate_cap": result.capped,
        "at_max": result.at_rate,
        "trials": result.trials,
    }


def generator_ceiling(trials: Trials, core: int | None, plan: Plan) -> dict[str, Any]:
    """The generator's own ceiling: the search against a server that answers at once."""
    port = free_port()
    command = [sys.executable, "-m", "bench.frontdoor.trivial_server", "--port", str(port)]
    group = Group(command, WORK_DIR / "trivial.log", core)
    try:
        wait_port(port, group.proc, "the trivial server")
        target = Target("trivial", None, port)
        trials.warm(target, CEILING_CASE)
        original = trials.plan
        trials.plan = Plan(**{**original.__dict__, "max_trial_s": plan.ceiling_max_trial_s})
        try:
            result = trials.search(target, CEILING_CASE, RATE_CAP)
        finally:
            trials.plan = original
    finally:
        group.stop()
    return search_record(target, CEILING_CASE, result)


def raw_limits(cases: list[ModelCase], core: int | None, plan: Plan) -> dict[str, dict[str, Any]]:
    out = {}
    for case in cases:
        log(f"raw ONNX Runtime limit of {case.name} (one process, one thread, core {core}, SLO {case.slo_ms:g} ms)")
        lines: list[str] = []
        command = [sys.executable, "-m", "bench.frontdoor.raw", "--model", case.name]
        command += ["--budget-s", str(plan.raw_budget_s)]
        group = Group(command, WORK_DIR / f"raw-{case.name}.log", core, on_line=_echo_into(lines))
        try:
            group.proc.wait()
        finally:
            group.stop()
        found = [json.loads(line) for line in lines if line.startswith("{")]
        if group.proc.returncode != 0 or not found:
            raise RuntimeError(f"the raw limit of {case.name} failed:\n{group.tail()}")
        out[case.name] = found[-1]
        log(f"  raw limit of {case.name}: {found[-1]['rows_per_s']:,.0f} rows/s at batch {found[-1]['batch']}")
    return out


def _echo_into(lines: list[str]) -> Any:
    def keep(line: str) -> None:
        lines.append(line)
        if not line.startswith("{"):
            print(f"    {line.strip()}", flush=True)

    return keep


def model_path(case: ModelCase) -> str:
    return str(cnn_path() if case.name == "cnn" else MODELS_DIR / case.name / "1" / "model.onnx")


def plain_searches(trials: Trials, cases: list[ModelCase], core: int | None, cap: float) -> list[dict[str, Any]]:
    port = free_port()
    models = ",".join(f"{c.app}={model_path(c)}" for c in cases)
    command = [sys.executable, "-m", "uvicorn", "--factory", "bench.frontdoor.plain_server:create_app"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"]
    log(f"starting the plain FastAPI + ONNX Runtime server (uvicorn, core {core}, port {port})")
    group = Group(command, WORK_DIR / "plain.log", core, {"FRONTDOOR_PLAIN_MODELS": models})
    try:
        wait_port(port, group.proc, "the plain server")
        target = Target("plain", None, port)
        return [search_record(target, c, trials.search(target, c, cap)) for c in cases]
    finally:
        group.stop()


def stack_searches(
    trials: Trials, cases: list[ModelCase], transport: str, core: int | None, cap: float
) -> list[dict[str, Any]]:
    stack = LocalStack(transport, core)
    try:
        stack.start()
        stack.register(cases)
        port = int(stack.url.rsplit(":", 1)[1])
        target = Target("stack", transport, port)
        out = [search_record(target, c, trials.search(target, c, cap)) for c in cases]
        for record in out:
            record["stack_start_s"] = round(stack.ready_at, 1)
        return out
    except KeyboardInterrupt:
        raise
    except Exception as e:  # a stack that does not start or register is reported, and the run goes on
        log(f"error: the stack with transport {transport} failed: {e}")
        return [
            {
                "system": "stack",
                "transport": transport,
                "app": c.app,
                "model": c.name,
                "slo_ms": c.slo_ms,
                "max_rate": None,
                "error": str(e)[-2000:],
                "trials": [],
            }
            for c in cases
        ]
    finally:
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few short trials")
    parser.add_argument("--models", default="mlp,cnn", help=f"comma-separated, of {sorted(CASES)}")
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="the stack's request-queue transports")
    parser.add_argument("--systems", default="plain,stack", help="which systems to measure: plain, stack")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the folder of the JSON and the PNG")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    systems = {s.strip() for s in args.systems.split(",")}
    known = set(names) <= set(CASES) and set(transports) <= set(TRANSPORTS) and systems <= {"plain", "stack"}
    if not names or not known:
        parser.error(f"models of {sorted(CASES)}, transports of {list(TRANSPORTS)}, systems of plain, stack")
    cases = [CASES[n] for n in names]
    plan = QUICK if args.quick else FULL

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupted)
    pin = can_pin()
    core: int | None = SUT_CORE if pin else None
    if pin:
        pin_self(GENERATOR_CORE)
    else:
        log("warning: fewer than 2 cores or no taskset: nothing is pinned, figures are not comparable")
    started = time.monotonic()
    meta: dict[str, Any] = {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "pinned": pin,
        "sut_core": core,
        "generator_core": GENERATOR_CORE if pin else None,
        "loadavg_start": " ".join(f"{v:.2f}" for v in os.getloadavg()),
        "quick": args.quick,
        "plan": plan.__dict__,
        "harness": "whole local stack at its HTTP front door (POST /<app>/predict), nothing replaced",
    }
    log(
        f"plan: trials of {plan.warmup_s:g} s warm-up + {plan.target_queries:,} queries' worth within "
        f"{plan.min_trial_s:g}-{plan.max_trial_s:g} s, {plan.refine_steps} bisection steps; systems "
        f"{sorted(systems)}, transports {transports}, models {[c.name for c in cases]}"
    )
    trial_rows = {c.app: Bodies(base_rows(c), c.app) for c in cases}
    trial_rows[CEILING_CASE.app] = Bodies(base_rows(CASES["mlp"]), CEILING_CASE.app)
    runner = Runner()
    trials = Trials(plan, runner, Serials(), trial_rows)
    searches: list[dict[str, Any]] = []
    try:
        log(f"the generator's ceiling (against a server that answers at once, core {core})")
        ceiling = generator_ceiling(trials, core, plan)
        cap = RATE_CAP
        raw = raw_limits(cases, core, plan)
        if "plain" in systems:
            searches += plain_searches(trials, cases, core, cap)
        if "stack" in systems:
            for transport in transports:
                searches += stack_searches(trials, cases, transport, core, cap)
    except KeyboardInterrupt:
        log("interrupted: every process this benchmark started is stopped; nothing written")
        return 130
    finally:
        runner.close()
    meta["seconds"] = round(time.monotonic() - started, 1)
    meta["loadavg_end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    summary = summarize_run(searches, raw)
    for s in flag_generator_bound(searches, ceiling["max_rate"]):
        log(f"warning: {s['system']} {s['transport'] or ''} {s['app']}: {s['generator_may_limit']}")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "frontdoor_quick" if args.quick else "frontdoor"
    out = args.out / f"{stem}.json"
    document = {"run": meta, "summary": summary, "generator_ceiling": ceiling, "raw": raw, "searches": searches}
    out.write_text(json.dumps(document, indent=1) + "\n")
    plot(searches, raw, ceiling["max_rate"], args.out / f"{stem}.png")
    at = ceiling.get("at_max") or {}
    log(
        f"generator ceiling: {ceiling['max_rate']:,.0f} q/s against a server that answers at once (p99 "
        f"{at.get('p99_ms')} ms, generator CPU {at.get('generator_cpu_fraction')}, late p99 "
        f"{at.get('generator_late_p99_ms')} ms)"
        + (" - the search's cap: it does more" if ceiling["reached_rate_cap"] else "")
    )
    print("\n" + table(summary, transports) + "\n", flush=True)
    log(f"wrote {out} and {stem}.png in {meta['seconds']:.0f} s")
    if args.quick:
        log("--quick: trials of a second or two and no bisection: a smoke run, not figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
