"""What ran on the stack's core while its queries missed: the whole local stack pinned to one core (as
bench-frontdoor runs it), open-loop Poisson trials at the given rates from the other core (distinct inputs, the MLP
at its 20 ms SLO), each trial recorded with ``perf sched`` on the stack's core. For each trial it finds the clusters
of misses (defaults, errors, answers past the SLO, by send time) and prints, for the window around the largest,
how many milliseconds of the core each process used in each 20 ms bin (frontend, batcher, model server, Redis, moto,
idle, other), beside the queries sent and missed in the bin.

This is how the twenty-fourth session found the after-idle collapse (bench/README.md, front door): a trial after a
2 s pause missed every query for a second while moto took 40 % of the core and the batcher and Redis none, every
query rereading its application itself.

    python -m bench.frontdoor.sched [--plan 500:4,idle:2,1000:5,1000:5] [--rounds 2] [--out DIR]

Needs ``perf`` and the right to trace the core (root, or ``kernel.perf_event_paranoid`` <= 0 with the sched
tracepoints readable); without them it still runs the trials and reports the clusters, without the table.
Writes bench/results/frontdoor_sched.json. A diagnostic: its rates and timings are not bench-frontdoor's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.frontdoor.config import CASES, GENERATOR_CORE, REQUEST_TIMEOUT_S, RESULTS, SEED, SUT_CORE, WORK_DIR, log
from bench.frontdoor.cpu import group_of, groups, stack_pids
from bench.frontdoor.inputs import Bodies, base_rows
from bench.frontdoor.loadgen import OpenLoop, Runner
from bench.frontdoor.procs import can_pin, pin_self
from bench.frontdoor.stack import LocalStack
from bench.frontdoor.stats import REAL, poisson_offsets

BIN_S = 0.02
CLUSTER_GAP_S = 0.015  # misses sent within this of each other are one cluster
_LINE = re.compile(r"^\s*([\d.]+)\s+\[\d+\]\s+(\S*?)\[(\d+)(?:/(\d+))?\]\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s*$")
_IDLE = re.compile(r"^\s*([\d.]+)\s+\[\d+\]\s+<idle>\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s*$")


@dataclass(frozen=True)
class Run:
    """A stretch a task ran on the core: it ended at ``end`` (seconds, CLOCK_MONOTONIC) after ``ms``."""

    end: float
    pid: int  # the process (the thread group); 0 for the idle task
    comm: str
    ms: float


def parse_timehist(text: str) -> list[Run]:
    """The runs in ``perf sched timehist`` output (one line per switch out: time, cpu, task[tid/pid], wait,
    scheduling delay, run time in ms)."""
    runs = []
    for line in text.splitlines():
        if m := _IDLE.match(line):
            runs.append(Run(float(m[1]), 0, "<idle>", float(m[2])))
        elif m := _LINE.match(line):
            runs.append(Run(float(m[1]), int(m[4] or m[3]), m[2], float(m[5])))
    return runs


def clusters(times: list[float], gap_s: float = CLUSTER_GAP_S) -> list[tuple[float, float, int]]:
    """Runs of sorted ``times`` with gaps under ``gap_s``: (first, last, count), largest first."""
    out: list[tuple[float, float, int]] = []
    for t in sorted(times):
        if out and t - out[-1][1] < gap_s:
            first, _, n = out[-1]
            out[-1] = (first, t, n + 1)
        else:
            out.append((t, t, 1))
    return sorted(out, key=lambda c: -c[2])


def cpu_by_bin(runs: list[Run], lo: float, hi: float, step: float, name_of: dict[int, str]) -> list[dict[str, float]]:
    """Milliseconds of the core each process group (``name_of``: pid -> group; "idle", else "other") used in each
    ``step`` bin of [lo, hi)."""
    bins: list[dict[str, float]] = [defaultdict(float) for _ in range(max(0, round((hi - lo) / step)))]
    for r in runs:
        start = r.end - r.ms / 1000
        if r.end <= lo or start >= hi:
            continue
        who = "idle" if r.pid == 0 else name_of.get(r.pid, "other")
        first, last = max(0, int((start - lo) // step)), min(len(bins) - 1, int((r.end - lo) // step))
        for b in range(first, last + 1):
            a, z = lo + b * step, lo + (b + 1) * step
            overlap = min(r.end, z) - max(start, a)
            if overlap > 0:
                bins[b][who] += overlap * 1000
    return [dict(b) for b in bins]


def parse_plan(text: str) -> list[tuple[str, float, float]]:
    """``rate:seconds`` or ``idle:seconds``, comma-separated: ("trial", rate, s) or ("idle", 0, s)."""
    plan = []
    for part in text.split(","):
        what, _, seconds = part.strip().partition(":")
        if what == "idle":
            plan.append(("idle", 0.0, float(seconds)))
        else:
            plan.append(("trial", float(what), float(seconds)))
    return plan


def perf_usable() -> bool:
    return shutil.which("perf") is not None and (os.geteuid() == 0 or _paranoid() <= 0)


def _paranoid() -> int:
    try:
        return int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    except (OSError, ValueError):
        return 2


def table(rows: list[dict[str, float]], sent: list[int], missed: list[int], lo: float, names: list[str]) -> str:
    head = "| t (s) | sent | missed | " + " | ".join(names) + " | other |"
    lines = [head, "|---" * (len(names) + 4) + "|"]
    for i, row in enumerate(rows):
        other = sum(v for k, v in row.items() if k not in names)
        cells = " | ".join(f"{row.get(n, 0.0):.1f}" for n in names)
        lines.append(f"| {lo + i * BIN_S:.2f} | {sent[i]} | {missed[i]} | {cells} | {other:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", default="500:4,idle:2,1000:5,1000:5", help="rate:seconds or idle:seconds, in order")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    plan, case, traced = parse_plan(args.plan) * args.rounds, CASES["mlp"], perf_usable()
    if not traced:
        log("perf sched is not usable here (no perf, or no right to trace): the clusters only")
    pinned = can_pin()
    if pinned:
        pin_self(GENERATOR_CORE)
    stack = LocalStack("redis", SUT_CORE if pinned else None)
    stack.start()
    trials: list[dict[str, Any]] = []
    runner = Runner()
    try:
        stack.register([case])
        time.sleep(3)
        maker, port = Bodies(base_rows(case), case.app), int(stack.url.rsplit(":", 1)[1])
        named = groups("mlp")
        # a process counts in its group (a replica's in its model's), else under its own name
        name_of = {pid: g if (g := group_of(n, named)) != "other" else n for n, pid in stack_pids(stack).items()}
        serial = 1
        for k, (what, rate, seconds) in enumerate(plan):
            if what == "idle":
                log(f"idle {seconds:g} s")
                time.sleep(seconds)
                continue
            offsets = poisson_offsets(rate, seconds, np.random.default_rng(SEED + k))
            requests = [maker.request(serial + i) for i in range(len(offsets))]
            serial += len(offsets)
            data = WORK_DIR / f"sched-{k}.data"
            perf = None
            if traced:
                command = ["perf", "sched", "record", "-C", str(SUT_CORE), "-k", "CLOCK_MONOTONIC", "-o", str(data)]
                perf = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.5)
            trial = OpenLoop(
                "127.0.0.1", port, requests, offsets, warmup_s=0.0, slo_s=case.slo_ms / 1000,
                timeout_s=REQUEST_TIMEOUT_S, max_connections=256, initial_connections=16, stop_early=False,
            )  # fmt: skip
            record = runner.loop.run_until_complete(trial.run())
            missed = (record.outcome != REAL) | ~(record.latency_s <= case.slo_ms / 1000)
            sends = trial.t0 + offsets
            found = clusters([float(t) for t in sends[missed]])
            result: dict[str, Any] = {"rate": rate, "seconds": seconds, "queries": len(offsets)}
            result |= {
                "misses": int(missed.sum()),
                "clusters": [[round(a - trial.t0, 3), round(b - trial.t0, 3), n] for a, b, n in found[:5]],
            }
            log(
                f"trial {k}: {rate:g} q/s for {seconds:g} s: {result['misses']} misses of {len(offsets)}; "
                f"clusters (start, end s, misses): {result['clusters'][:3]}"
            )
            if perf is not None:
                time.sleep(0.3)
                perf.send_signal(signal.SIGINT)
                perf.wait(30)
                text = subprocess.run(
                    ["perf", "sched", "timehist", "-i", str(data)], capture_output=True, text=True
                ).stdout
                runs = parse_timehist(text)
                data.unlink(missing_ok=True)
                windows = []
                for first, last, _n in found[:2]:
                    lo, hi = first - 0.1, last + 0.06
                    nb = max(1, round((hi - lo) / BIN_S))
                    rows = cpu_by_bin(runs, lo, lo + nb * BIN_S, BIN_S, name_of)
                    index = np.clip(((sends - lo) // BIN_S).astype(int), -1, nb)
                    sent = [int(np.sum(index == b)) for b in range(nb)]
                    lost = [int(np.sum(missed & (index == b))) for b in range(nb)]
                    print(table(rows, sent, lost, lo - trial.t0, [*named, "idle"]), flush=True)
                    windows.append({"from_s": round(lo - trial.t0, 3), "bins_ms": rows, "sent": sent, "missed": lost})
                result["windows"] = windows
            trials.append(result)
    finally:
        runner.close()
        stack.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    out = {"harness": "whole local stack, perf sched on its core (a diagnostic)", "traced": traced, "trials": trials}
    (args.out / "frontdoor_sched.json").write_text(json.dumps(out, indent=1) + "\n")
    log(f"wrote {args.out / 'frontdoor_sched.json'}")


if __name__ == "__main__":
    main()
