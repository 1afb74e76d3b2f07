"""Adaptive batching benchmark of a part of the system (harness: batcher core + endpoint, queue replaced, no
frontend): the batcher core and the real endpoint server under open-loop load, with the model's queue replaced
by an in-memory pipe or by a queue with SQS's limits. The whole stack at its front door is
``bench.frontdoor``'s to measure.

For each model and latency objective (SLO) it finds the highest Poisson arrival rate the system sustains
(p99 of arrival -> reply within the SLO and at least 99 % of the queries answered within it) with

- adaptive batching: ``clipper.batching.core.Batcher`` driven by ``LongPollDriver`` with ``AimdController``
  (or, with ``--controller quantile``, ``QuantileController``);
- batch size 1: the same with ``FixedController(1)``;

and the raw ONNX Runtime limit at the same latency: the model's session called in process (one intra-op
thread, like the endpoint) with fixed batches of 1, 2, 4, ... 256 rows; the best rows/s among the batch sizes
whose p99 call latency is within the SLO.

What runs where (2 cores)::

    core 0: the load generator (its own process): Poisson arrival times; each query encoded as the frontend
            encodes it (encode_rows + QueryMessage.to_json) at its arrival, then sent through a pipe
    core 1: this process: the LongPollDriver thread, which reads the pipe inside QueueReader.receive
            (PipeQueue, as it reads SQS in production), runs the Batcher, calls the endpoint over HTTP with
            .npy batches and publishes one reply per query to RecordingReplies (the ReplyChannel port,
            which records the time); the endpoint server (python -m clipper_endpoint, one ORT thread,
            taskset -c 1); and, between trials, the raw ONNX Runtime measurement

What replaces the model's SQS queue (``--queues``, both by default, reported side by side):

- ``pipe``: the generator's pipe read inside ``QueueReader.receive`` (``PipeQueue``): any number of messages
  per receive, no cost per call;
- ``sqs-limits``: the same pipe with SQS's limits (``SqsLimitedQueue``): at most 10 messages per receive, and
  each call (receive, delete of up to 10, release) sleeps a latency drawn from ``--sqs-call-ms MEDIAN,P99``
  (log-normal; 18,50 by default, a mean of ~20 ms).

Latency is measured from each query's scheduled arrival time (so a late generator counts against the system,
never for it) to the moment its reply is published. Queries the batcher drops as expired, or that are not
answered by the end of a trial, count as outside the SLO. Each rate is tried once: a near miss is a miss.

The package: ``config`` (cases, queues, plans), ``load`` (the generator process and CPU pinning), ``ports``
(the in-memory queue, reply channel, timed endpoint and driver), ``sqs_limits`` (the queue with SQS's
limits), ``sut`` (the endpoint server, one trial, the rate search), ``raw`` (the raw ONNX Runtime limit),
``report`` (plot, README section, run history).

Run ``python -m bench.batching [--quick] [--models mlp,cnn] [--queues pipe,sqs-limits] [--sqs-call-ms 18,50]
[--controller aimd|quantile]`` from the repository root (``make bench-batching``); the full run takes about 8
minutes with both queues, ``--quick`` about one. It prints its progress
and figures and writes ``bench/results/batching.json``, ``bench/results/batching.png``, adds the run's
headline figures to ``bench/results/batching_runs.json`` and rewrites the ``## Batching ...`` section of
``bench/README.md`` (``--quick`` writes ``batching_quick.*`` only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.batching.config import (
    CASES,
    DEFAULT_SQS_CALL_MS,
    FULL,
    HARNESS,
    MODELS_DIR,
    QUEUES,
    QUICK,
    README,
    RESULTS,
    ROOT,
    SEED,
    SUT_CORE,
    ModelCase,
    Plan,
    log,
)
from bench.batching.history import record_run
from bench.batching.load import can_pin, generator_main, pin_process
from bench.batching.raw import raw_limit
from bench.batching.report import plot, readme_section, update_readme
from bench.batching.sqs_limits import CallLatency
from bench.batching.sut import Harness, endpoint_server, search


def model_inputs(name: str) -> tuple[Path, np.ndarray]:
    if name == "mlp":
        from infra.demo.train_models import ensure_models

        manifest = ensure_models(MODELS_DIR, log=log)
        holdout = np.load(Path(manifest["out_dir"]) / manifest["dataset"]["holdout"])
        return MODELS_DIR / "mlp" / "1" / "model.onnx", np.ascontiguousarray(holdout["X"], dtype=np.float32)
    from infra.demo.cnn_model import INPUT_SHAPE, ensure_cnn

    path = ensure_cnn(MODELS_DIR)
    images = np.random.default_rng(SEED).random((64, *INPUT_SHAPE), dtype=np.float32)
    return path, images


def bench_model(
    case: ModelCase,
    plan: Plan,
    pin: bool,
    controller: str,
    queue: str,
    call_latency: CallLatency,
    raw_found: tuple[float, int, list[dict[str, Any]]],
) -> dict[str, Any]:
    import multiprocessing

    import urllib3

    from clipper.adapters.endpoints import HttpModelEndpoint

    started = time.monotonic()
    model_path, rows = model_inputs(case.name)
    raw, raw_batch, raw_table = raw_found
    ctx = multiprocessing.get_context("spawn")
    commands_in, commands = ctx.Pipe(duplex=False)  # (read end, write end)
    data, data_out = ctx.Pipe(duplex=False)
    generator = ctx.Process(target=generator_main, args=(commands_in, data_out, rows, case.name, pin), daemon=True)
    generator.start()
    try:
        with endpoint_server(model_path, pin) as url:
            pool = urllib3.PoolManager(maxsize=2)
            h = Harness(
                case,
                plan,
                commands=commands,
                data=data,
                url=url,
                pool=pool,
                controller=controller,
                queue=queue,
                call_latency=call_latency,
            )
            warm = HttpModelEndpoint(url, h.pool, timeout_s=30.0)
            for n in (1, 8, 64, 1, 1):  # the HTTP connection, and the session's first runs of each size
                warm.predict(np.resize(rows, (n, *rows.shape[1:])))
            results = {}
            for mode in ("adaptive", "unbatched"):
                log(f"{case.name}, queue {queue}: searching the highest sustained rate, {mode} ({HARNESS})")
                results[mode] = search(h, mode)
    finally:
        with contextlib.suppress(OSError):
            commands.send(("stop",))
        generator.join(3)
        if generator.is_alive():
            generator.terminate()
            generator.join(3)
    (rate_a, at_a, ladder_a), (rate_u, _, ladder_u) = results["adaptive"], results["unbatched"]
    at_a = at_a or {}
    ratio_unbatched = rate_a / rate_u if rate_u else None
    ratio_raw = rate_a / raw if raw else None
    if case.name == "mlp":
        met = bool(ratio_unbatched is not None and ratio_unbatched >= 10 and at_a.get("ok"))
    else:
        met = bool(ratio_raw is not None and ratio_raw >= 0.8 and at_a.get("ok"))
    result = {
        "model": case.name,
        "harness": HARNESS,
        "queue": queue,
        "queue_is": QUEUES[queue] + (f"; latency per call {call_latency.describe()}" if queue == "sqs-limits" else ""),
        "slo_ms": case.slo_ms,
        "throughput_adaptive": round(rate_a, 1),
        "throughput_unbatched": round(rate_u, 1),
        "throughput_raw_limit": round(raw, 1),
        "p50_ms_adaptive": at_a.get("p50_ms"),
        "p99_ms_adaptive": at_a.get("p99_ms"),
        "within_slo_fraction": at_a.get("within_slo_fraction"),
        "mean_batch_size": at_a.get("mean_batch_size"),
        "target": case.target,
        "target_met": met,
        "adaptive_over_unbatched": round(ratio_unbatched, 2) if ratio_unbatched else None,
        "adaptive_over_raw_limit": round(ratio_raw, 3) if ratio_raw else None,
        "raw_limit_batch": raw_batch,
        "unbatched_at_max": results["unbatched"][1],
        "adaptive_at_max": results["adaptive"][1],
        "ladder_adaptive": ladder_a,
        "ladder_unbatched": ladder_u,
        "raw": raw_table,
        "model_path": str(model_path.relative_to(ROOT)),
        "seconds": round(time.monotonic() - started, 1),
    }
    at_max = (
        f"p50 {result['p50_ms_adaptive']} ms, p99 {result['p99_ms_adaptive']} ms, within SLO "
        f"{result['within_slo_fraction']}, mean batch {result['mean_batch_size']}"
        if rate_a
        else "no rate of the ladder sustained"
    )
    log(
        f"{case.name}, queue {queue}: adaptive {rate_a:.0f} q/s ({at_max}), unbatched {rate_u:.0f} q/s, raw limit "
        f"{raw:.0f} rows/s (batch {raw_batch}); target {case.target}: {'met' if met else 'missed'}"
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (under a minute)")
    parser.add_argument("--models", default="mlp,cnn", help=f"comma-separated, of {sorted(CASES)}")
    parser.add_argument("--queues", default=",".join(QUEUES), help=f"what replaces SQS, of {list(QUEUES)}")
    parser.add_argument(
        "--sqs-call-ms",
        default=DEFAULT_SQS_CALL_MS,
        help="the sqs-limits queue's latency per call: MEDIAN,P99 of a log-normal, in ms (default %(default)s)",
    )
    parser.add_argument(
        "--controller",
        choices=["aimd", "quantile"],
        default="aimd",
        help="the adaptive batch-size controller (default: aimd, Clipper's); a fresh one for every trial",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        parser.error(f"unknown models {unknown}; choose from {sorted(CASES)}")
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    if not queues or any(q not in QUEUES for q in queues):
        parser.error(f"queues of {list(QUEUES)}")
    try:
        call_latency = CallLatency.parse(args.sqs_call_ms)
    except ValueError as e:
        parser.error(f"--sqs-call-ms: {e}")
    plan = QUICK if args.quick else FULL

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupted)
    pin = can_pin()
    if pin:
        pin_process(SUT_CORE)
    else:
        log("warning: fewer than 2 cores or no taskset: nothing is pinned, figures are not comparable")
    started = time.monotonic()
    meta = {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "pinned": pin,
        "loadavg": " ".join(f"{v:.2f}" for v in os.getloadavg()),
        "onnxruntime": _version("onnxruntime"),
        "quick": args.quick,
        "harness": HARNESS,
        "queues": queues,
        "sqs_call_latency": call_latency.describe(),
        "controller": args.controller,
        **{k: getattr(plan, k) for k in ("warmup_s", "refine_steps", "min_trial_s", "max_trial_s")},
    }
    log(f"harness: {HARNESS}; queues: " + "; ".join(f"{q}: {QUEUES[q]}" for q in queues))
    try:
        results = []
        for name in names:
            case = CASES[name]
            model_path, rows = model_inputs(name)
            log(f"{name}: SLO {case.slo_ms:g} ms; raw ONNX Runtime limit (in process, one thread, core {SUT_CORE})")
            raw_found = raw_limit(model_path, rows, case.slo_ms, plan.raw_budget_s)
            for queue in queues:
                results.append(bench_model(case, plan, pin, args.controller, queue, call_latency, raw_found))
    except KeyboardInterrupt:
        log("interrupted: every process this benchmark started is stopped; nothing written")
        return 130
    meta["seconds"] = round(time.monotonic() - started, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "batching_quick" if args.quick else "batching"
    out = RESULTS / f"{stem}.json"
    out.write_text(json.dumps([{**r, "run": meta} for r in results], indent=2) + "\n")
    plot(results, RESULTS / f"{stem}.png")
    log(f"wrote {out.relative_to(ROOT)} and {stem}.png in {meta['seconds']:.0f} s")
    if args.quick:
        log("--quick: trials of about a second, too short for a backlog to build; a smoke test, not figures")
    if not args.quick:
        runs = record_run(results, args.controller, call_latency.describe())
        update_readme(readme_section(results, meta, runs))
        log(f"updated the ## Batching section of {README.relative_to(ROOT)}")
    return 0


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


if __name__ == "__main__":
    sys.exit(main())
