"""The raw in-process limit of a model: ONNX Runtime in one process, one thread, fixed batches of 1 to 1,024
rows; the best rows/s among the batch sizes whose p99 call latency is within the SLO (the batching
benchmark's ``raw_limit``). Run as its own process, pinned to the system-under-test core, while nothing else
of the benchmark runs there:

    taskset -c 0 python -m bench.frontdoor.raw --model mlp --budget-s 1

It prints its progress, then one JSON line: ``{"rows_per_s": ..., "batch": ..., "table": [...]}``.
"""

from __future__ import annotations

import argparse
import json

from bench.batching.raw import raw_limit
from bench.frontdoor.config import CASES, MODELS_DIR
from bench.frontdoor.inputs import base_rows

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(CASES), required=True)
    p.add_argument("--budget-s", type=float, default=1.0, help="seconds of calls per batch size")
    args = p.parse_args(argv)
    case = CASES[args.model]
    rows = base_rows(case).reshape(-1, *case.input_shape)
    path = MODELS_DIR / case.name / "1" / "model.onnx"
    if case.name == "cnn":
        from infra.demo.cnn_model import ensure_cnn

        path = ensure_cnn(MODELS_DIR)
    best, batch, table = raw_limit(path, rows, case.slo_ms, args.budget_s, BATCHES)
    print(json.dumps({"rows_per_s": round(best, 1), "batch": batch, "table": table}), flush=True)


if __name__ == "__main__":
    main()
