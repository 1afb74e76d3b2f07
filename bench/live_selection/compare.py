"""The live curve against the replay's band: per window of queries, the live accuracy, the replay's mean and
its range over the seeds; the share of windows whose live accuracy lies in the range, against the share
expected by chance alone (a live stream that is one more draw of the same process lies in the range of ``s``
seeds with probability ``(s - 1) / (s + 1)``); where the live stream's whole accuracy ranks among the seeds'.

Lags: how many feedback updates a query's selection had not seen yet (``t - visible[t]``), in queries and in
milliseconds (the age of the oldest update it had not seen)."""

from __future__ import annotations

from typing import Any

import numpy as np


def window_means(correct: np.ndarray, window: int) -> np.ndarray:
    """Accuracy per window of ``window`` queries (the last one shorter when ``window`` does not divide)."""
    c = np.asarray(correct, float)
    return np.array([c[i : i + window].mean() for i in range(0, len(c), window)])


def band(live: np.ndarray, replays: np.ndarray, window: int) -> dict[str, Any]:
    """``live``: right or wrong per query; ``replays``: [seeds, queries] of the same."""
    lw = window_means(live, window)
    rw = np.stack([window_means(r, window) for r in replays])
    lo, hi, mean = rw.min(0), rw.max(0), rw.mean(0)
    inside = (lw >= lo - 1e-12) & (lw <= hi + 1e-12)
    seeds = len(replays)
    totals = replays.mean(1)
    live_total = float(np.mean(live))
    return {
        "live_accuracy": live_total,
        "replay_accuracy": {"mean": float(totals.mean()), "min": float(totals.min()), "max": float(totals.max())},
        "live_rank": int(np.sum(totals < live_total - 1e-12)),  # seeds below the live stream (of `seeds`)
        "windows_inside": int(inside.sum()),
        "windows": len(lw),
        "inside_share": float(inside.mean()),
        "inside_share_by_chance": (seeds - 1) / (seeds + 1),
        "per_window": [
            {"start": i * window, "live": float(a), "mean": float(m), "lo": float(b), "hi": float(c), "inside": bool(d)}
            for i, (a, m, b, c, d) in enumerate(zip(lw, mean, lo, hi, inside, strict=True))
        ],
    }


def moving(correct: np.ndarray, window: int) -> np.ndarray:
    """Accuracy over the last ``window`` queries, from query ``window - 1`` on."""
    return np.convolve(np.asarray(correct, float), np.ones(window) / window, mode="valid")


def lags(
    visible: np.ndarray, query_at: np.ndarray, feedback_at: np.ndarray, due: np.ndarray | None = None
) -> dict[str, Any]:
    """``visible[t]``: updates seen by query ``t``; ``query_at[t]`` / ``feedback_at[t]``: when query ``t`` and its
    feedback were sent (seconds); ``due[t]``: the updates there were to see (default ``t``; per user: the user's
    earlier queries, and then no age is given)."""
    n = len(visible)
    behind = (np.arange(n) if due is None else np.asarray(due)) - np.asarray(visible)
    out: dict[str, Any] = {"queries": _stats(behind)}
    if due is None:  # the age of the oldest update it had not seen: feedback visible[t], sent before query t
        ages = [(query_at[t] - feedback_at[visible[t]]) * 1000 if behind[t] > 0 else 0.0 for t in range(n)]
        out["ms"] = _stats(np.array(ages))
    return out


def _stats(v: np.ndarray) -> dict[str, float]:
    v = np.asarray(v, float)
    if v.size == 0:
        return {}
    return {
        "mean": round(float(v.mean()), 2),
        "p50": round(float(np.percentile(v, 50)), 2),
        "p95": round(float(np.percentile(v, 95)), 2),
        "max": round(float(v.max()), 2),
    }
