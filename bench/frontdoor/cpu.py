"""CPU per query, stage by stage: the whole local stack pinned to one core (as bench-frontdoor runs it), a
closed-loop load of C keep-alive connections from the other core, and the CPU seconds each of the stack's
processes used over the run (``/proc/<pid>/stat``), divided by the queries answered. Two runs: distinct inputs
(every query a cache miss: frontend, Redis, batcher, model server) and one repeated input (every query a cache
hit: the frontend and Redis only).

    python -m bench.frontdoor.cpu [--seconds 10] [--connections 8] [--out DIR]

Prints a table (ms of CPU per query by process) and writes bench/results/frontdoor_cpu.json. This says where
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

import orjson

from bench.frontdoor.config import CASES, GENERATOR_CORE, RESULTS, SUT_CORE, log
from bench.frontdoor.inputs import Bodies, base_rows
from bench.frontdoor.procs import can_pin, pin_self
from bench.frontdoor.stack import LocalStack

GROUPS = ("frontend", "batcher-mlp", "endpoint-mlp", "redis", "moto")


def cpu_ticks(pids: dict[str, int]) -> dict[str, int]:
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            out[name] = 0
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


def measure(stack: LocalStack, bodies: list[bytes], path: str, connections: int, seconds: float) -> dict[str, Any]:
    from clipper.cli.local import processes

    pids = {p["name"]: p["pid"] for p in processes(stack.state_dir) or [] if p["name"] in GROUPS}
    port = int(stack.url.rsplit(":", 1)[1])
    before, started = cpu_ticks(pids), time.monotonic()
    counts = asyncio.run(closed_loop(port, bodies, path, connections, seconds))
    after, took = cpu_ticks(pids), time.monotonic() - started
    hz = os.sysconf("SC_CLK_TCK")
    answered = max(1, counts["answered"])
    per_query = {name: (after[name] - before[name]) / hz / answered * 1000 for name in pids}
    return {
        **counts,
        "seconds": round(took, 2),
        "rate_qps": round(counts["answered"] / took, 1),
        "cpu_ms_per_query": {k: round(v, 4) for k, v in per_query.items()},
        "cpu_ms_per_query_total": round(sum(per_query.values()), 4),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    pinned = can_pin()
    if pinned:
        pin_self(GENERATOR_CORE)
    stack = LocalStack("redis", SUT_CORE if pinned else None)
    stack.start()
    try:
        case = CASES["mlp"]
        stack.register([case])
        time.sleep(3)
        maker = Bodies(base_rows(case), case.app)
        distinct = [maker.body(n) for n in range(1, 200_001)]
        log("warm-up")
        measure(stack, distinct[-5000:], maker.path, args.connections, 2.0)
        log(f"cache misses: {args.connections} connections, {args.seconds:g} s, distinct inputs")
        miss = measure(stack, distinct, maker.path, args.connections, args.seconds)
        log(f"cache hits: the same input, {args.seconds:g} s")
        hit = measure(stack, [distinct[0]], maker.path, args.connections, args.seconds)
    finally:
        stack.stop()
    result = {"pinned": pinned, "connections": args.connections, "miss": miss, "hit": hit}
    print("| ms of CPU per query | " + " | ".join(GROUPS) + " | total | q/s |")
    print("|---" * (len(GROUPS) + 3) + "|")
    for name, run in (("cache miss", miss), ("cache hit", hit)):
        cells = [f"{run['cpu_ms_per_query'].get(g, 0):.3f}" for g in GROUPS]
        print(f"| {name} | " + " | ".join(cells) + f" | {run['cpu_ms_per_query_total']:.3f} | {run['rate_qps']:.0f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frontdoor_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out / 'frontdoor_cpu.json'}")


if __name__ == "__main__":
    main()
