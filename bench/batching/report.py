"""The benchmark's outputs: the plot and the Markdown section of bench/README.md (the history of runs is
``history``'s)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from bench.batching.config import GENERATOR_CORE, HARNESS, QUEUES, README, SUT_CORE, WITHIN_SLO_REQUIRED
from bench.batching.history import result_key, spread_text

SECTION = "## Batching"  # the README section this benchmark rewrites (its heading starts with this)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, len(results), figsize=(6.5 * len(results), 9), squeeze=False)
    for col, r in enumerate(results):
        a = ax[0, col]
        labels = ["adaptive", "batch size 1", "raw ORT limit"]
        values = [r["throughput_adaptive"], r["throughput_unbatched"], r["throughput_raw_limit"]]
        colors = ["C0", "C1", "C2"]
        bars = a.bar(labels, values, color=colors)
        for bar, v in zip(bars, values, strict=True):
            a.annotate(f"{v:,.0f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=9)
        if max(values) > 20 * max(min(values), 1):
            a.set_yscale("log")
        a.set(ylabel="queries/s (rows/s)", title=f"{result_key(r)}: highest sustained rate, SLO {r['slo_ms']:g} ms")
        a = ax[1, col]
        ceiling = 10 * r["slo_ms"]
        for mode, color in (("adaptive", "C0"), ("unbatched", "C1")):
            ladder = sorted(r[f"ladder_{mode}"], key=lambda t: t["rate"])
            xs = [t["rate"] for t in ladder]
            ys = [min(ceiling, t["p99_ms"]) if t["p99_ms"] is not None else ceiling for t in ladder]
            a.plot(xs, ys, "o-", color=color, label=f"{mode} p99")
            a.plot(xs, [min(ceiling, t["p50_ms"]) for t in ladder], "x:", color=color, label=f"{mode} p50")
        a.axhline(r["slo_ms"], color="k", linestyle="--", linewidth=1, label="SLO")
        a.set_xscale("log")
        a.set_yscale("log")
        a.set(
            xlabel="offered rate (queries/s, Poisson)",
            ylabel=f"latency (ms, log; {ceiling:g} = more than 1 % unanswered)",
            title=f"{result_key(r)}: latency vs offered rate (every trial)",
        )
        a.legend(fontsize=8)
    fig.suptitle(f"harness: {HARNESS} (queue: the name in brackets, else an in-memory pipe)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _para(text: str) -> list[str]:
    return [*textwrap.wrap(" ".join(text.split()), 110, break_on_hyphens=False), ""]


def readme_section(results: list[dict[str, Any]], meta: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    lines = [
        f"{SECTION} (harness: {HARNESS})",
        "",
        "```bash",
        "make bench-batching        # BENCH_ARGS=--quick: a smoke run (writes batching_quick.*)",
        "make bench-batching BENCH_ARGS='--queues pipe'          # the in-memory pipe only",
        "make bench-batching BENCH_ARGS='--sqs-call-ms 10,30'    # SQS's limits with another latency per call",
        "```",
        "",
    ]
    lines += _para(
        f"""**What this measures: a part of the system, not what a user meets.** The batcher core and the
        endpoint, with the model's queue replaced and no frontend (no HTTP front door, no cache, no reply
        channel: replies are recorded in memory). The whole stack at its front door is `make bench-frontdoor`'s
        (the section before). Two queues stand in for SQS, side by side: {
            "; ".join(f"`{q}`, {QUEUES[q]}" for q in meta["queues"])
        }; the latency per call of the queue with SQS's limits is {meta["sqs_call_latency"]}
        (`--sqs-call-ms MEDIAN,P99`), slept in the driver's thread as a network round trip would be."""
    )
    lines += _para(
        f"""It drives the batcher core (`Batcher` run by `LongPollDriver`) and the real endpoint server
        (`python -m clipper_endpoint`, one ONNX Runtime thread) with open-loop Poisson arrivals, and searches
        for each model and queue the highest rate that is *sustained*: p99 latency within the SLO and at least
        {WITHIN_SLO_REQUIRED:.0%} of the queries answered within it, counted after a {meta["warmup_s"]:g} s
        warm-up. Latency runs from each query's scheduled arrival to the publication of its reply; queries
        dropped as expired, or not answered, count as outside the SLO. The search doubles the rate until a
        trial fails, then bisects ({meta["refine_steps"]} steps); a trial lasts {meta["min_trial_s"]:g} to
        {meta["max_trial_s"]:g} s (at least ~1,000 queries where that fits). Each rate is tried once: a near
        miss is a miss."""
    )
    lines += _para(
        f"""Adaptive batching is {CONTROLLER_TEXT[meta["controller"]]}, a fresh controller for every trial,
        with the default 1 ms batch wait and deadline-aware cutting (the long-poll driver's defaults); batch
        size 1 is `FixedController(1)`. The raw ONNX Runtime
        limit calls the same model in process, one intra-op thread, with fixed batches of 1 to 256 rows; it is
        the best rows/s among the batch sizes whose p99 call latency is within the SLO. Every query holds one
        row, so queries/s and rows/s are the same unit."""
    )
    lines += [
        "| core | what runs there |",
        "| --- | --- |",
        f"| {GENERATOR_CORE} | the load generator (its own process): Poisson arrival times; each query encoded as "
        "the frontend encodes it (`encode_rows` + `QueryMessage.to_json`) at its arrival, then sent through a pipe |",
        f"| {SUT_CORE} | the system under test: the driver thread (it reads the pipe inside `QueueReader.receive`, "
        "as it reads SQS in production, runs the `Batcher`, calls the endpoint over HTTP with `.npy` batches, "
        "publishes one reply per query to an in-memory `ReplyChannel` that records the time); the endpoint "
        f"server (`taskset -c {SUT_CORE}`); and, between trials, the raw ONNX Runtime measurement |",
        "",
    ]
    if not meta["pinned"]:
        lines += _para("**This run was not pinned** (fewer than 2 cores, or no `taskset`).")
    lines += [
        "| model | queue | SLO | adaptive q/s | batch size 1 q/s | raw ORT limit rows/s (batch) | adaptive p50 / p99 "
        "| within SLO | mean batch | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r.get('queue', 'pipe')} | {r['slo_ms']:g} ms "
            f"| {r['throughput_adaptive']:,.0f} | {r['throughput_unbatched']:,.0f} "
            f"| {r['throughput_raw_limit']:,.0f} ({r['raw_limit_batch']}) | {_num(r['p50_ms_adaptive'])} / "
            f"{_num(r['p99_ms_adaptive'])} ms | {_pct(r['within_slo_fraction'])} | {_num(r['mean_batch_size'])} "
            f"| {r['target']} | {'yes' if r['target_met'] else '**no**'} |"
        )
    lines += [""]
    spread = spread_text(results, runs)
    lines += _para(spread) if spread else []
    lines += ["![batching benchmark](results/batching.png)", "", "Reading the figures:", ""]
    lines += findings(results)
    lines += _para(WHERE_THE_TIME_GOES)
    if any(r["model"] == "cnn" and r.get("queue", "pipe") == "pipe" and not r["target_met"] for r in results):
        lines += _para(WHY_THE_CNN_MISSES)
    if any(r.get("queue") == "sqs-limits" for r in results):
        lines += _para(WITH_SQS_LIMITS)
    lines += _para(
        f"""Run on {meta["machine"]}, {meta["cpus"]} cores, ONNX Runtime {meta["onnxruntime"]}, load average
        {meta["loadavg"]} at the start, {meta["seconds"]:.0f} s in all. `bench/results/batching.json` holds,
        per model, the fields above and every trial of each search (rate, p50/p99, within-SLO fraction,
        expired queries, mean and largest batch, endpoint call time, the batcher's time per message, the
        generator's lateness), and the raw table."""
    )
    return "\n".join(lines)


