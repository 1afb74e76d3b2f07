"""What a prediction costs on AWS: this stack as template.yaml deploys it, beside a SageMaker real-time endpoint
invoked directly and SageMaker Serverless Inference, for the same model.

    prices = Prices.load()                                   # clipper/cost/prices.json (region, date, sources)
    figures = Measured(...)                                  # the stack's own figures (bench-cost measures them)
    stack = stack_cost(prices, figures, Deployment(), rate_qps=100)
    stack.per_million, stack.lines                           # USD per million predictions, and where it goes

Per query, by what the code does (the requests are those ``tests/integration/test_round_trips.py`` counts):

- API Gateway: one HTTP API request; the frontend Lambda: one invocation, billed (per ms) for its whole handler,
  the wait for replies included: ``frontend_hit_ms`` for a cache hit, ``frontend_miss_ms`` + ``aws_queue_ms`` for
  a miss (the local stack's queue is Redis Streams; on AWS the send and the transit through SQS cost about two SQS
  requests' latency, docs/latency-on-aws.md);
- a miss, per model asked: one SQS SendMessage per 64 KB of payload, the receive of its message shared by the
  messages of one receive (at most 10 on SQS), and its delete shared by those of one receive or, when more, by
  those its batcher answers within the acknowledgement linger (``ack_linger_s``, at most 10 a call);
- the cache and the reply channel: on ElastiCache Serverless (template.yaml's ``Cache``), an ECPU a command (the
  lookup, and per model asked the reply's publish and read, the cache's fill and claim release); on DynamoDB, a read
  for the lookup, a conditional write for the claim and one for the result, a write for the reply and the
  frontend's reads while it waits (one every ``reply_poll_ms``; the gap grows only after ten of them, past the
  waits this model counts: ``clipper.core.polling``);
- the frontend's log line (EMF metrics), ``log_bytes_per_query``, at CloudWatch Logs' ingestion price.

Per hour, whatever the traffic: the endpoints' instances (each model asked has its own endpoint, with enough
instances for the misses that ask it at the measured batched throughput of one instance), ElastiCache
Serverless's stored data (at least the engine's minimum), the long-poll batchers' empty receives while idle
(receivers x one per ``poll_wait_s``; counted in full, an upper bound) and their PutMetricData call a minute.

The SageMaker real-time endpoint invoked directly: instances enough for the rate at one request per call (no
batching), and data processed in and out. Serverless Inference: memory x duration per request (the inference,
per ms), and data processed. With an ensemble of n models both are n endpoints, each invoked for every query.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from clipper.batching.acker import DEFAULT_LINGER_S

HOURS_PER_MONTH = 730.0
SQS_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class Prices:
    raw: dict[str, Any]

    @staticmethod
    def load(path: Path | None = None) -> Prices:
        text = path.read_text() if path else resources.files("clipper.cost").joinpath("prices.json").read_text()
        return Prices(json.loads(text))

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    @property
    def label(self) -> str:
        return f"{self.raw['region']} list prices as of {self.raw['as_of']}"


ECPUS_PER_SEND = 4  # ElastiCache commands per model asked on a miss: reply publish and read, cache SET and DEL


@dataclass(frozen=True)
class Measured:
    """The stack's own figures for one model (``make bench-cost`` measures them on the local stack)."""

    frontend_hit_ms: float  # the frontend's handler for a cache hit
    frontend_miss_ms: float  # ... for a miss, the wait for the reply included (local queue)
    batch_rows: float  # mean rows per endpoint call under load
    instance_rows_per_s: float  # one endpoint instance's batched throughput (raw limit, one thread)
    unbatched_per_s: float  # one instance answering one request per call (the plain server)
    inference_ms: float  # one row's inference (Serverless Inference's billed duration)
    request_bytes: int  # a query's body
    message_bytes: int  # one model's queue message
    response_bytes: int
    log_bytes_per_query: int
    source: str = ""  # where these figures come from


