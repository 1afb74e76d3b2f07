"""make bench-cost: what a prediction of the demo MLP costs on AWS with this stack, beside a SageMaker real-time
endpoint invoked directly and SageMaker Serverless Inference, from figures measured on the running local stack
(``bench/cost/measure.py``) and the list prices of ``clipper/cost/prices.json`` (``clipper/cost/model.py`` says
what each line counts). Writes bench/results/cost.json and cost.png; ``clipper cost`` reads the JSON's figures.

    python -m bench.cost [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from bench.cost import measure, report
from bench.frontdoor.config import CASES, RESULTS
from bench.frontdoor.inputs import base_rows
from bench.frontdoor.stack import LocalStack
from clipper.cost.model import SYSTEMS, Deployment, Measured, Prices, crossings, with_store

TABLE_RATES = [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0]
CURVE_RATES = [float(r) for r in np.logspace(-2, 4.5, 40)]


def measured_figures(queries: int, rate: float) -> tuple[Measured, dict[str, object]]:
    stack = LocalStack("redis", core=None)
    stack.state_dir = Path("build/bench-cost/state").resolve()
    stack.start()
    try:
        stack.register([CASES["mlp"]])
        time.sleep(3)  # the frontend's configuration refresh sees the new app
        measure.log(f"{queries} queries at {rate:g} q/s through the stack (?debug=true), then a quarter again")
        q = measure.query_figures(stack.url, queries, rate)
    finally:
        stack.stop()
    measure.log("the raw ONNX Runtime limit (one thread) and the plain server's rate")
    raw = measure.raw_rows_per_s()
    plain, plain_source = measure.unbatched_per_s()
    sample = q.pop("sample")
    first_row = base_rows(CASES["mlp"])[0]
    figures = Measured(
        frontend_hit_ms=q["frontend_hit_ms"],
        frontend_miss_ms=q["frontend_miss_ms"],
        batch_rows=q["batch_rows"],
        instance_rows_per_s=raw,
        unbatched_per_s=plain,
        inference_ms=float(sample["debug"]["model_timings_ms"]["mlp"].get("inference", 0.05)),
        request_bytes=q["request_bytes"],
        message_bytes=measure.message_bytes(first_row),
        response_bytes=q["response_bytes"],
        log_bytes_per_query=measure.log_bytes(sample),
        source=f"local stack (Redis Streams), {q['queries']} queries at {rate:g} q/s; unbatched rate: {plain_source}",
    )
    return figures, q


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer queries (a check that it runs)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where cost.json and cost.png go")
    args = p.parse_args(argv)
    prices = Prices.load()
    figures, run = measured_figures(queries=100 if args.quick else 600, rate=50.0 if args.quick else 100.0)
    measure.log(f"measured: {json.dumps(dataclasses.asdict(figures))}")
    deployment = Deployment()
    variants = {
        "stack": ("stack", deployment),
        "stack-dynamodb": ("stack", with_store(deployment, "dynamodb")),
        "realtime": ("realtime", deployment),
        "serverless": ("serverless", deployment),
    }
    costs = {n: [SYSTEMS[f](prices, figures, d, r) for r in CURVE_RATES] for n, (f, d) in variants.items()}
    at_table = {n: [SYSTEMS[f](prices, figures, d, r) for r in TABLE_RATES] for n, (f, d) in variants.items()}
    print(report.table(at_table, TABLE_RATES))
    print()
    print(report.breakdown(at_table["stack"][TABLE_RATES.index(100.0)]))
    cross = {
        f"{a} vs {b}": crossings(costs, a, b)
        for a, b in [("stack", "serverless"), ("realtime", "serverless"), ("stack", "realtime")]
    }
    measure.log(f"crossings (rates where the cheaper one changes): {cross}")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "prices": {k: prices[k] for k in ("region", "as_of", "note")},
        "deployment": dataclasses.asdict(deployment),
        "measured": dataclasses.asdict(figures),
        "run": run,
        "table_rates_qps": TABLE_RATES,
        "table": {n: [round(c.per_million, 4) for c in s] for n, s in at_table.items()},
        "breakdown_100_qps": at_table["stack"][TABLE_RATES.index(100.0)].lines,
        "crossings_qps": cross,
    }
    (args.out / "cost.json").write_text(json.dumps(result, indent=2) + "\n")
    report.plot(costs, args.out / "cost.png", f"cost per million predictions, digits MLP ({prices.label})")
    measure.log(f"wrote {args.out / 'cost.json'} and {args.out / 'cost.png'}")


if __name__ == "__main__":
    main()
