"""`make bench-cache`: the frontend's time for a prediction-cache hit and for a miss.

Both are measured in process, through the Lambda handler (Mangum, API Gateway HTTP API v2 events), with
a real redis-server as cache and reply channel. The registry is DynamoDB in moto (read once, then served
from the frontend's in-memory copy). A miss travels the whole path: SQS (moto, in process) -> an event
source mapping thread -> the batcher Lambda handler -> the ONNX endpoint server (a real process) -> Redis.
moto's SQS dominates the miss (it is a test double, ~11 ms a call); on AWS the same hop costs a few ms.

Writes bench/results/cache.json (hit_p50_ms, hit_p99_ms, miss_p50_ms, miss_p99_ms, ...) and cache.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"


def log(msg: str) -> None:
    print(f"[bench-cache] {msg}", flush=True)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


class Esm(threading.Thread):
    """Lambda's SQS event source mapping, in process: receive, invoke the batcher handler, delete."""

    def __init__(self, sqs: Any, url: str, handler: Any) -> None:
        super().__init__(daemon=True)
        self.sqs, self.url, self.handler, self.halt = sqs, url, handler, threading.Event()
        from tests.events import LambdaContext, sqs_event

        self.ctx, self.event = LambdaContext(function_name="batcher"), sqs_event
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        self.arn = attrs["Attributes"]["QueueArn"]

    def run(self) -> None:
        while not self.halt.is_set():
            got = self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get(
                "Messages", []
            )
            if not got:
                time.sleep(0.001)
                continue
            resp = self.handler(self.event(got, self.arn), self.ctx)
            failed = {f["itemIdentifier"] for f in resp["batchItemFailures"]}
            for m in got:
                if m["MessageId"] not in failed:
                    self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=300, help="queries per kind (hit, miss)")
    args = p.parse_args()

    import boto3
    from moto import mock_aws

    from infra.demo.train_models import ensure_models
    from tests.events import LambdaContext, http_event
    from tests.services import free_port, start_endpoint, stop

    manifest = ensure_models(ROOT / "build" / "models", log=lambda line: None)
    root = Path(manifest["out_dir"])
    mlp = next(m for m in manifest["models"] if m["name"] == "mlp")
    holdout = np.load(root / manifest["dataset"]["holdout"])["X"]

    redis_bin = shutil.which("redis-server")
    if not redis_bin:
        log("redis-server is not installed (make test installs it)")
        return 2
    rport = free_port()
    redis_proc = subprocess.Popen(
        [redis_bin, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    endpoint, url = start_endpoint(str(root / mlp["path"]))
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "CLIPPER_REGISTRY_TABLE": "bench-registry",
        "CLIPPER_REPLIES_TABLE": "bench-replies",
        "CLIPPER_CONFIG_TTL_S": "3600",
        "REDIS_URL": f"redis://127.0.0.1:{rport}/0",
        "POWERTOOLS_LOG_LEVEL": "ERROR",
    }
    os.environ.update(env)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    try:
        with mock_aws():
            from clipper.adapters.dynamodb_registry import DynamoDBRegistry
            from clipper.core.domain import Application, InputType, ModelVersion
            from tests.integration.conftest import create_queue, create_tables

            dynamodb, sqs = boto3.client("dynamodb"), boto3.client("sqs")
            create_tables(dynamodb, "bench-registry", "bench-replies")
            queue_url, _ = create_queue(sqs, "bench-model-mlp")
            registry = DynamoDBRegistry(dynamodb, "bench-registry")
            registry.put_app(Application("digits", InputType.FLOATS, "-1", 1_000_000, (64,)))
            registry.link("digits", "mlp")
            registry.put_version(ModelVersion("mlp", "1", InputType.FLOATS, queue_url, url, (64,)), activate=True)
            from functions.batcher import app as batcher
            from functions.frontend import app as frontend

            esm = Esm(sqs, queue_url, batcher.handler)
            esm.start()
            ctx = LambdaContext(function_name="frontend")

            def query(row: np.ndarray) -> tuple[float, dict[str, Any]]:
                event = http_event("POST", "/digits/predict", {"input": row.tolist()}, "debug=1")
                t = time.perf_counter()
                resp = frontend.handler(event, ctx)
                elapsed = (time.perf_counter() - t) * 1000
                return elapsed, json.loads(resp["body"])

            for i in range(20):  # warm up: imports, connections, registry copy
                query(holdout[i % len(holdout)] + 100.0)
            miss, hit, stages = [], [], []
            log(f"{args.queries} misses (each a new input) then {args.queries} hits (the same inputs again)")
            rows = [holdout[i % len(holdout)].copy() for i in range(args.queries)]
            for i, row in enumerate(rows):
                row[0] = 1000.0 + i  # unique, so a miss
                ms, body = query(row)
                if body["default"] or body["debug"]["cache"]["misses"] != 1:
                    raise RuntimeError(f"miss {i} did not go through the model: {body}")
                miss.append(ms)
                if (i + 1) % 100 == 0:
                    log(f"  {i + 1} misses, p50 {percentile(miss, 50):.2f} ms")
            esm.halt.set()  # hits never reach the queue: stop its poller so it takes no CPU from them
            esm.join(timeout=5)
            for i, row in enumerate(rows):
                ms, body = query(row)
                if body["debug"]["cache"]["hits"] != 1:
                    raise RuntimeError(f"hit {i} missed the cache: {body}")
                hit.append(ms)
                stages.append(body["debug"]["timings_ms"])
    finally:
        stop(endpoint)
        redis_proc.terminate()
        redis_proc.wait(timeout=10)

    result = {
        "hit_p50_ms": round(percentile(hit, 50), 3),
        "hit_p99_ms": round(percentile(hit, 99), 3),
        "miss_p50_ms": round(percentile(miss, 50), 3),
        "miss_p99_ms": round(percentile(miss, 99), 3),
        "hit_share_of_miss_p50": round(percentile(hit, 50) / percentile(miss, 50), 4),
        "hit_path_stage_p50_ms": {
            k: round(float(np.median([s.get(k, 0.0) for s in stages])), 3) for k in ("validate", "select", "cache")
        },
        "queries": args.queries,
        "target_hit_p50_under_ms": 2.0,
        "where": "in process through Mangum; real redis-server; registry and SQS in moto (mock_aws)",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cache.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(hit, miss, RESULTS / "cache.png")
    log(json.dumps(result, indent=2))
    log(f"wrote {RESULTS / 'cache.json'} and cache.png")
    return 0


def plot(hit: list[float], miss: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for values, label in ((hit, "cache hit"), (miss, "cache miss (SQS in moto + batcher + model)")):
        xs = np.sort(values)
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label)
    ax.set_xscale("log")
    ax.set_xlabel("frontend handler time per query (ms, log scale)")
    ax.set_ylabel("fraction of queries")
    ax.set_title("Prediction cache: frontend time, hit vs miss")
    ax.axvline(2.0, color="grey", linestyle=":", label="2 ms target for a hit")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
