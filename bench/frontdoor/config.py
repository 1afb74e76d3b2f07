"""What the front-door benchmark measures and for how long: the model cases, the systems, the plans (full or
--quick) and the constants its modules share."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
MODELS_DIR = ROOT / "build" / "models"
WORK_DIR = ROOT / "build" / "bench-frontdoor"  # process logs of the run
SUT_CORE, GENERATOR_CORE = 0, 1
SEED = 2017
# The verdict of a trial, in integers (nearest-rank p99 within the SLO <=> at least 99 in 100 queries answered by
# a model within it; real answers >= 99.9 % <=> at most 1 in 1,000 defaults, errors and timeouts).
WITHIN_PER_100 = 99
REAL_PER_1000 = 999
TRANSPORTS = ("redis", "sqs")  # the stack's request queue: CLIPPER_QUEUE_TRANSPORT
TARGET_TRANSPORT = "redis"  # the targets of issue 12 are judged on the Redis Streams transport


@dataclass(frozen=True)
class ModelCase:
    name: str  # the model (build/models/<name>/1/model.onnx)
    app: str  # the application registered for it (the same path on the plain server)
    slo_ms: float
    start_rate: float  # the rate search's first trial (queries/s)
    input_shape: tuple[int, ...]


CASES = {
    "mlp": ModelCase("mlp", "fd-mlp", 20.0, 250.0, (64,)),
    "cnn": ModelCase("cnn", "fd-cnn", 100.0, 20.0, (3, 32, 32)),
}
# The generator's own ceiling: the same search against a server that answers at once, at the tightest SLO.
CEILING_CASE = ModelCase("none", "trivial", 20.0, 2000.0, (64,))


@dataclass(frozen=True)
class Plan:
    """How long each trial runs and how finely the search goes (full run or --quick)."""

    warmup_s: float  # arrivals in the first seconds of a trial are sent but not counted
    target_queries: int  # a trial's measured part lasts target_queries / rate seconds, within:
    min_trial_s: float
    max_trial_s: float
    refine_steps: int  # bisection steps after the doubling found a failing rate
    floor_fraction: float  # the search gives up (0 q/s) below start_rate * floor_fraction
    settle_max_s: float  # after a trial: wait until the system answers probes promptly, at most this long
    raw_budget_s: float  # the raw ONNX Runtime limit: seconds per batch size
    ceiling_max_trial_s: float


FULL = Plan(
    warmup_s=1.0,
    target_queries=3000,
    min_trial_s=5.0,
    max_trial_s=15.0,
    refine_steps=3,
    floor_fraction=1 / 16,
    settle_max_s=20.0,
    raw_budget_s=1.0,
    ceiling_max_trial_s=4.0,
)
QUICK = Plan(
    warmup_s=0.3,
    target_queries=200,
    min_trial_s=1.0,
    max_trial_s=2.0,
    refine_steps=0,
    floor_fraction=1 / 4,
    settle_max_s=5.0,
    raw_budget_s=0.2,
    ceiling_max_trial_s=1.0,
)
MAX_QUERIES_PER_TRIAL = 120_000  # requests are encoded before a trial: this bounds the memory they take
RATE_CAP = 64_000.0  # above the generator's ceiling on this kind of machine
REQUEST_TIMEOUT_S = 1.0  # an answer later than this is a timeout (a miss); every SLO here is far below it
MAX_CONNECTIONS = 256  # keep-alive connections the generator may hold; a query waits for a free one
INITIAL_CONNECTIONS = 16
STACK_START_TIMEOUT_S = 240
# The local stack's batchers take half the demo SLO as their latency objective (infra/local/run.py): 100 ms
# gives them 50 ms, under the CNN's 100 ms SLO; the MLP's batches take well under 1 ms either way.
DEMO_SLO_MS = 100


def log(line: str) -> None:
    print(f"[bench-frontdoor] {line}", flush=True)


def add_rates_option(parser: argparse.ArgumentParser, defaults: Mapping[str, str], note: str = "") -> None:
    """``--rates``: open-loop rates, comma-separated; unset, the model's own (``defaults``, by model)."""
    models = ", ".join(f"{m} {r}" for m, r in defaults.items())
    parser.add_argument(
        "--rates", default=None, help=f"open-loop rates (q/s), comma-separated{note} (default: the model's, {models})"
    )


def rates_of(given: str | None, default: str) -> list[float]:
    """The rates of a ``--rates`` value, or of the model's ``default`` when it was not given."""
    text = default if given is None else given
    return [float(r) for r in text.split(",") if r.strip()]
