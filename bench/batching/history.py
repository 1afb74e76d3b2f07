"""The history of full runs (``bench/results/batching_runs.json``): each run's headline figures, keyed by the
code under test, so that a run is compared only with runs of the same code and method."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from bench.batching.config import HISTORY, ROOT

# The files whose code decides the figures: runs are compared only with runs of the same code.
SUT_FILES = (
    "shared/clipper/batching",
    "shared/clipper/core/messages.py",
    "shared/clipper/core/tensors.py",
    "shared/clipper/adapters/endpoints.py",
    "model-images/onnx-runtime/clipper_endpoint",
    "infra/demo/cnn_model.py",
    "bench/batching/sqs_limits.py",
)
# Change this when the way this benchmark measures changes, so that older runs are no longer compared.
# 2: no rerun of a near miss; results per queue (the in-memory pipe, the queue with SQS's limits).
METHOD_REVISION = 2
HEADLINE = (
    "throughput_adaptive",
    "throughput_unbatched",
    "throughput_raw_limit",
    "adaptive_over_unbatched",
    "adaptive_over_raw_limit",
    "target_met",
)
MAX_HISTORY = 30


def result_key(result: dict[str, Any]) -> str:
    """A result's name in the history: the model, and the queue when it is not the in-memory pipe."""
    queue = result.get("queue", "pipe")
    return result["model"] if queue == "pipe" else f"{result['model']} ({queue})"


def code_fingerprint(controller: str, sqs_call_latency: str) -> str:
    """A hash of the code under test, the measuring method's revision, the controller and the queue latency."""
    digest = hashlib.sha256(f"{METHOD_REVISION}:{controller}:{sqs_call_latency}".encode())
    for rel in SUT_FILES:
        path = ROOT / rel
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            if f.is_file():
                digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def record_run(results: list[dict[str, Any]], controller: str, sqs_call_latency: str) -> list[dict[str, Any]]:
    """Add this full run's headline figures to ``batching_runs.json``; return the runs of the same code."""
    try:
        runs: list[dict[str, Any]] = json.loads(HISTORY.read_text()) if HISTORY.exists() else []
    except ValueError:
        runs = []
    code = code_fingerprint(controller, sqs_call_latency)
    entry: dict[str, Any] = {"code": code, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "models": {}}
    for r in results:
        entry["models"][result_key(r)] = {k: r[k] for k in HEADLINE}
    runs = [*runs, entry][-MAX_HISTORY:]
    HISTORY.write_text(json.dumps(runs, indent=1) + "\n")
    return [run for run in runs if run["code"] == code]


def spread_text(results: list[dict[str, Any]], runs: list[dict[str, Any]]) -> str:
    """One sentence per result: the range of each headline figure over the full runs of this code."""
    if len(runs) < 2:
        return ""

    def span(model: str, key: str, unit: str = "") -> str:
        values = [run["models"][model][key] for run in runs if run["models"].get(model, {}).get(key) is not None]
        if not values:
            return "-"
        lo, hi = min(values), max(values)

        def fmt(v: float) -> str:
            return f"{v:,.0f}" if lo >= 10 else f"{v:.3g}"

        return f"{fmt(lo)}{unit}" if lo == hi else f"{fmt(lo)}-{fmt(hi)}{unit}"

    text = f"""The rates move from run to run on this shared virtual machine. Over the {len(runs)} full runs of this
        code so far (`results/batching_runs.json`):"""
    for r in results:
        m = result_key(r)
        met = sum(1 for run in runs if run["models"].get(m, {}).get("target_met"))
        count = sum(1 for run in runs if m in run["models"])
        text += f""" {m}: adaptive {span(m, "throughput_adaptive")} q/s, batch size 1
            {span(m, "throughput_unbatched")} q/s, raw {span(m, "throughput_raw_limit")} rows/s, adaptive over
            batch size 1 {span(m, "adaptive_over_unbatched", "x")}, over raw {span(m, "adaptive_over_raw_limit", "x")},
            target met in {met} of {count} runs;"""
    return text.rstrip(";") + "."
