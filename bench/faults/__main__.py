"""make bench-faults: the running local stack (Redis Streams transport), steady load at its front door, and one
fault at a time; per scenario the queries sent, answered by a model, answered with the default (and its cause),
4xx, 5xx, lost (no answer at all), and the seconds to recover after the fault ends. Writes
bench/results/faults.json and faults.png (a timeline per scenario).

    python -m bench.faults [--quick] [--scenarios a,b] [--out DIR]

Targets: 0 lost, 0 5xx, every default carries its cause, the frontend's memory bounded. Exits 1 when a scenario
missed one (after writing the report).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.faults import report
from bench.faults.load import Load
from bench.faults.plan import FULL, QUICK, Plan
from bench.faults.scenarios import SCENARIOS
from bench.faults.streams import redelivery
from bench.faults.truth import Reference, wrong_answers
from bench.faults.world import World
from bench.frontdoor.config import CASES, MODELS_DIR, RESULTS, ROOT
from bench.frontdoor.inputs import base_rows
from bench.frontdoor.stack import LocalStack


def log(line: str) -> None:
    print(f"[bench-faults] {line}", flush=True)


def run_scenario(world: World, name: str, plan: Plan, rows: Any, first_serial: int, ref: Reference) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    app = scenario.app
    log(f"{name}: {plan.rate:g} q/s to /{app}/predict; {plan.before_s:g} s before the fault")
    restarts = world.restarts()
    lines_before = frontend_log_lines(world)
    load = Load(world.stack.url, app, rows, plan.rate, first_serial=first_serial)
    load.start()
    time.sleep(plan.before_s)
    extra = scenario.inject(world, load, plan)
    log(f"{name}: fault over after {extra['fault_end'] - extra['fault_start']:.1f} s; {plan.after_s:g} s after it")
    time.sleep(plan.after_s)
    outcomes = load.stop()
    restarted = {n: c - restarts.get(n, 0) for n, c in world.restarts().items() if c != restarts.get(n, 0)}
    wrong = wrong_answers(outcomes, load.row, ref.labels)
    summary = report.summarize(
        outcomes, extra["fault_start"], extra["fault_end"], wrong=len(wrong), slo_ms=scenario.slo_ms
    )
    row = {"scenario": name, "app": app, **summary, "last_serial": load.last_serial, "restarts": restarted}
    row["generator_max_lag_ms"] = round(load.max_lag_ms, 1)
    # what the fault wrote to the frontend's log (its outage lines are sampled: at most one a second per kind)
    row["frontend_log_lines"] = frontend_log_lines(world) - lines_before
    row.update({k: v for k, v in extra.items() if k not in ("fault_start", "fault_end")})
    row["wrong_examples"] = [{"serial": o.serial, "output": o.output} for o in wrong[:5]]
    row["misses_targets"] = report.verdict(row, scenario.all_real)
    log(
        f"{name}: sent {row['sent']}, real {row['real']}, default {row['default']}, 4xx {row['4xx']}, "
        f"5xx {row['5xx']}, lost {row['lost']}, wrong {row['wrong']}, late {row['late']}, "
        f"recovery {row['recovery_s']} s"
        + f", {row['frontend_log_lines']} frontend log line(s)"
        + (f", restarted {restarted}" if restarted else "")
        + (f", the generator sent up to {load.max_lag_ms:.0f} ms late" if load.max_lag_ms > 100 else "")
        + (f"  MISSES: {'; '.join(row['misses_targets'])}" if row["misses_targets"] else "")
    )
    return {**row, "outcomes": outcomes, "fault_start": extra["fault_start"], "fault_end": extra["fault_end"]}


def frontend_log_lines(world: World) -> int:
    """Lines in the frontend's log so far (0 before it has one)."""
    try:
        with open(world.state / "logs" / "frontend.log", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def settle_redeliveries(world: World, runs: list[dict[str, Any]], plan: Plan) -> None:
    """A killed batcher's messages come back after the visibility timeout: judged at the end of the run."""
    for run in runs:
        if "redelivery" not in run:
            continue
        log(f"{run['scenario']}: what became of the {run['in_flight_at_kill']} message(s) the killed batcher held")
        got = redelivery(world.redis(), run.pop("redelivery"), plan.redelivery_wait_s)
        run["redelivered"] = got
        if got["checked"]:
            run.setdefault("checks", {})[
                "every message the killed batcher held was acknowledged after its redelivery"
            ] = got["still_pending"] == 0 and got["dead_lettered"] == 0
        run["misses_targets"] = report.verdict(run, SCENARIOS[run["scenario"]].all_real)
        log(f"{run['scenario']}: {got}")


def _commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return ""
    return done.stdout.strip()


def missed_targets(summary: list[dict[str, Any]]) -> list[str]:
    """Per scenario that missed a target, what it missed (the run's exit status is 1 when any did)."""
    return [f"{r['scenario']}: {', '.join(r['misses_targets'])}" for r in summary if r["misses_targets"]]


def main(argv: list[str] | None = None) -> int:
    """The run; its exit status: 1 when a scenario missed a target (the report is written either way)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter windows, 1,000 unknown names (a check that it runs)")
    p.add_argument("--scenarios", help=f"comma-separated, of: {', '.join(SCENARIOS)}")
    p.add_argument("--out", type=Path, default=RESULTS, help="where faults.json and faults.png go")
    args = p.parse_args(argv)
    names = args.scenarios.split(",") if args.scenarios else list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    if len(set(names)) != len(names):
        p.error("a scenario is named twice")
    plan = QUICK if args.quick else FULL
    stack = LocalStack("redis", core=None)
    stack.state_dir = ROOT / "build" / "bench-faults" / "state"
    world = World(stack)
    rows = base_rows(CASES["mlp"])
    ref = Reference(MODELS_DIR / "mlp" / "1" / "model.onnx")
    runs: list[dict[str, Any]] = []
    conditions: dict[str, Any] = {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    stack.start()
    try:
        world.setup_faulty()
        for name in names:
            first = runs[-1]["last_serial"] + 1 if runs else 1
            runs.append(run_scenario(world, name, plan, rows, first, ref))
            time.sleep(2)  # the next scenario starts from a settled stack
        conditions["load_average_at_end"] = os.getloadavg()
        settle_redeliveries(world, runs, plan)
    finally:
        world.teardown()
        stack.stop()
    summary = [{k: v for k, v in r.items() if k not in ("outcomes",)} for r in runs]
    print(report.table(summary))
    args.out.mkdir(parents=True, exist_ok=True)
    name = "faults_quick" if args.quick else "faults"
    result = {
        "plan": asdict(plan),
        "transport": "redis",
        "targets": "0 lost, 0 5xx, every default with its cause, no wrong answer, each scenario's checks "
        "(memory bounded among them)",
        "conditions": {**conditions, "commit": _commit(), "finished": time.strftime("%Y-%m-%d %H:%M:%S %z")},
        "scenarios": summary,
        "timelines": {r["scenario"]: [asdict(o) for o in r["outcomes"]] for r in runs},
    }
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    report.plot(runs, args.out / f"{name}.png")
    log(f"wrote {args.out / (name + '.json')} and {args.out / (name + '.png')}")
    missed = missed_targets(summary)
    if missed:
        log("targets missed: " + " | ".join(missed))
        return 1
    log("every target met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
