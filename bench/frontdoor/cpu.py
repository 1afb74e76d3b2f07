"""CPU per query, stage by stage: the whole local stack pinned to one core (as bench-frontdoor runs it), a
closed-loop load of C keep-alive connections from the other core, and the CPU seconds each of the stack's
processes used over the run (``/proc/<pid>/stat``), divided by the queries answered. Two runs: distinct inputs
(every query a cache miss: frontend, Redis, batcher, model server) and one repeated input (every query a cache
hit: the frontend and Redis only).

Then the same at fixed open-loop rates (``--rates``, Poisson arrivals as bench-frontdoor sends them, distinct
inputs): a closed loop keeps 8 queries in flight, so its batches, Redis writes and event-loop turns are shared
by several queries; at the rates where bench-frontdoor's search decides, queries arrive alone and each pays
them in full. Each rate reports the CPU per query by process, every other process of the stack together
("other": the other models' batchers and servers, the feedback worker, the supervisor), how busy the stack's
core was, and the latency p50/p99.

    python -m bench.frontdoor.cpu [--seconds 10] [--connections 8] [--rates 250,500,1000] [--out DIR]

Prints the tables (ms of CPU per query by process; context switches per query by process, every thread counted,
from ``/proc/<pid>/task/*/status``) and writes bench/results/frontdoor_cpu.json. This says where
the stack's per-query CPU goes; where a stage is heavy, ``py-spy record --pid <pid>`` on that process says why.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.frontdoor.config import (
    CASES,
    GENERATOR_CORE,
    MAX_CONNECTIONS,
    REQUEST_TIMEOUT_S,
    RESULTS,
    SEED,
    SUT_CORE,
    add_rates_option,
    log,
    rates_of,
)
from bench.frontdoor.inputs import Bodies, base_rows
from bench.frontdoor.loadgen import Runner
from bench.frontdoor.procs import can_pin, pin_self
from bench.frontdoor.stack import LocalStack
from bench.frontdoor.stats import DEFAULT, REAL, poisson_offsets, summarize


def groups(model: str) -> tuple[str, ...]:
    """The processes reported one by one for ``model``'s queries (the rest are "other")."""
    return ("frontend", f"batcher-{model}", f"endpoint-{model}", "redis", "moto")


def group_of(process: str, named: tuple[str, ...]) -> str:
    """The group a process of the stack counts in: its name, or a replica's (``batcher-cnn-1-0`` in
    ``batcher-cnn``), or "other"."""
    for group in named:
        if process == group or process.startswith(group + "-"):
            return group
    return "other"


def by_group(used: dict[str, float], named: tuple[str, ...]) -> dict[str, float]:
    out = dict.fromkeys((*named, "other"), 0.0)
    for process, seconds in used.items():
        out[group_of(process, named)] += seconds
    return out


def cpu_ticks(pids: dict[str, int]) -> dict[str, int]:
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            out[name] = 0
    return out


def switches(pids: dict[str, int]) -> dict[str, int]:
    """Context switches so far (voluntary and not) of each process, over all its threads (``/proc/<pid>/task/*``; a
    thread that ended takes its count with it)."""
    out = {}
    for name, pid in pids.items():
        total = 0
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            tasks = []
        for task in tasks:
            try:
                for line in (task / "status").read_text().splitlines():
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
            except (OSError, ValueError):
                continue
        out[name] = total
    return out


def per_query_switches(
    before: dict[str, int], after: dict[str, int], answered: int, named: tuple[str, ...]
) -> dict[str, float]:
    """Context switches a query by group (every process's threads), and their total."""
    grouped = by_group({name: float(after.get(name, 0) - n) for name, n in before.items()}, named)
    out = {g: round(n / answered, 2) for g, n in grouped.items()}
    out["total"] = round(sum(grouped.values()) / answered, 2)
    return out