# Mechanisms behind the figures, measured on this kind of machine with cProfile on the driver thread and with
# micro-benchmarks (they do not change from run to run the way the rates do).
WHERE_THE_TIME_GOES = """**Where the time goes.**
    An endpoint call is one request on a kept-alive connection, written with one `sendall`
    (`KeepAliveHttp`): with the batcher and the MLP server on one core, ~340 us for 16 rows against ~770 us
    through urllib3, which writes the headers and the body apart (each write wakes the server) and adds
    Python of its own; ONNX Runtime itself needs 0.05-0.3 ms for the MLP. So batch size 1 pays about half a
    millisecond of the shared core a query, and adaptive batching shares the call and is then bound by the
    per-message Python: the message (`QueryMessage.from_json`, ~6 us), its `.npy` payload (base64 and
    `np.frombuffer`; the header is parsed once per distinct header), the expiry and duplicate checks (before
    any payload decoding, so shedding expired queries in an overload is cheap; one `answered_many` call a
    batch) and the `Reply` (one `publish_many` call a group: with Redis two pipelined round trips a batch
    instead of two a message). In process, with a fake endpoint and 32 MLP messages a batch, that is 15-18 us
    a message against 31-50 us before these changes (alternated runs on the shared machine). The controller
    does not decide these figures: a batch is whatever queued while the endpoint was busy, and at the
    sustained rates the AIMD limit ends just above the largest batch seen (`controller_limit_end` in the
    JSON)."""
