"""One experiment's figures: the live run beside its replays over the same inputs, order and labels.

Two replays, each over ``seeds`` policy seeds: ``instant`` (every feedback seen by the next query, as
``bench/selection.py`` replays) and ``as_seen`` (each query chosen from the state the live frontend chose from:
its record's ``state_version``). Where the live run asked a model, its recorded output is checked against the
offline prediction for the same input and version (``output_mismatches``: 0 when the replay's inputs are the
live ones)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.live_selection.compare import band, lags
from bench.live_selection.config import SEED
from bench.live_selection.driver import LiveRun
from bench.live_selection.replay import replay, replay_users
from bench.live_selection.streams import Stream
from bench.selection_recovery import recovery
from clipper.selection import policy_for

Preds = dict[str, np.ndarray]


@dataclass
class Case:
    """What one experiment ran: its stream, the models' outputs per query, the live run."""

    name: str
    policy: str
    models: list[str]
    stream: Stream
    preds: Preds  # per model, its output for each query (the broken version's after a fault)
    live: LiveRun
    versions: dict[str, list[str]]  # per model, the version that answers each query
    app_lag: int = 0  # users: the application's lag (queries) assumed where a user had no state yet


def visible_from(live: LiveRun) -> np.ndarray:
    """Each query's ``state_version``; a query without a record takes its predecessor's."""
    v = live.visible()
    for t in range(len(v)):
        if v[t] < 0:
            v[t] = v[t - 1] if t else 0
    return v


def user_due(users: np.ndarray) -> np.ndarray:
    """How many earlier queries each query's user had sent."""
    counts: dict[int, int] = {}
    due = np.zeros(len(users), np.int64)
    for t, u in enumerate(users.tolist()):
        due[t] = counts.get(u, 0)
        counts[u] = due[t] + 1
    return due


def replays(case: Case, seeds: int, visible: np.ndarray | None) -> np.ndarray:
    policy = policy_for(case.policy)
    s = case.stream
    out = []
    for k in range(seeds):
        seed = SEED * 1000 + k
        if s.users is not None and case.name.startswith("user"):
            app_visible = None if visible is None else np.maximum(0, np.arange(len(s)) - case.app_lag)
            out.append(replay_users(policy, case.models, case.preds, s.y, s.users, seed, visible, app_visible))
        else:
            out.append(replay(policy, case.models, case.preds, s.y, seed, visible))
    return np.stack(out)


def mismatches(case: Case) -> dict[str, int]:
    """Recorded model outputs that differ from the offline prediction, and versions other than expected."""
    wrong_output = wrong_version = 0
    for t, r in enumerate(case.live.records):
        if not r:
            continue
        for m, o in r.get("outputs", {}).items():
            wrong_output += o != int(case.preds[m][t])
        for m, v in (r.get("versions") or {}).items():
            wrong_version += str(v) != case.versions[m][t]
    return {"output_mismatches": wrong_output, "version_mismatches": wrong_version}


def analyse(case: Case, seeds: int, window: int, fault_at: int | None = None) -> dict[str, Any]:
    s, live = case.stream, case.live
    correct = live.correct(s.y)
    visible = visible_from(live)
    per_user = case.name.startswith("user")
    instant = replays(case, seeds, None)
    as_seen = replays(case, seeds, visible)
    q_at, f_at = np.array(live.query_at), np.array(live.feedback_at)
    out: dict[str, Any] = {
        "policy": case.policy,
        "models": case.models,
        "live": live.summary(),
        **mismatches(case),
        "lag": lags(visible, q_at, f_at, user_due(s.users) if per_user and s.users is not None else None),
        "instant": band(correct, instant, window),
        "as_seen": band(correct, as_seen, window),
        "fixed_models": {m: float(np.mean(case.preds[m] == s.y)) for m in case.models},
        "curves": {"live": correct, "instant": instant.mean(0), "as_seen": as_seen.mean(0)},
        "bands": {"instant": instant, "as_seen": as_seen},
    }
    if per_user:
        out["app_lag_assumed_for_new_users"] = case.app_lag
    if fault_at is not None:
        out["fault_at"] = fault_at
        curves = {"live": correct.astype(float), "instant": instant.mean(0), "as_seen": as_seen.mean(0)}
        pass_len = len(s) // _passes(s)
        out["recovery"] = {name: fault_recovery(c, fault_at, pass_len, window) for name, c in curves.items()}
    return out


def _passes(s: Stream) -> int:
    rows = len(set(s.rows.tolist()))
    return max(1, len(s) // rows) if rows else 1


def fault_recovery(curve: np.ndarray, fault: int, pass_len: int, window: int) -> dict[str, Any]:
    """``bench/selection.py``'s figures: the accuracy in the pass before the fault and in the last pass, the
    sustained recovery to within 1 point of the former and the settling within 1 point of the latter."""
    before = float(curve[max(0, fault - pass_len) : fault].mean()) if fault else float("nan")
    after = float(curve[-pass_len:].mean())
    if len(curve) - fault < window:
        return {"accuracy_before": before, "accuracy_after": after}
    return {
        "accuracy_before": before,
        "accuracy_after": after,
        "recovery_queries": recovery(curve, fault, before, window)["recovery_queries"],
        "settling_queries": recovery(curve, fault, after, window)["recovery_queries"],
    }