async def closed_loop(port: int, bodies: list[bytes], path: str, connections: int, seconds: float) -> dict[str, int]:
    counts = {"answered": 0, "default": 0, "error": 0}
    end = time.monotonic() + seconds

    async def one_connection(offset: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        n = offset
        while time.monotonic() < end:
            body = bodies[n % len(bodies)]
            n += connections
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            status = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(h.split(b":")[1]) for h in status.split(b"\r\n") if h.lower().startswith(b"content-length")
            )
            data = await reader.readexactly(length)
            counts["answered"] += 1
            if not status.startswith(b"HTTP/1.1 200"):
                counts["error"] += 1
            elif orjson.loads(data).get("default"):
                counts["default"] += 1
        writer.close()

    await asyncio.gather(*(one_connection(i) for i in range(connections)))
    return counts


def stack_pids(stack: LocalStack) -> dict[str, int]:
    """Every process of the stack by name (the supervisor's processes file)."""
    from clipper.cli.local import processes

    return {p["name"]: p["pid"] for p in processes(stack.state_dir) or []}


def cpu_seconds(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """CPU seconds each process used between two ``cpu_ticks``."""
    hz = os.sysconf("SC_CLK_TCK")
    return {name: (after[name] - before[name]) / hz for name in before}


def measure(
    stack: LocalStack, bodies: list[bytes], path: str, connections: int, seconds: float, model: str = "mlp"
) -> dict[str, Any]:
    named = groups(model)
    pids = {name: pid for name, pid in stack_pids(stack).items() if group_of(name, named) != "other"}
    port = int(stack.url.rsplit(":", 1)[1])
    before, started, switched = cpu_ticks(pids), time.monotonic(), switches(pids)
    counts = asyncio.run(closed_loop(port, bodies, path, connections, seconds))
    after, took = cpu_ticks(pids), time.monotonic() - started
    answered = max(1, counts["answered"])
    used = by_group(cpu_seconds(before, after), named)
    per_query = {name: seconds / answered * 1000 for name, seconds in used.items() if name != "other"}
    return {
        **counts,
        "switches_per_query": per_query_switches(switched, switches(pids), answered, named),
        "seconds": round(took, 2),
        "rate_qps": round(counts["answered"] / took, 1),
        "cpu_ms_per_query": {k: round(v, 4) for k, v in per_query.items()},
        "cpu_ms_per_query_total": round(sum(per_query.values()), 4),
    }


def open_loop(
    stack: LocalStack, maker: Bodies, first: int, rate: float, seconds: float, model: str = "mlp"
) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` for ``seconds`` (after 1 s of warm-up at the same rate), distinct inputs from
    serial ``first`` on: CPU per answered query by process (every process of the stack counted), the core's busy
    share, and the latency figures of bench-frontdoor's trials."""
    case, named = CASES[model], groups(model)
    pids = stack_pids(stack)
    warmup = 1.0
    offsets = poisson_offsets(rate, warmup + seconds, np.random.default_rng(SEED + int(rate)))
    requests = [maker.request(first + i) for i in range(len(offsets))]
    port = int(stack.url.rsplit(":", 1)[1])
    runner = Runner()
    try:
        before, started, switched = cpu_ticks(pids), time.monotonic(), switches(pids)
        record = runner.trial(
            "127.0.0.1",
            port,
            requests,
            offsets,
            warmup_s=warmup,
            slo_s=case.slo_ms / 1000,
            timeout_s=REQUEST_TIMEOUT_S,
            max_connections=MAX_CONNECTIONS,
            initial_connections=8,
            stop_early=False,
        )
        after, took, switched_after = cpu_ticks(pids), time.monotonic() - started, switches(pids)
    finally:
        runner.close()
    figures = summarize(record, case.slo_ms, rate)
    answered = max(1, int(np.isin(record.outcome, (REAL, DEFAULT)).sum()))  # warm-up included, as in the CPU
    used = cpu_seconds(before, after)
    per_query = {g: seconds / answered * 1000 for g, seconds in by_group(used, named).items()}
    return {
        "offered_qps": rate,
        "answered": answered,
        "seconds": round(took, 2),
        "core_busy": round(sum(used.values()) / took, 3),
        "cpu_ms_per_query": {k: round(v, 4) for k, v in per_query.items()},
        "cpu_ms_per_query_total": round(sum(per_query.values()), 4),
        "switches_per_query": per_query_switches(switched, switched_after, answered, named),
        **{k: figures.get(k) for k in ("p50_ms", "p99_ms", "real", "defaults", "timeouts", "ok")},
    }


# Fixed open-loop rates a model's stack can answer: below, near and past its knee in bench-frontdoor's runs.
DEFAULT_RATES = {"mlp": "250,500,1000", "cnn": "100,160,220"}


def ms(value: float | None) -> str:
    return "miss" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--connections", type=int, default=8)
    add_rates_option(p, DEFAULT_RATES, "; '' for none")
    p.add_argument("--model", default="mlp", choices=sorted(CASES), help="the model case queried")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    named = groups(args.model)
    pinned = can_pin()
    if pinned:
        pin_self(GENERATOR_CORE)
    stack = LocalStack("redis", SUT_CORE if pinned else None)
    stack.start()
    try:
        case = CASES[args.model]
        stack.register([case])
        time.sleep(3)
        maker = Bodies(base_rows(case), case.app)
        distinct = [maker.body(n) for n in range(1, 200_001)]
        log("warm-up")
        measure(stack, distinct[-5000:], maker.path, args.connections, 2.0, args.model)
        log(f"cache misses: {args.connections} connections, {args.seconds:g} s, distinct inputs")
        miss = measure(stack, distinct, maker.path, args.connections, args.seconds, args.model)
        log(f"cache hits: the same input, {args.seconds:g} s")
        hit = measure(stack, [distinct[0]], maker.path, args.connections, args.seconds, args.model)
        rates = rates_of(args.rates, DEFAULT_RATES[args.model])
        opened = []
        first = 300_000  # beyond the closed loop's serials: every input distinct
        for rate in rates:
            log(f"open loop: {rate:g} q/s, Poisson arrivals, distinct inputs, {args.seconds:g} s")
            opened.append(open_loop(stack, maker, first, rate, args.seconds, args.model))
            first += int(rate * (args.seconds + 2)) + 1000
            time.sleep(2)
    finally:
        stack.stop()
    result = {
        "model": args.model,
        "pinned": pinned,
        "connections": args.connections,
        "miss": miss,
        "hit": hit,
        "open_loop": opened,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = "frontdoor_cpu.json" if args.model == "mlp" else f"frontdoor_cpu_{args.model}.json"
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out / name}")
    print("| ms of CPU per query | " + " | ".join(named) + " | total | q/s |")
    print("|---" * (len(named) + 3) + "|")
    for name, run in (("cache miss", miss), ("cache hit", hit)):
        cells = [f"{run['cpu_ms_per_query'].get(g, 0):.3f}" for g in named]
        print(f"| {name} | " + " | ".join(cells) + f" | {run['cpu_ms_per_query_total']:.3f} | {run['rate_qps']:.0f} |")
    if opened:
        columns = [*named, "other"]
        print("\n| open loop, q/s | " + " | ".join(columns) + " | total ms/query | core busy | p50 ms | p99 ms |")
        print("|---" * (len(columns) + 5) + "|")
        for run in opened:
            cells = [f"{run['cpu_ms_per_query'][g]:.3f}" for g in columns]
            print(
                f"| {run['offered_qps']:g} | " + " | ".join(cells) + f" | {run['cpu_ms_per_query_total']:.3f} | "
                f"{run['core_busy']:.0%} | {ms(run['p50_ms'])} | {ms(run['p99_ms'])} |"
            )
    runs = [("cache miss", miss), ("cache hit", hit), *((f"open loop {r['offered_qps']:g} q/s", r) for r in opened)]
    columns = [*named, "other", "total"]
    print("\n| context switches per query | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, run in runs:
        print(f"| {name} | " + " | ".join(f"{run['switches_per_query'][g]:.2f}" for g in columns) + " |")


if __name__ == "__main__":
    main()
