"""Where the cold-start benchmark writes, what it measures, its targets."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
ENDPOINT_PKG = ROOT / "model-images" / "onnx-runtime"
FUNCTIONS = ("frontend", "batcher", "feedback", "admin", "model_updater")
VARIANTS = ("ours", "bare", "bare_plus")
ALL_VARIANTS = (*VARIANTS, "ours_gc")
CHILD_TIMEOUT_S = 60
BATCHER_TARGET_S = 0.6
FRONTEND_RATIO_TARGET = 1.2


def log(msg: str) -> None:
    print(f"[bench-coldstart] {msg}", flush=True)


# -- the child: a fresh interpreter importing one handler module, then answering two events ---------------
# Only the standard library is imported before the handler; diagnostics (audit hook, profiler) are on only
# in the -X importtime run, which is not timed.
