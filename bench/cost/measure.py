"""The figures the cost model needs, measured on the running local stack and beside it.

- The frontend's handler time for a miss and for a hit: ``?debug=true`` queries to the demo MLP through the whole
  local stack (distinct inputs, then some of them again), the sum of the handler's stages (what Lambda bills);
- the rows per batch the batcher cut while they ran, and the byte sizes of a request, a queue message (built by
  the frontend's own encoder) and a response; the EMF log line a query writes (the frontend's own writer);
- one endpoint instance's batched throughput (the raw ONNX Runtime limit, ``bench.frontdoor.raw``) and its
  throughput at one request per call: ``bench/results/frontdoor.json``'s plain FastAPI server when that run
  exists, else a quick closed-loop run of the same plain server here (unpinned: a rougher figure, said so).
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.frontdoor.config import CASES, MODELS_DIR, RESULTS, ROOT
from bench.frontdoor.inputs import Bodies, base_rows
from bench.frontdoor.procs import Group, free_port, wait_port

LAMBDA_PLATFORM_LOG_BYTES = 330  # START, END and REPORT lines of an invocation (their usual length)


def log(line: str) -> None:
    print(f"[bench-cost] {line}", flush=True)


def post(url: str, body: bytes, timeout: float = 5.0) -> tuple[dict[str, Any], int]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw), len(raw)


def query_figures(url: str, queries: int, rate: float) -> dict[str, Any]:
    """Misses (distinct inputs) at ``rate`` q/s, then a quarter of them again (hits): handler ms, batch rows."""
    case = CASES["mlp"]
    bodies = Bodies(base_rows(case), case.app)
    target = f"{url}{bodies.path}?debug=true"
    answers: list[tuple[dict[str, Any], int]] = []
    lock = threading.Lock()

    def one(serial: int) -> None:
        try:
            answer = post(target, bodies.body(serial))
        except OSError as e:
            answer = ({"error": str(e)}, 0)
        with lock:
            answers.append(answer)

    with ThreadPoolExecutor(max_workers=16) as pool:
        start = time.monotonic()
        for i, serial in enumerate(range(1, queries + 1)):
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
            pool.submit(one, serial)
            if (i + 1) % max(1, queries // 5) == 0:
                log(f"  misses: {i + 1}/{queries} sent")
    misses = list(answers)
    answers.clear()
    for serial in range(1, queries // 4 + 1):
        one(serial)
    hits = list(answers)
    real_misses = [
        a for a, _ in misses if a.get("default") is False and a.get("debug", {}).get("cache", {}).get("hits") == 0
    ]
    real_hits = [
        a for a, _ in hits if a.get("default") is False and a.get("debug", {}).get("cache", {}).get("hits", 0) > 0
    ]
    if len(real_misses) < queries // 2 or not real_hits:
        seen = misses[0][0] if misses else None
        raise RuntimeError(
            f"too few real answers: {len(real_misses)} misses, {len(real_hits)} hits of {queries} (first: {seen})"
        )
    batch_rows = [
        t["batch_size"]
        for a in real_misses
        for t in a["debug"].get("model_timings_ms", {}).values()
        if "batch_size" in t
    ]
    return {
        "queries": queries,
        "rate_qps": rate,
        "misses_answered": len(real_misses),
        "hits_answered": len(real_hits),
        "defaults": sum(1 for a, _ in misses if a.get("default") is not False),
        "frontend_miss_ms": statistics.median(sum(a["debug"]["timings_ms"].values()) for a in real_misses),
        "frontend_hit_ms": statistics.median(sum(a["debug"]["timings_ms"].values()) for a in real_hits),
        "batch_rows": statistics.fmean(batch_rows) if batch_rows else 1.0,
        "request_bytes": len(bodies.body(1)),
        "response_bytes": int(statistics.median(n for _, n in misses if n)),
        "sample": real_misses[0],
    }


def message_bytes(sample_input: np.ndarray) -> int:
    """One model's queue message for one row, as the frontend encodes it."""
    from clipper.core.domain import InputType
    from clipper.core.messages import QueryMessage, encode_rows

    payload, _ = encode_rows(sample_input.reshape(1, -1).astype(np.float32))
    body = QueryMessage.encode(
        2**52,
        "fd-mlp",
        "mlp",
        "1",
        InputType.FLOATS,
        1,
        payload,
        2**41,
        2**41,
        "inbox.00000000000000000000000000000000",
    )
    return len(body.encode())


def log_bytes(sample: dict[str, Any]) -> int:
    """The EMF lines the frontend's writer emits for a query like ``sample``, and Lambda's own lines."""
    os.environ.pop("POWERTOOLS_METRICS_DISABLED", None)
    from clipper.frontend.metrics import EmfQueryMetrics
    from clipper.frontend.results import Prediction, QueryResult

    debug = sample["debug"]
    models = list(debug.get("model_timings_ms", {}))
    result = QueryResult(
        predictions=[Prediction(sample["query_id"], sample["output"], False)],
        batch=False,
        models=models,
        cache_by_model={m: ("1", 0, 1) for m in models},
        timings_ms=debug["timings_ms"],
        model_timings_ms=debug.get("model_timings_ms", {}),
    )
    out = io.StringIO()
    EmfQueryMetrics(out=out)("fd-mlp", result, 0.003)
    return len(out.getvalue().encode()) + LAMBDA_PLATFORM_LOG_BYTES


def raw_rows_per_s() -> float:
    out = subprocess.run(
        [sys.executable, "-m", "bench.frontdoor.raw", "--model", "mlp", "--budget-s", "0.3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["rows_per_s"])


def unbatched_per_s(seconds: float = 3.0) -> tuple[float, str]:
    """The plain server's rate at one request per call: bench-frontdoor's when it ran, else measured here."""
    frontdoor = RESULTS / "frontdoor.json"
    if frontdoor.exists():
        for row in json.loads(frontdoor.read_text()).get("summary", []):
            if row.get("model") == "mlp" and row.get("plain_max_rate"):
                return float(
                    row["plain_max_rate"]
                ), "bench/results/frontdoor.json (plain server, one core, p99 within SLO)"
    port = free_port()
    env = {"FRONTDOOR_PLAIN_MODELS": f"fd-mlp={MODELS_DIR / 'mlp' / '1' / 'model.onnx'}"}
    command = [sys.executable, "-m", "uvicorn", "--factory", "bench.frontdoor.plain_server:create_app"]
    server = Group(
        [*command, "--port", str(port), "--log-level", "warning"], Path("build/bench-cost/plain.log"), None, env
    )
    try:
        wait_port(port, server.proc, "the plain server")
        bodies = Bodies(base_rows(CASES["mlp"]), "fd-mlp")
        url = f"http://127.0.0.1:{port}{bodies.path}"
        done = [0]
        end = time.monotonic() + seconds

        def worker() -> None:
            n = 0
            while time.monotonic() < end:
                post(url, bodies.body(n))
                n += 1
            done[0] += n

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return done[0] / seconds, "plain server measured here (closed loop, 4 clients, unpinned: rough)"
    finally:
        server.stop()
