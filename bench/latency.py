"""`make bench-latency`: where a query's time goes, stage by stage, on the local stack.

It starts the local stack (``infra/local/run.py`` on a free port, in its own process group), sends
``POST /digits/predict?debug=true`` queries (the ``digits`` application: one model, the MLP, SLO 500 ms)
with open-loop Poisson arrivals at a light and at a heavy rate, and collects from every answer the
per-stage timings the frontend and the batcher report (``debug.timings_ms``) plus the time the client
measured. Every query carries a new input, so none is a prediction-cache hit.

Stages as the frontend reports them (``debug.timings_ms``): ``validate``, ``select``, ``cache`` (lookup),
``enqueue`` (encode + SQS SendMessage), ``wait`` (until every reply arrived), ``combine`` (the policy's
combination, confidence, default output); and for each model (``debug.model_timings_ms.<model>``): ``send``
(its SendMessage), ``queue`` (from the end of the send to the start of its batch: SQS, the long-poll
receive, and the batch's fill unless the batcher reports it apart), ``batch_wait`` (when it does),
``inference`` (the endpoint call: HTTP + ONNX Runtime), ``batch_size`` and ``reply`` (from the end of the
inference to the frontend holding the reply: publication and pick-up). For the stacked bars they are cut
into parts that do not overlap and add up to the time the client measured:

    frontend   validate + select + cache + enqueue
    queue      the model's queue
    batch wait the model's batch_wait (0 where the batcher does not report it: then inside queue)
    inference  the model's inference
    reply      the model's reply
    combine    combine (+ record, for learning policies)
    other      end-to-end - (frontend + wait + combine)   (HTTP, uvicorn, FastAPI, JSON)

The local stack runs moto, a test double much slower than the AWS services (SQS ~16 ms a call through its
server here), and everything shares two cores: the figures say what each hop costs *here*; the costs on
AWS are in docs/latency-on-aws.md.

Writes bench/results/latency.json (with the Markdown table) and latency.png. Ctrl-C stops the stack too.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
APP = "digits"
READY_LINE = "local stack ready"
START_TIMEOUT_S = 180
MODEL = "mlp"  # the digits application's model
QUERY_STAGES = ("validate", "select", "cache", "enqueue", "wait", "combine")
MODEL_STAGES = ("send", "queue", "batch_wait", "inference", "reply", "batch_size")
RAW_STAGES = (*QUERY_STAGES, *(f"model_{s}" for s in MODEL_STAGES), "end_to_end")
PARTS = ("validate", "select", "cache", "enqueue", "queue", "batch_wait", "inference", "reply", "combine", "other")
PART_COLORS = {
    "validate": "#c6dbef",
    "select": "#9ecae1",
    "cache": "#6baed6",
    "enqueue": "#3182bd",
    "queue": "#fd8d3c",
    "batch_wait": "#fdd0a2",
    "inference": "#31a354",
    "reply": "#fdae6b",
    "combine": "#756bb1",
    "other": "#bdbdbd",
}


def log(msg: str) -> None:
    print(f"[bench-latency] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the local stack, as a user runs it --------------------------------------------------------------------
class Stack:
    """``infra/local/run.py`` in its own session (process group), stopped as Ctrl-C stops it."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []

    def start(self) -> None:
        # a state folder of its own, fresh: the benchmark neither reads nor changes a user's .local-stack
        state = ROOT / "build" / "bench-latency" / "state"
        cmd = [sys.executable, str(ROOT / "infra" / "local" / "run.py"), "--port", str(self.port)]
        cmd += ["--state-dir", str(state), "--fresh"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"the local stack exited while starting:\n{''.join(self.output[-30:])}")
            if READY_LINE in line:
                return
        raise TimeoutError(f"the local stack was not ready within {START_TIMEOUT_S} s")

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "w") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                self.output.append(line)
                self.lines.put(line)
        self.lines.put(None)

    @property
    def uses_redis(self) -> bool:
        return any("redis-server on" in line for line in self.output)

    def stop(self) -> list[int]:
        """SIGINT to the stack (as Ctrl-C), wait, then make sure no process of its session is left; returns the
        pids that had to be killed."""
        if self.proc is None:
            return []
        pgid = self.proc.pid  # the session leader's pid is the group id
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        killed = []
        end = time.monotonic() + 10
        while True:
            left = group_members(pgid)
            if not left:
                break
            if time.monotonic() > end:
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except ProcessLookupError:
                        pass
                time.sleep(0.5)
                break
            time.sleep(0.2)
        return killed


