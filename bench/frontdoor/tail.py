"""Where a query's time goes, at the median and in the tail: the whole local stack pinned to one core (as
bench-frontdoor runs it), open-loop Poisson arrivals at a fixed rate from the other core, distinct inputs, every
request with ``?debug=true`` so its answer carries the frontend's per-stage timings and the model's.

Queries are sorted by their latency at the client (from the *scheduled* send time, so a late generator counts
against the stack); for the band around the median (45-55th percentile) and for the slowest 1 % it reports the
mean of each stage:

- ``before/after handler``: the client's latency less the frontend's stages: the HTTP read and write and the
  wait for the frontend's event loop before its handler starts and after it answers;
- ``validate``, ``send`` (the fused cache lookup and send: one Redis round trip, awaited on the event loop);
- ``queue`` (from the send's end to the start of the batch, less the batch wait), ``batch wait`` (Clipper's T,
  as the batcher reports it), ``inference`` (the model server call), ``reply`` (from the end of the inference to
  the frontend holding the reply), ``combine``.

Every process of the stack shares the one core, so each hop (frontend -> Redis -> batcher -> model server ->
batcher -> Redis -> frontend) can wait for the core; the table says at which hops the tail's time is spent.
The debug timings cost a little CPU themselves: the rates here are not bench-frontdoor's figures.

    python -m bench.frontdoor.tail [--model mlp] [--rates 500,750] [--seconds 8] [--out DIR]

(the CNN's rates by default: 100,160)

Prints a table per rate, writes bench/results/frontdoor_tail[_<model>].json and a PNG of the stages (stacked,
median band beside the slowest 1 %, per rate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.frontdoor.config import CASES, GENERATOR_CORE, RESULTS, SEED, SUT_CORE, add_rates_option, log, rates_of
from bench.frontdoor.inputs import Bodies, base_rows
from bench.frontdoor.procs import can_pin, pin_self
from bench.frontdoor.stack import LocalStack
from bench.frontdoor.stats import poisson_offsets

# (label, frontend stage or model stage) in the order a query meets them; "outside" is computed
STAGES = (
    ("before/after handler", None),
    ("validate", "validate"),
    ("send", "enqueue"),
    ("queue", "m.queue"),
    ("batch wait", "m.batch_wait"),
    ("inference", "m.inference"),
    ("reply", "m.reply"),
    ("combine", "combine"),
)
FRONTEND_STAGES = ("validate", "select", "cache", "enqueue", "wait", "combine", "record")
WARMUP_S = 1.0
CONNECTIONS = 64


def stages_of(latency_ms: float, answer: dict[str, Any]) -> dict[str, float] | None:
    """One answer's stages (ms) by label; None for a default answer or one without debug timings."""
    debug = answer.get("debug")
    if answer.get("default") or not isinstance(debug, dict):
        return None
    front = debug.get("timings_ms") or {}
    models = debug.get("model_timings_ms") or {}
    if not front or len(models) != 1:
        return None
    model = next(iter(models.values()))
    flat = {**front, **{"m." + k: v for k, v in model.items()}}
    out = {label: float(flat.get(key, 0.0)) for label, key in STAGES if key is not None}
    out["before/after handler"] = max(0.0, latency_ms - sum(float(front.get(k, 0.0)) for k in FRONTEND_STAGES))
    out["batch size"] = float(model.get("batch_size", 0.0))
    return out


