"""The live selection benchmark's output: a line per experiment, ``<name>.json`` (per experiment and window:
the live accuracy, the replays' mean and range) and ``<name>.png`` (the live curve over the replays' bands)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.live_selection.compare import moving
from bench.live_selection.config import ROOT, SLO_MS, Plan, log

LINES = (("instant", "C0", "replay, feedback seen at once"), ("as_seen", "C1", "replay, as the frontend saw it"))


def say(name: str, r: dict[str, Any]) -> None:
    live, inst, seen = r["live"], r["instant"], r["as_seen"]
    log(
        f"{name}: live {inst['live_accuracy']:.4f}; replay, feedback seen at once: "
        f"{inst['replay_accuracy']['mean']:.4f} "
        f"[{inst['replay_accuracy']['min']:.4f}, {inst['replay_accuracy']['max']:.4f}], live inside its range in "
        f"{inst['windows_inside']}/{inst['windows']} windows; as the frontend saw it: "
        f"{seen['replay_accuracy']['mean']:.4f} [{seen['replay_accuracy']['min']:.4f}, "
        f"{seen['replay_accuracy']['max']:.4f}], inside in {seen['windows_inside']}/{seen['windows']} windows "
        f"(chance alone: {inst['inside_share_by_chance']:.0%})"
    )
    log(
        f"  {live['queries']} queries at {live['queries_per_s']} q/s, {live['defaults']} defaults, "
        f"{live['non_200']} non-200, {live['missing_records']} without a record, {r['output_mismatches']} recorded "
        f"outputs unlike the offline prediction; feedback unseen by a query: {r['lag']}"
    )
    if "recovery" in r:
        log(f"  fault at query {r['fault_at']}: {r['recovery']}")


def _commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return ""
    return done.stdout.strip()


def write(out: Path, name: str, plan: Plan, results: dict[str, Any], started: float) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    body = {
        "plan": asdict(plan),
        "slo_ms": SLO_MS,
        "conditions": {
            "cpus": os.cpu_count(),
            "load_average_at_end": os.getloadavg(),
            "commit": _commit(),
            "finished": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "seconds": round(time.monotonic() - started, 1),
        },
        "experiments": {k: {f: v for f, v in r.items() if f not in ("curves", "bands")} for k, r in results.items()},
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(body, indent=1) + "\n")
    png = out / f"{name}.png"
    plot(results, png, plan.window)
    return path, png


def plot(results: dict[str, Any], path: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    for a, name in zip(axes.flat, names, strict=False):
        r = results[name]
        w = min(window, len(r["curves"]["live"]))
        xs = np.arange(w - 1, len(r["curves"]["live"]))
        for key, color, label in LINES:
            runs = np.stack([moving(b, w) for b in r["bands"][key]])
            a.fill_between(xs, runs.min(0), runs.max(0), color=color, alpha=0.25, linewidth=0)
            a.plot(xs, runs.mean(0), color=color, linewidth=1.2, label=f"{label} (mean, range of {len(runs)} seeds)")
        a.plot(xs, moving(r["curves"]["live"], w), color="k", linewidth=1.4, label="live stack")
        if name == "exp4":
            best = max(r["fixed_models"], key=r["fixed_models"].get)
            a.axhline(r["fixed_models"][best], color="C2", linestyle="--", linewidth=1, label=f"{best} alone")
        if "fault_at" in r:
            a.axvline(r["fault_at"], color="C3", linestyle="--", linewidth=1, label="mlp:2 (broken) active")
        a.set(title=f"{name}: accuracy over the last {w} queries", xlabel="query", ylabel="accuracy")
        a.legend(fontsize=7, loc="lower left")
    a = axes.flat[len(names)] if len(names) < axes.size else None
    if a is not None:
        for name in names:
            live = results[name]
            a.bar(name, live["lag"]["queries"].get("mean", 0), color="C4")
        a.set(title="feedback not yet seen by a query (mean, queries)", ylabel="queries")
        a.tick_params(axis="x", labelsize=8, rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