def group_members(sid: int) -> list[int]:
    """Live processes (not zombies) of session ``sid`` (the supervised children have process groups of their
    own inside the stack's session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


# -- the load ----------------------------------------------------------------------------------------------
class Client:
    """One keep-alive HTTP connection per worker thread; a query's end-to-end time runs from the start of
    its request to the end of its answer."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.local = threading.local()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        for attempt in (1, 2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


class Inputs:
    """Held-out digits rows, each made unique (so every query misses the prediction cache)."""

    def __init__(self) -> None:
        from infra.demo.train_models import ensure_models

        manifest = ensure_models(ROOT / "build" / "models", log=lambda line: None)
        self.rows = np.load(Path(manifest["out_dir"]) / manifest["dataset"]["holdout"])["X"].astype(float)
        self.n = 0
        self.lock = threading.Lock()

    def next(self) -> bytes:
        with self.lock:
            self.n += 1
            n = self.n
        row = self.rows[n % len(self.rows)].copy()
        row[0] = n / 1000  # pixel 0 is blank in every digit: a small value there keeps the input realistic
        return json.dumps({"input": [float(v) for v in row]}).encode()


def drive(client: Client, inputs: Inputs, rate: float, count: int, seed: int) -> list[dict[str, Any]]:
    """Open loop: Poisson arrivals at ``rate`` queries/s, ``count`` queries."""
    rng = np.random.default_rng(seed)
    start = time.perf_counter() + 0.2
    arrivals = start + np.cumsum(rng.exponential(1 / rate, count))
    path = f"/{APP}/predict?debug=true"

    halt = threading.Event()

    def one(at: float) -> dict[str, Any]:
        body = inputs.next()
        delay = at - time.perf_counter()
        if delay > 0 and halt.wait(delay):
            return {"error": "cancelled", "late_ms": 0.0}
        t0 = time.perf_counter()
        try:
            status, raw = client.post(path, body)
        except OSError as e:
            return {"error": f"{type(e).__name__}: {e}", "late_ms": (t0 - at) * 1000}
        e2e = (time.perf_counter() - t0) * 1000
        out: dict[str, Any] = {"status": status, "end_to_end": e2e, "late_ms": (t0 - at) * 1000}
        if status == 200:
            answer = json.loads(raw)
            out["default"] = bool(answer.get("default"))
            debug = answer.get("debug", {})
            out["timings"] = dict(debug.get("timings_ms", {}))
            for stage, value in debug.get("model_timings_ms", {}).get(MODEL, {}).items():
                out["timings"][f"model_{stage}"] = value
        return out

    workers = max(8, min(128, int(rate * 2)))
    pool = ThreadPoolExecutor(workers)
    try:
        return list(pool.map(one, arrivals))
    except BaseException:  # Ctrl-C: drop the queries not sent yet, so that the stack is stopped at once
        halt.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# -- the figures -------------------------------------------------------------------------------------------
def parts_of(q: dict[str, Any]) -> dict[str, float]:
    t = q["timings"]
    e2e = q["end_to_end"]
    front = t["validate"] + t["select"] + t["cache"] + t["enqueue"]
    combine = t.get("combine", 0.0) + t.get("record", 0.0)
    return {
        "validate": t["validate"],
        "select": t["select"],
        "cache": t["cache"],
        "enqueue": t["enqueue"],
        "queue": t["model_queue"],
        "batch_wait": t.get("model_batch_wait", 0.0),
        "inference": t["model_inference"],
        "reply": t["model_reply"],
        "combine": combine,
        "other": max(0.0, e2e - front - t["wait"] - combine),
    }