def bands(latencies_ms: list[float], answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean stages of the median band (45-55th percentile of the client latency) and of the slowest 1 %, over
    the real answers; defaults are counted, not broken down."""
    rows = [(lat, s) for lat, a in zip(latencies_ms, answers, strict=True) if (s := stages_of(lat, a)) is not None]
    rows.sort(key=lambda r: r[0])
    n = len(rows)
    out: dict[str, Any] = {"answers": len(answers), "broken_down": n, "defaults": len(answers) - n}
    if n < 100:
        return out
    for name, lo, hi in (("median", int(n * 0.45), int(n * 0.55)), ("slowest_1pct", int(n * 0.99), n)):
        chosen = rows[lo:hi]
        labels = [*(label for label, _ in STAGES), "batch size"]
        out[name] = {
            "client_ms": round(float(np.mean([r[0] for r in chosen])), 3),
            "stages_ms": {k: round(float(np.mean([r[1][k] for r in chosen])), 3) for k in labels},
        }
    return out


async def _run(port: int, path: str, bodies: list[bytes], offsets: np.ndarray) -> tuple[list[float], list[Any]]:
    """Send each body at its offset (seconds) on a pool of kept-alive connections; the latency of each from its
    scheduled time, and its parsed answer (None for an error), in send order."""
    pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(CONNECTIONS):
        pool.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    latencies = [0.0] * len(bodies)
    answers: list[Any] = [None] * len(bodies)
    start = time.perf_counter() + 0.2

    async def one(i: int) -> None:
        due = start + float(offsets[i])
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        reader, writer = await pool.get()
        body = bodies[i]
        head = f"POST {path}?debug=true HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        status = await reader.readuntil(b"\r\n\r\n")
        length = next(int(h.split(b":")[1]) for h in status.split(b"\r\n") if h.lower().startswith(b"content-length"))
        data = await reader.readexactly(length)
        latencies[i] = (time.perf_counter() - due) * 1000
        pool.put_nowait((reader, writer))
        if status.startswith(b"HTTP/1.1 200"):
            answers[i] = orjson.loads(data)

    await asyncio.gather(*(one(i) for i in range(len(bodies))))
    while not pool.empty():
        pool.get_nowait()[1].close()
    return latencies, answers


def measure(stack: LocalStack, maker: Bodies, first: int, rate: float, seconds: float) -> dict[str, Any]:
    offsets = poisson_offsets(rate, WARMUP_S + seconds, np.random.default_rng(SEED + int(rate)))
    bodies = [maker.body(first + i) for i in range(len(offsets))]
    port = int(stack.url.rsplit(":", 1)[1])
    latencies, answers = asyncio.run(_run(port, maker.path, bodies, offsets))
    measured = offsets >= WARMUP_S
    kept_lat = [lat for lat, m in zip(latencies, measured, strict=True) if m]
    kept = [a if a is not None else {"default": True} for a, m in zip(answers, measured, strict=True) if m]
    result = {"offered_qps": rate, "seconds": seconds, **bands(kept_lat, kept)}
    ordered = np.sort(np.array(kept_lat))
    result["client_p50_ms"] = round(float(ordered[len(ordered) // 2]), 3) if len(ordered) else None
    result["client_p99_ms"] = round(float(ordered[int(len(ordered) * 0.99)]), 3) if len(ordered) else None
    return result


def table(runs: list[dict[str, Any]]) -> str:
    labels = [*(label for label, _ in STAGES), "batch size"]
    lines = ["| rate, band | client ms | " + " | ".join(labels) + " |", "|---" * (len(labels) + 2) + "|"]
    for run in runs:
        for band in ("median", "slowest_1pct"):
            if band not in run:
                continue
            b = run[band]
            cells = " | ".join(f"{b['stages_ms'][k]:.2f}" for k in labels)
            name = "median band" if band == "median" else "slowest 1 %"
            lines.append(f"| {run['offered_qps']:g} q/s, {name} | {b['client_ms']:.2f} | {cells} |")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], model: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [
        (f"{r['offered_qps']:g} q/s\n{band.split('_')[0]}", r[band])
        for r in runs
        for band in ("median", "slowest_1pct")
        if band in r
    ]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(bars)), 4.5))
    bottoms = np.zeros(len(bars))
    for label, _ in STAGES:
        values = np.array([b["stages_ms"][label] for _, b in bars])
        ax.bar(range(len(bars)), values, bottom=bottoms, label=label)
        bottoms += values
    ax.set_xticks(range(len(bars)), [name for name, _ in bars])
    ax.set_ylabel("ms (mean over the band)")
    ax.set_title(f"{model}: a query's stages, median band vs slowest 1 % (one core)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Open-loop rates a model's stack can answer, near its knee in bench-frontdoor's runs.
DEFAULT_RATES = {"mlp": "500,750", "cnn": "100,160"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp", choices=sorted(CASES))
    add_rates_option(p, DEFAULT_RATES)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    pinned = can_pin()
    if pinned:
        pin_self(GENERATOR_CORE)
    stack = LocalStack("redis", SUT_CORE if pinned else None)
    stack.start()
    runs = []
    try:
        case = CASES[args.model]
        stack.register([case])
        time.sleep(3)
        maker = Bodies(base_rows(case), case.app)
        first = 700_000  # inputs no other run of this stack sent
        for rate in rates_of(args.rates, DEFAULT_RATES[args.model]):
            log(f"tail: {rate:g} q/s, Poisson arrivals, distinct inputs, debug timings, {args.seconds:g} s")
            runs.append(measure(stack, maker, first, rate, args.seconds))
            first += int(rate * (args.seconds + WARMUP_S + 2)) + 1000
            time.sleep(2)
    finally:
        stack.stop()
    print(table(runs))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "frontdoor_tail" if args.model == "mlp" else f"frontdoor_tail_{args.model}"
    result = {"model": args.model, "pinned": pinned, "harness": "whole local stack, debug timings", "runs": runs}
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(runs, args.model, args.out / f"{stem}.png")
    log(f"wrote {args.out / (stem + '.json')} and {stem}.png")


if __name__ == "__main__":
    main()