@dataclass(frozen=True)
class Deployment:
    frontend_memory_mb: int = 1024  # template.yaml FrontendMemorySize
    architecture: str = "x86_64"
    store: str = "redis"  # cache and replies: "redis" (ElastiCache Serverless, as template.yaml) or "dynamodb"
    cache_engine: str = "valkey"  # template.yaml's ElastiCacheEngine
    cache_gb: float = 0.0  # data the cache holds (GB-hours billed; the engine's minimum when less)
    instance_type: str = "ml.c5.large"
    instance_vcpus: int = 2
    min_instances: int = 1
    models_per_query: int = 1  # 1: single / exp3; n: an exp4 ensemble of n
    cache_hit_ratio: float = 0.0
    aws_queue_ms: float = 40.0  # SQS send + transit (docs/latency-on-aws.md)
    reply_poll_ms: float = 10.0  # CLIPPER_REPLY_POLL_INTERVAL_S with DynamoDB replies
    receivers: int = 4  # long-poll receivers per batcher on SQS
    poll_wait_s: float = 1.0  # their long poll (clipper-batcher --poll-wait-s)
    ack_linger_s: float = DEFAULT_LINGER_S  # deletes wait this long to share a call (clipper-batcher --ack-linger-ms)
    serverless_memory_gb: float = 2.0


@dataclass
class Cost:
    system: str
    rate_qps: float
    per_query: dict[str, float] = field(default_factory=dict)  # USD per query, by line
    per_hour: dict[str, float] = field(default_factory=dict)  # USD per hour whatever the traffic, by line
    instances: int = 0

    @property
    def lines(self) -> dict[str, float]:
        """USD per million predictions, by line (fixed costs spread over the rate's queries)."""
        queries_per_hour = self.rate_qps * 3600
        out = {k: v * 1e6 for k, v in self.per_query.items()}
        for k, v in self.per_hour.items():
            out[k] = out.get(k, 0.0) + v / queries_per_hour * 1e6
        return out

    @property
    def per_million(self) -> float:
        return sum(self.lines.values())

    @property
    def per_month(self) -> float:
        return self.per_million * self.rate_qps * 3600 * HOURS_PER_MONTH / 1e6


def _gb(n_bytes: float) -> float:
    return n_bytes / 1024**3


def stack_cost(prices: Prices, m: Measured, d: Deployment, rate_qps: float) -> Cost:
    p = prices
    c = Cost("this stack (long-poll batcher beside the model)", rate_qps)
    miss = 1.0 - d.cache_hit_ratio
    sends = miss * d.models_per_query  # model messages per query
    billed_ms = d.cache_hit_ratio * math.ceil(m.frontend_hit_ms) + miss * math.ceil(m.frontend_miss_ms + d.aws_queue_ms)
    c.per_query["API Gateway"] = p["api_gateway_http_per_million"] / 1e6
    c.per_query["frontend Lambda"] = (
        p["lambda_request_per_million"] / 1e6
        + d.frontend_memory_mb / 1024 * billed_ms / 1000 * p["lambda_gb_second"][d.architecture]
    )
    rows_per_s = rate_qps * sends
    # Each model of an ensemble has its own serving stack (infra/model-stack.yaml): its endpoint's instances,
    # its batcher's receivers and metrics, for the rows of the misses that ask it.
    per_model = max(d.min_instances, math.ceil(rate_qps * miss / (m.instance_rows_per_s * d.instance_vcpus)))
    c.instances = d.models_per_query * per_model
    per_receive = min(10.0, max(1.0, m.batch_rows))  # messages one SQS receive returns under load
    per_delete = min(10.0, max(per_receive, rows_per_s / c.instances * d.ack_linger_s))  # one batcher's linger
    chunks = math.ceil(m.message_bytes / SQS_CHUNK_BYTES)
    c.per_query["SQS"] = sends * (chunks + 1 / per_receive + 1 / per_delete) * p["sqs_request_per_million"] / 1e6
    if d.store == "dynamodb":
        writes = sends * 3  # per model asked: the claim, the result, the reply
        # a read per model's row, and while a miss waits one query of its replies every reply_poll_ms
        reads = d.models_per_query + miss * (d.aws_queue_ms + m.frontend_miss_ms) / d.reply_poll_ms
        c.per_query["DynamoDB (cache, replies)"] = (
            writes * p["dynamodb_write_unit_per_million"] + reads * p["dynamodb_read_unit_per_million"]
        ) / 1e6
    else:
        serverless = p["elasticache_serverless"][d.cache_engine]
        c.per_hour["ElastiCache (stored data)"] = max(d.cache_gb, serverless["min_gb"]) * serverless["gb_hour"]
        # An ECPU a command (each moves under 1 KB here): the lookup-and-claim, and per model asked the reply's
        # publish and read and the cache's fill and claim release.
        ecpus = 1 + sends * ECPUS_PER_SEND
        c.per_query["ElastiCache (ECPUs)"] = ecpus * serverless["ecpu_per_million"] / 1e6
    c.per_query["CloudWatch Logs"] = _gb(m.log_bytes_per_query) * p["cloudwatch_logs_ingested_per_gb"]
    c.per_hour["endpoint instances"] = c.instances * p["sagemaker_instance_hour"][d.instance_type]
    idle_receives_per_hour = c.instances * d.receivers * 3600 / max(d.poll_wait_s, 1.0)
    c.per_hour["SQS idle long polls"] = idle_receives_per_hour * p["sqs_request_per_million"] / 1e6
    c.per_hour["CloudWatch metrics"] = c.instances * 60 * p["cloudwatch_put_metric_data_per_thousand"] / 1000
    return c