def summarise(name: str, rate: float, results: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    errors = [r for r in results if "error" in r or r.get("status") != 200]
    ok = [r for r in results if r.get("status") == 200]
    served = [r for r in ok if not r["default"] and "model_queue" in r["timings"]]
    out: dict[str, Any] = {
        "load": name,
        "rate_qps": rate,
        "queries": len(results),
        "answered_by_the_model": len(served),
        "default_outputs": len([r for r in ok if r["default"]]),
        "errors": len(errors),
        "achieved_qps": round(len(results) / seconds, 1),
        "client_late_p99_ms": round(float(np.percentile([r["late_ms"] for r in results], 99)), 1),
    }
    if errors:
        out["first_error"] = errors[0].get("error") or errors[0].get("status")
    if not served:
        return out
    stages: dict[str, dict[str, float]] = {}
    for stage in RAW_STAGES:
        values = [r["end_to_end"] if stage == "end_to_end" else r["timings"].get(stage) for r in served]
        values = [v for v in values if v is not None]
        if not values:  # e.g. model_batch_wait from a batcher that does not report it apart
            continue
        stages[stage] = {
            "p50": round(float(np.percentile(values, 50)), 2),
            "p99": round(float(np.percentile(values, 99)), 2),
        }
    parts = [parts_of(r) for r in served]
    out["stages_ms"] = stages
    out["parts_ms"] = {
        p: {
            "p50": round(float(np.percentile([x[p] for x in parts], 50)), 2),
            "p99": round(float(np.percentile([x[p] for x in parts], 99)), 2),
        }
        for p in PARTS
    }
    # where the slowest queries spend their time (the parts of one query add up to its end-to-end time,
    # unlike the per-stage p99s, whose tails come from different queries)
    slow = sorted(zip((r["end_to_end"] for r in served), parts, strict=True), key=lambda x: -x[0])
    slow = slow[: max(3, len(slow) // 50)]
    out["slowest_2pct"] = {
        "queries": len(slow),
        "end_to_end_mean_ms": round(float(np.mean([e for e, _ in slow])), 2),
        "parts_mean_ms": {p: round(float(np.mean([x[p] for _, x in slow])), 2) for p in PARTS},
    }
    out["end_to_end_all_answers_ms"] = {
        "p50": round(float(np.percentile([r["end_to_end"] for r in ok], 50)), 2),
        "p99": round(float(np.percentile([r["end_to_end"] for r in ok], 99)), 2),
    }
    return out


def markdown(loads: list[dict[str, Any]]) -> str:
    def row(label: str, key: str, table: str) -> str:
        cells = []
        for load in loads:
            s = load.get(table, {}).get(key)
            cells.append(f"{s['p50']:.2f} | {s['p99']:.2f}" if s else "- | -")
        return f"| {label} | " + " | ".join(cells) + " |"

    head = "| stage (ms) | " + " | ".join(f"{lo['load']} p50 | {lo['load']} p99" for lo in loads) + " |"
    lines = [head, "| --- |" + " --- | --- |" * len(loads)]
    labels = {
        "validate": "validate (frontend)",
        "select": "select (frontend)",
        "cache": "cache lookup (frontend)",
        "enqueue": "enqueue: encode + SQS send (frontend)",
        "wait": "wait for the reply (frontend)",
        "combine": "combine (frontend)",
        "model_send": "the model's SQS send (in enqueue)",
        "model_queue": "queue: after the send -> batch start",
        "model_batch_wait": "batch wait (batcher)",
        "model_inference": "inference: endpoint call (batcher)",
        "model_reply": "reply: publish -> picked up",
        "model_batch_size": "batch size (rows)",
        "end_to_end": "**end to end (client)**",
    }
    lines += [row(labels[s], s, "stages_ms") for s in RAW_STAGES if any(s in lo.get("stages_ms", {}) for lo in loads)]
    lines.append("| *parts that do not overlap:* |" + " |" * (2 * len(loads)))
    part_labels = {
        "queue": "queue after the send (SQS, receive, batch fill)",
        "batch_wait": "batch wait (when reported apart)",
        "inference": "inference (endpoint call)",
        "reply": "reply (publish, pick up)",
        "combine": "combine",
        "other": "other (HTTP, uvicorn, FastAPI, JSON)",
    }
    lines += [row(part_labels[p], p, "parts_ms") for p in part_labels]
    return "\n".join(lines)


def plot(loads: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = [lo for lo in loads if "parts_ms" in lo]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [2, 1]})

    def stack(ax: Any, i: int, parts: dict[str, float], e2e: float, first: bool) -> None:
        bottom = 0.0
        for part in PARTS:
            ax.bar(i, parts[part], 0.6, bottom=bottom, color=PART_COLORS[part], label=part if first else None)
            bottom += parts[part]
        ax.plot([i - 0.35, i + 0.35], [e2e, e2e], color="black", linewidth=2, label="end to end" if first else None)

    bars = [(lo, q) for lo in loads for q in ("p50", "p99")]
    for i, (lo, q) in enumerate(bars):
        stack(left, i, {p: lo["parts_ms"][p][q] for p in PARTS}, lo["stages_ms"]["end_to_end"][q], i == 0)
    left.set_xticks(range(len(bars)))
    left.set_xticklabels([f"{lo['load']}, {lo['rate_qps']:g} q/s\n{q} of each stage" for lo, q in bars])
    left.set_title("Each stage's p50 and p99, stacked (black: end-to-end p50 / p99)")
    for i, lo in enumerate(loads):
        tail = lo["slowest_2pct"]
        stack(right, i, tail["parts_mean_ms"], tail["end_to_end_mean_ms"], False)
    right.set_xticks(range(len(loads)))
    right.set_xticklabels(
        [f"{lo['load']}, {lo['rate_qps']:g} q/s\n{lo['slowest_2pct']['queries']} queries" for lo in loads]
    )
    right.set_title("The slowest 2 % of queries: mean time per part")
    for ax in (left, right):
        ax.set_ylabel("ms")
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    left.legend(handles[::-1], labels[::-1], loc="upper left", fontsize=8)
    fig.suptitle("Latency budget on the local stack (moto for AWS, 2 cores): frontend, queue, model, reply, other")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--light-rate", type=float, default=5.0, help="queries/s of the light load (default 5)")
    p.add_argument("--light-queries", type=int, default=150)
    p.add_argument("--heavy-rate", type=float, default=30.0, help="queries/s of the heavy load (default 30)")
    p.add_argument("--heavy-queries", type=int, default=600)
    p.add_argument("--warmup", type=int, default=20, help="sequential queries before measuring (not counted)")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for latency.json and latency.png")
    args = p.parse_args()
    started = time.monotonic()
    inputs = Inputs()
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="latency-"))  # the stack's output; removed after a clean run
    stack = Stack(port, tmp / "local-stack.log")
    loads: list[dict[str, Any]] = []
    killed: list[int] = []
    try:
        log(f"starting the local stack on port {port} (log: {stack.log_path})")
        stack.start()
        log(
            f"local stack ready in {time.monotonic() - started:.0f} s; reply channel: "
            f"{'Redis' if stack.uses_redis else 'DynamoDB'}"
        )
        client = Client(port)
        for _ in range(args.warmup):
            client.post(f"/{APP}/predict", inputs.next())
        for name, rate, count, seed in (
            ("light", args.light_rate, args.light_queries, 1),
            ("heavy", args.heavy_rate, args.heavy_queries, 2),
        ):
            log(f"{name} load: {count} queries at {rate:g} q/s (open loop, Poisson arrivals)")
            t0 = time.perf_counter()
            results = drive(client, inputs, rate, count, seed)
            summary = summarise(name, rate, results, time.perf_counter() - t0)
            loads.append(summary)
            e2e = summary.get("stages_ms", {}).get("end_to_end", {})
            log(
                f"  {summary['answered_by_the_model']} answered by the model, {summary['default_outputs']} default, "
                f"{summary['errors']} errors; end to end p50 {e2e.get('p50', float('nan')):.1f} ms, "
                f"p99 {e2e.get('p99', float('nan')):.1f} ms"
            )
    finally:
        log("stopping the local stack (SIGINT to its process group)")
        killed = stack.stop()
        left = group_members(stack.proc.pid) if stack.proc else []
        log(f"stopped; processes left: {len(left)}{f' (killed {killed})' if killed else ''}")
    shutil.rmtree(tmp, ignore_errors=True)
    table = markdown(loads)
    result = {
        "app": APP,
        "slo_ms": 500,
        "reply_channel": "redis" if stack.uses_redis else "dynamodb",
        "where": "local stack (moto server for AWS, redis-server, ONNX endpoint + long-poll batcher per model, "
        "uvicorn frontend), all on one 2-core machine",
        "loads": loads,
        "table_markdown": table,
        "notes": [
            "batch wait: reported apart only when the batcher reports batch_wait_ms; otherwise inside queue",
            "reply: derived by the frontend as the time from its send to holding the reply, less queue, batch "
            "wait and inference (with several models it includes the wait for the slower models' replies)",
            "inference: the endpoint call (HTTP + decode + ONNX Runtime); the model alone is not reported",
        ],
        "processes_killed_at_stop": killed,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latency.json").write_text(json.dumps(result, indent=2) + "\n")
    if any("parts_ms" in lo for lo in loads):
        plot(loads, args.out / "latency.png")
    print()
    print(table)
    print()
    log(f"wrote {args.out / 'latency.json'} and latency.png in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