WHY_THE_CNN_MISSES = """**Why the CNN misses.**
    On a CPU, ONNX Runtime gains little from batching this model (tens of percent from batch 1 to batch
    4-8), and serving adds the HTTP call and the batcher's per-row work (base64 and `.npy` decode of a
    12 KB row, ~70-90 us) on the same core; a `perf` profile of the endpoint server during batches of 2
    shows ~94 % of its time inside ONNX Runtime, so the server itself adds little. The driver sends whatever
    is queued as soon as the endpoint is free: with the endpoint and the batcher on one core, waiting for a
    batch to fill would leave the endpoint idle while work is queued, so a wait pays only where the model
    runs on its own device. Batches grow under a backlog, and a batch of ~50 ms (one running, one waiting)
    already fills a 100 ms SLO; so the long-poll driver cuts each batch, earliest deadline first, to the
    rows whose predicted latency (a line fitted to the model's recent batches) still lets its earliest query
    meet its deadline, and leads the next batch with the rest. Reaching 0.8x of the raw limit with p99
    within the SLO needs ~90 % utilisation with batches of 4-6 rows, which leaves Poisson arrivals little
    room."""


WITH_SQS_LIMITS = """**With SQS's limits.**
    A receive hands the driver at most 10 messages and every call is a round trip it waits for: the receive
    that starts a batch, each further receive that fills it (the driver receives again while messages come,
    up to the batch wait), and after the batch one delete per 10 messages. Unless receives run ahead of the
    batcher and acknowledgements leave the critical path, each batch pays those round trips in its latency,
    and the endpoint idles while they run. `queue_calls` and `queue_call_ms_mean` in each trial of the JSON
    count them."""


CONTROLLER_TEXT = {
    "aimd": "Clipper's AIMD (`AimdController` with the SLO as its latency objective, up to 256 rows)",
    "quantile": "the quantile-regression controller (`QuantileController` with the SLO, up to 256 rows)",
}


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:g}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def findings(results: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for r in results:
        at = r.get("adaptive_at_max") or {}
        un = r.get("unbatched_at_max") or {}
        raw_ms_per_row = 1000 / r["throughput_raw_limit"] if r["throughput_raw_limit"] else None
        every = r["ladder_adaptive"] + r["ladder_unbatched"]
        top: dict[str, Any] = max(
            (t for t in r["ladder_adaptive"] if t["served_ms_per_message"]), key=lambda t: t["rate"], default={}
        )
        if not r["throughput_adaptive"]:
            text = f"""**{result_key(r)}** (SLO {r["slo_ms"]:g} ms; target: {r["target"]}: {
                "met" if r["target_met"] else "missed"
            }). Adaptive batching sustains no rate of the ladder (each trial failed); batch size 1 sustains
                {r["throughput_unbatched"]:,.0f} q/s and the raw limit is {r["throughput_raw_limit"]:,.0f} rows/s
                at batch {r["raw_limit_batch"]}. Queries expired across all {len(every)} trials:
                {sum(t["expired"] for t in every):,}."""
            out += _para(text)
            continue
        text = f"""**{result_key(r)}** (SLO {r["slo_ms"]:g} ms; target: {r["target"]}: {
            "met" if r["target_met"] else "missed"
        }). Adaptive batching sustains {r["throughput_adaptive"]:,.0f} q/s,
            {_ratio(r["adaptive_over_unbatched"])} batch size 1 ({r["throughput_unbatched"]:,.0f} q/s) and
            {_ratio(r["adaptive_over_raw_limit"])} the raw limit ({r["throughput_raw_limit"]:,.0f} rows/s at batch
            {r["raw_limit_batch"]}). At its highest sustained rate the mean batch is {_num(at.get("mean_batch_size"))}
            rows, an endpoint call takes {_num(at.get("endpoint_call_ms_mean"))} ms over HTTP, and the batcher spends
            {_num(at.get("batcher_us_per_message"))} us a message besides (decode, expiry and duplicate checks,
            replies): {_num(at.get("served_ms_per_message"))} ms of the driver's time a query, against
            {_num(raw_ms_per_row)} ms a row for the raw session at its best batch. Unbatched, a call takes
            {_num(un.get("endpoint_call_ms_mean"))} ms and the batcher {_num(un.get("batcher_us_per_message"))} us a
            message. In the most loaded adaptive trial ({top.get("rate", 0):,.0f} q/s, mean batch
            {_num(top.get("mean_batch_size"))}) the driver needs {_num(top.get("served_ms_per_message"))} ms a query,
            so the core saturates near {1000 / top["served_ms_per_message"] if top else 0:,.0f} q/s. Queries
            expired across all {len(every)} trials: {sum(t["expired"] for t in every):,}."""
        out += _para(text)
    return out


def update_readme(section: str) -> None:
    """Replace (or append) the ``## Batching...`` section of bench/README.md, leaving every other section alone."""
    text = README.read_text() if README.exists() else "# Benchmarks\n"
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith(SECTION)), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        head = "\n".join(lines[:start]).rstrip("\n")
        tail = "\n".join(lines[end:])
        new = head + "\n\n" + section.rstrip("\n") + "\n" + ("\n" + tail.rstrip("\n") + "\n" if tail else "")
    README.write_text(new)
