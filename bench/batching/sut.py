"""The system under test: the endpoint server process, one trial at a fixed arrival rate through the
batcher, and the search for the highest sustained rate."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from bench.batching.config import (
    BATCH_WAIT_S,
    ENDPOINT_PATH,
    MAX_BATCH,
    MAX_QUERIES_PER_TRIAL,
    RATE_CAP,
    SEED,
    SUT_CORE,
    WITHIN_SLO_REQUIRED,
    ModelCase,
    Plan,
    log,
)
from bench.batching.load import settle_gc
from bench.batching.ports import PipeQueue, RecordingReplies, TimedDriver, TimedEndpoint
from bench.batching.sqs_limits import CallLatency, SqsLimitedQueue
from clipper.batching.controller import BatchSizeController, FixedController, make_controller
from clipper.batching.core import Batcher


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def endpoint_server(model_path: Path, pin: bool) -> Iterator[str]:
    """Start ``python -m clipper_endpoint`` (one ORT thread, pinned to the SUT core); yield its URL; stop it."""
    port = free_port()
    command = [sys.executable, "-m", "clipper_endpoint", "--model-path", str(model_path), "--port", str(port)]
    command += ["--host", "127.0.0.1", "--threads", "1", "--log-level", "warning"]
    if pin:
        command = ["taskset", "-c", str(SUT_CORE), *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ENDPOINT_PATH), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(proc, url, errors)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, errors: Any) -> None:
    import urllib3

    pool = urllib3.PoolManager()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            errors.seek(0)
            tail = errors.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"endpoint server exited with status {proc.returncode}:\n{tail}")
        with contextlib.suppress(urllib3.exceptions.HTTPError):
            if pool.request("GET", url + "/ping", timeout=1.0, retries=False).status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("endpoint server did not answer /ping within 60 s")


@dataclass
class Harness:
    """What lives for one model: the generator's pipes, the endpoint URL and its HTTP pool."""

    case: ModelCase
    plan: Plan
    commands: Connection
    data: Connection
    url: str
    pool: Any
    controller: str = "aimd"  # the adaptive controller (make_controller's kind)
    queue: str = "pipe"  # what replaces SQS: "pipe" or "sqs-limits" (config.QUEUES)
    call_latency: CallLatency | None = None  # the sqs-limits queue's latency per call
    next_id: int = 1
    trials: int = 0


def run_trial(h: Harness, mode: str, rate: float) -> dict[str, Any]:
    from clipper.adapters.clock import SystemClock
    from clipper.adapters.endpoints import HttpModelEndpoint

    plan, slo_s = h.plan, h.case.slo_ms / 1000
    duration = plan.warmup_s + min(plan.max_trial_s, max(plan.min_trial_s, plan.queries_per_trial / rate))
    count = min(MAX_QUERIES_PER_TRIAL, int(rate * duration * 1.3) + 50)
    first_id = h.next_id
    h.next_id += count
    h.trials += 1
    reader = (
        SqsLimitedQueue(h.data, first_id, h.call_latency or CallLatency(0, 0), SEED + h.trials)
        if h.queue == "sqs-limits"
        else PipeQueue(h.data, first_id)
    )
    replies = RecordingReplies()
    endpoint = TimedEndpoint(HttpModelEndpoint(h.url, h.pool, timeout_s=10.0))
    batcher = Batcher(endpoints=endpoint, replies=replies, clock=SystemClock())
    controller: BatchSizeController = (
        make_controller(h.controller, slo_s, 0, MAX_BATCH) if mode.startswith("adaptive") else FixedController(1)
    )
    # the pipe hands out a whole batch per receive (like Redis Streams) to one receiver ahead of the batches: the
    # batcher process on Redis Streams receives on its batching thread instead (--receivers 0), dating the batch
    # wait by the stream's entry ids, which the pipe's messages do not carry; a queue with SQS's limits gets at
    # most 10 per receive, so four receives run ahead (the SQS default, as the batcher process runs on SQS)
    sqs_like = h.queue == "sqs-limits"
    driver = TimedDriver(
        reader,
        batcher,
        controller,
        batch_wait_s=BATCH_WAIT_S,
        receivers=4 if sqs_like else 1,
        receive_max=10 if sqs_like else None,
    )
    settle_gc()
    stop = threading.Event()
    worker = threading.Thread(target=driver.run, args=(stop,), name=f"driver-{mode}", daemon=True)
    started = time.monotonic()
    worker.start()
    try:
        h.commands.send(("run", first_id, rate, duration, count, h.case.slo_ms, SEED + h.trials))
        reader.ended.wait(duration + 10 * slo_s + 10)
        # Drain: whatever is still queued is answered or dropped as expired; give up two SLOs after the end.
        give_up = time.monotonic() + 2 * slo_s + 0.5
        while reader.ended.is_set() and time.monotonic() < give_up:
            s = driver.stats
            if s.answered + s.expired + s.duplicates + s.failed >= reader.received and reader.pending() == 0:
                break
            time.sleep(0.005)
    finally:
        stop.set()
        reader.close()
        worker.join(10)
    if not reader.ended.is_set():  # the driver fell far behind: read the rest of the trial here
        give_up = time.monotonic() + 60
        while not reader.ended.is_set() and time.monotonic() < give_up:
            reader.pull(0.1)
    if not reader.ended.is_set():
        raise RuntimeError("the load generator did not finish its trial")
    _, _, arrivals, lateness = reader.end
    elapsed = time.monotonic() - started
    result = summarize(h, mode, rate, arrivals, lateness, first_id, replies, endpoint, driver, elapsed)
    result["controller_limit_end"] = controller.max_batch_size()
    result["queue"] = h.queue
    if isinstance(reader, SqsLimitedQueue):
        result["queue_calls"] = reader.calls
        result["queue_call_ms_mean"] = round(1000 * reader.call_s / reader.calls, 3) if reader.calls else None
        handled = driver.stats.answered + driver.stats.expired + driver.stats.duplicates + driver.stats.failed
        result["ack_ms_per_message"] = round(1000 * reader.ack_s / handled, 3) if handled else None
    return result


