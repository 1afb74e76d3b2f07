"""What the batching benchmark measures and how long it searches: the model cases, the queues that replace
SQS, the plans (full or --quick) and the constants shared by its modules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
README = ROOT / "bench" / "README.md"
HISTORY = RESULTS / "batching_runs.json"
ENDPOINT_PATH = ROOT / "model-images" / "onnx-runtime"
MODELS_DIR = ROOT / "build" / "models"
GENERATOR_CORE, SUT_CORE = 0, 1
WITHIN_SLO_REQUIRED = 0.99
RAW_MIN_CALLS = 20
BATCH_WAIT_S = 0.001  # Clipper's default; the driver also cuts a batch as soon as the queue is empty
MAX_BATCH = 256  # the long-poll driver's default --max-batch-size
RAW_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SEED = 2017
# What this benchmark is, in its output: a part of the system, with the queue replaced and no frontend.
HARNESS = "batcher core + endpoint, queue replaced, no frontend"
QUEUES = {
    "pipe": "an in-memory pipe (no limit per receive, no cost per call)",
    "sqs-limits": "a queue with SQS's limits (at most 10 messages per receive; every call pays a drawn latency)",
}
DEFAULT_SQS_CALL_MS = "18,50"  # median, p99 of a log-normal: mean ~20 ms, the SQS guide's figure


@dataclass(frozen=True)
class ModelCase:
    name: str
    slo_ms: float
    start_rate: float  # first rung of the rate ladder (queries/s)
    target: str  # what the issue asks of adaptive batching


CASES = {
    "mlp": ModelCase("mlp", 20.0, 500.0, "adaptive >= 10x unbatched, p99 within the SLO"),
    "cnn": ModelCase("cnn", 100.0, 40.0, "adaptive >= 0.8x the raw ONNX Runtime limit, p99 within the SLO"),
}


@dataclass(frozen=True)
class Plan:
    """How long and how finely to search (full run or --quick)."""

    min_trial_s: float
    max_trial_s: float
    queries_per_trial: int
    warmup_s: float
    refine_steps: int
    raw_budget_s: float
    start_factor: float


FULL = Plan(
    min_trial_s=2.0,
    max_trial_s=8.0,
    queries_per_trial=1000,
    warmup_s=0.5,
    refine_steps=3,
    raw_budget_s=1.0,
    start_factor=1.0,
)
QUICK = Plan(
    min_trial_s=0.6,
    max_trial_s=1.5,
    queries_per_trial=150,
    warmup_s=0.3,
    refine_steps=0,
    raw_budget_s=0.2,
    start_factor=2.0,
)
MAX_QUERIES_PER_TRIAL = 60_000
RATE_CAP = 40_000.0  # the generator encodes ~20-50 us a query: beyond this it is the bottleneck


def log(line: str) -> None:
    print(line, flush=True)