def realtime_cost(prices: Prices, m: Measured, d: Deployment, rate_qps: float) -> Cost:
    c = Cost("SageMaker real-time endpoint, invoked directly", rate_qps)
    # an endpoint per model, each invoked for every query (no cache in front of it)
    per_model = max(d.min_instances, math.ceil(rate_qps / (m.unbatched_per_s * d.instance_vcpus)))
    c.instances = d.models_per_query * per_model
    c.per_hour["endpoint instances"] = c.instances * prices["sagemaker_instance_hour"][d.instance_type]
    c.per_query["data processed"] = (
        d.models_per_query * _gb(m.request_bytes + m.response_bytes) * prices["sagemaker_data_processed_per_gb"]
    )
    return c


def serverless_cost(prices: Prices, m: Measured, d: Deployment, rate_qps: float) -> Cost:
    c = Cost("SageMaker Serverless Inference", rate_qps)
    seconds = math.ceil(max(m.inference_ms, 1.0)) / 1000
    n = d.models_per_query  # an endpoint per model, each invoked for every query
    c.per_query["inference duration"] = n * d.serverless_memory_gb * seconds * prices["sagemaker_serverless_gb_second"]
    c.per_query["data processed"] = (
        n * _gb(m.request_bytes + m.response_bytes) * prices["sagemaker_data_processed_per_gb"]
    )
    return c


SYSTEMS = {"stack": stack_cost, "realtime": realtime_cost, "serverless": serverless_cost}


def compare(prices: Prices, m: Measured, d: Deployment, rates: list[float]) -> dict[str, list[Cost]]:
    """Every system's cost at each rate."""
    return {name: [f(prices, m, d, r) for r in rates] for name, f in SYSTEMS.items()}


def crossings(costs: dict[str, list[Cost]], a: str, b: str) -> list[float]:
    """The rates between which ``a`` and ``b`` swap places (the first rate after each swap)."""
    out = []
    pairs = list(zip(costs[a], costs[b], strict=True))
    for (a0, b0), (a1, b1) in itertools.pairwise(pairs):
        if (a0.per_million - b0.per_million) * (a1.per_million - b1.per_million) < 0:
            out.append(a1.rate_qps)
    return out


def with_store(d: Deployment, store: str) -> Deployment:
    return replace(d, store=store)
