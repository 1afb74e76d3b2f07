"""What the live selection benchmark runs: its plans (full or --quick), the experiments, and the constants its
modules share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
MODELS_DIR = ROOT / "build" / "models"
WORK_DIR = ROOT / "build" / "bench-live-selection"  # the stack's state folder and logs
SEED = 2017
SLO_MS = 1000  # the benchmark's applications: a slow moment of a busy machine must not turn into defaults
BROKEN_VERSION = "2"  # the best model's version that answers wrong labels (bench/live_selection/broken.py)
PROBE_APP = "digits"  # the demo's single-model application on mlp: it tells when the frontend sees a switch
USERS_PER_GROUP = 3


@dataclass(frozen=True)
class Plan:
    passes: int  # shuffled passes over the held-out rows per stream
    rows: int  # held-out rows used (the first ones; 540: all)
    seeds: int  # replay seeds per experiment (the band)
    window: int  # queries per window of the comparison
    progress_every: int  # queries between progress lines
    rate: float  # queries (each followed by its feedback) per second, paced; under what the feedback path keeps up with


# The local stack's feedback worker (moto's SQS and DynamoDB) keeps up with 8 queries and their feedback a second on
# the 2 cores the stack shares with this client; a client that outruns it builds a backlog (held at MAX_BACKLOG).
FULL = Plan(passes=2, rows=540, seeds=20, window=90, progress_every=270, rate=8.0)
QUICK = Plan(passes=1, rows=40, seeds=5, window=10, progress_every=20, rate=20.0)


@dataclass(frozen=True)
class Experiment:
    name: str
    app: str  # the application registered for it
    policy: str  # exp3 or exp4
    kind: str  # "accuracy", "fault" (the best model breaks midway) or "users" (the personalisation stream)
    per_user: bool = False  # queries and feedback carry the user's id


EXPERIMENTS = (
    Experiment("exp4", "ls-exp4", "exp4", "accuracy"),
    Experiment("user-exp3", "ls-user-exp3", "exp3", "users", per_user=True),
    Experiment("global-exp3", "ls-global-exp3", "exp3", "users"),
    Experiment("fault-exp3", "ls-fault-exp3", "exp3", "fault"),
    Experiment("fault-exp4", "ls-fault-exp4", "exp4", "fault"),
)


def log(line: str) -> None:
    print(f"[bench-live-selection] {line}", flush=True)
