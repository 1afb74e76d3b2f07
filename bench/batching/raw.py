"""The raw ONNX Runtime limit: the model's session called in process with fixed batches."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.batching.config import RAW_BATCHES, RAW_MIN_CALLS, log
from bench.batching.sut import nearest_rank


def raw_limit(
    model_path: Path, rows: np.ndarray, slo_ms: float, budget_s: float, batches: Sequence[int] = RAW_BATCHES
) -> tuple[float, int, list[dict[str, Any]]]:
    """Best rows/s of fixed batches called in process whose p99 call latency is within the SLO."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    table: list[dict[str, Any]] = []
    best, best_batch = 0.0, 0
    for batch in batches:
        x = np.ascontiguousarray(np.resize(rows, (batch, *rows.shape[1:])), dtype=np.float32)
        session.run(None, {name: x})
        times: list[float] = []
        deadline = time.monotonic() + budget_s
        while len(times) < 5000 and (time.monotonic() < deadline or len(times) < RAW_MIN_CALLS):
            started = time.perf_counter()
            session.run(None, {name: x})
            times.append(time.perf_counter() - started)
        t = np.sort(np.array(times))
        p99 = nearest_rank(t, 0.99) * 1000
        rows_per_s = batch * len(t) / float(t.sum())
        within = p99 <= slo_ms
        table.append(
            {"batch": batch, "calls": len(t), "rows_per_s": round(rows_per_s, 1), "p99_ms": round(p99, 3), "ok": within}
        )
        log(
            f"  raw ORT batch {batch:>3}: {rows_per_s:10.0f} rows/s, p99 {p99:8.3f} ms {'' if within else '(over SLO)'}"
        )
        if within and rows_per_s > best:
            best, best_batch = rows_per_s, batch
        if not within:
            break  # bigger batches only take longer
        if time.monotonic() > deadline + 2 * budget_s:
            break  # the next batch size would take too long
    return best, best_batch, table