def nearest_rank(sorted_values: np.ndarray, q: float) -> float:
    if len(sorted_values) == 0:
        return math.inf
    return float(sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)])


def summarize(
    h: Harness,
    mode: str,
    rate: float,
    arrivals: np.ndarray,
    lateness: np.ndarray,
    first_id: int,
    replies: RecordingReplies,
    endpoint: TimedEndpoint,
    driver: TimedDriver,
    elapsed: float,
) -> dict[str, Any]:
    slo_ms = h.case.slo_ms
    done = np.array([replies.done_at.get(str(first_id + k), math.inf) for k in range(len(arrivals))])
    latency_ms = (done - arrivals) * 1000
    measured = arrivals >= arrivals[0] + h.plan.warmup_s if len(arrivals) else np.zeros(0, bool)
    lat = np.sort(latency_ms[measured])
    window_s = float(arrivals[measured][-1] - arrivals[measured][0]) if measured.sum() > 1 else 0.0
    within = float(np.mean(lat <= slo_ms)) if len(lat) else 0.0
    p99 = nearest_rank(lat, 0.99)
    calls = [c for c in endpoint.calls if measured.any() and c[0] >= arrivals[measured][0]]
    rows = sum(c[1] for c in calls)
    s = driver.stats
    handled = s.answered + s.expired + s.duplicates + s.failed
    late_p99 = nearest_rank(np.sort(lateness), 0.99) * 1000
    # Informational: latency counts from the scheduled arrival, so a late generator only makes a trial harder.
    generator_late = late_p99 > 0.1 * slo_ms
    result: dict[str, Any] = {
        "mode": mode,
        "rate": round(rate, 1),
        "queries": int(measured.sum()),
        "achieved_rate": round(float(np.sum(lat <= slo_ms)) / window_s, 1) if window_s else 0.0,
        "p50_ms": round(nearest_rank(lat, 0.5), 3),
        "p99_ms": round(p99, 3) if math.isfinite(p99) else None,
        "within_slo_fraction": round(within, 5),
        "ok": bool(p99 <= slo_ms and within >= WITHIN_SLO_REQUIRED),
        "mean_batch_size": round(rows / len(calls), 2) if calls else 0.0,
        "max_batch_size": max((c[1] for c in calls), default=0),
        "endpoint_call_ms_mean": round(1000 * sum(c[2] for c in calls) / len(calls), 3) if calls else None,
        "expired": s.expired,
        "unanswered": int(np.sum(~np.isfinite(done))),
        "errors": replies.errors,
        "generator_late_ms_p99": round(late_p99, 3),
        "generator_late": generator_late,
        "driver_busy_fraction": round(driver.busy_s / elapsed, 3),
        # Batcher time per message outside the endpoint call: decode, expiry and duplicate checks, replies. The
        # queue's acknowledgements are the acker thread's, off the driver's time (ack_ms_per_message says them).
        "batcher_us_per_message": round(1e6 * (driver.busy_s - sum(c[2] for c in endpoint.calls)) / handled, 1)
        if handled
        else None,
        # Driver time (batcher + endpoint call) per message: 1000 / this is the rate at 100 % busy.
        "served_ms_per_message": round(1000 * driver.busy_s / handled, 3) if handled else None,
    }
    flag = "ok  " if result["ok"] else "FAIL"
    log(
        f"  {h.case.name} {h.queue} {mode:>9} {rate:8.0f} q/s: {flag} p50 {result['p50_ms']:7.2f} ms, "
        f"p99 {_ms(result['p99_ms'])}, within SLO {within:7.2%}, mean batch {result['mean_batch_size']:6.1f}, "
        f"batcher {result['batcher_us_per_message']} us/msg, driver busy {result['driver_busy_fraction']:.0%}"
        + (f" (generator p99 {late_p99:.1f} ms late)" if generator_late else "")
    )
    return result


def _ms(value: float | None) -> str:
    return f"{value:8.2f} ms" if value is not None else "     inf   "


def search(
    h: Harness, mode: str, run: Callable[[Harness, str, float], dict[str, Any]] = run_trial
) -> tuple[float, dict[str, Any] | None, list[dict[str, Any]]]:
    """The highest sustained rate: double from the start rate until a trial fails, then bisect. Each rate is
    tried once: a near miss is a miss."""
    ladder: list[dict[str, Any]] = []

    def attempt(rate: float) -> dict[str, Any]:
        trial = run(h, mode, rate)
        ladder.append(trial)
        return trial

    best: dict[str, Any] | None = None
    rate = h.case.start_rate * h.plan.start_factor
    lo, hi = 0.0, math.inf
    for _ in range(4):  # the start rate is too high: halve (a few times at most)
        trial = attempt(rate)
        if trial["ok"]:
            lo, best = rate, trial
            break
        hi, rate = rate, rate / 2
    while best is not None and math.isinf(hi) and rate < RATE_CAP:
        rate *= 2
        trial = attempt(rate)
        if trial["ok"]:
            lo, best = rate, trial
        else:
            hi = rate
    if best is not None and not math.isinf(hi):
        for _ in range(h.plan.refine_steps):
            rate = (lo + hi) / 2
            trial = attempt(rate)
            if trial["ok"]:
                lo, best = rate, trial
            else:
                hi = rate
    return lo, best, ladder
