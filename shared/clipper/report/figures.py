"""The selection report, computed from feedback log entries (pure: no I/O, no clock).

- ``models``: each model's answers judged by feedback and their mean loss, overall and per answering version.
- ``loss_over_time``: the same per window of ``window`` consecutive feedbacks (oldest first).
- ``exp3_regret``: for the policies that ask one model a query (``exp3``, ``epsilon_greedy``), the regret of the
  models answered against the best single model in hindsight. With one model answering, the others' losses on
  that query are never observed, so each model's cumulative loss is estimated by importance weighting:
  L_j = sum over feedbacks of loss(j) * [j answered] / p(j), with p(j) the probability the selection drew j with
  (recorded with the prediction). That estimate is unbiased for each model; the regret is the loss of the answers
  minus the least L_j. The minimum of noisy estimates leans low, so early regret leans high. The empirical
  alternative (each model's mean loss over its own answers, times the number of feedbacks) is given beside it as
  ``empirical``. Feedback whose answering model has no recorded probability is counted in ``skipped``.
- ``exp4_calibration``: for ensembles (several models asked, a confidence recorded), the answer's error by
  confidence bucket, with each member's mean loss on the same feedbacks for comparison. An answer that was the
  application's default (no model replied, or under the confidence threshold with default_when_unsure) is counted
  in ``defaults`` and not judged.
- ``canary``: per model where more than one version answered or a canary decision was made, the per-version
  split and the decisions (events) given by the caller.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from clipper.report.entry import FeedbackEntry

ONE_MODEL_POLICIES = ("exp3", "epsilon_greedy")
MAX_CURVE_POINTS = 200
REGRET_ESTIMATE = "importance_weighted"


def _mean(total: float, n: int) -> float | None:
    return total / n if n else None


class _Tally:
    def __init__(self) -> None:
        self.total = 0.0
        self.n = 0

    def add(self, x: float) -> None:
        self.total += x
        self.n += 1

    def as_dict(self) -> dict[str, Any]:
        return {"answers": self.n, "mean_loss": _mean(self.total, self.n)}


def selection_report(
    entries: Sequence[FeedbackEntry],
    window: int | None = None,
    buckets: int = 10,
    canary_events: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Every figure of the report. ``window``: feedbacks per point of ``loss_over_time`` (default: about 20
    points); ``buckets``: equal confidence buckets over [0, 1]; ``canary_events``: decisions per model."""
    if window is not None and window < 1:
        raise ValueError("window must be at least 1")
    if buckets < 1:
        raise ValueError("buckets must be at least 1")
    ordered = sorted(entries, key=lambda e: e.time)
    window = window or max(1, math.ceil(len(ordered) / 20))
    return {
        "feedbacks": len(ordered),
        "first": ordered[0].time if ordered else None,
        "last": ordered[-1].time if ordered else None,
        "policies": dict(Counter(e.policy for e in ordered)),
        "models": models(ordered),
        "answers": answers(ordered),
        "loss_over_time": loss_over_time(ordered, window),
        "exp3_regret": exp3_regret(ordered),
        "exp4_calibration": exp4_calibration(ordered, buckets),
        "canary": canary(ordered, canary_events or {}),
    }


def models(entries: Sequence[FeedbackEntry]) -> dict[str, Any]:
    overall: dict[str, _Tally] = {}
    by_version: dict[str, dict[str, _Tally]] = {}
    for e in entries:
        for m, x in e.losses.items():
            overall.setdefault(m, _Tally()).add(x)
            by_version.setdefault(m, {}).setdefault(e.versions.get(m, "?"), _Tally()).add(x)
    return {
        m: {**overall[m].as_dict(), "versions": {v: t.as_dict() for v, t in sorted(by_version[m].items())}}
        for m in sorted(overall)
    }


def answers(entries: Sequence[FeedbackEntry]) -> dict[str, Any]:
    judged = [e.answer_loss for e in entries if e.answer_loss is not None]
    return {
        "judged": len(judged),
        "mean_loss": _mean(math.fsum(judged), len(judged)),
        "defaults": sum(1 for e in entries if e.default),
        "not_recorded": sum(1 for e in entries if e.answer_loss is None and not e.default),
    }


def loss_over_time(entries: Sequence[FeedbackEntry], window: int) -> dict[str, Any]:
    points = []
    for start in range(0, len(entries), window):
        chunk = entries[start : start + window]
        per: dict[str, _Tally] = {}
        judged = _Tally()
        for e in chunk:
            for m, x in e.losses.items():
                per.setdefault(m, _Tally()).add(x)
            if e.answer_loss is not None:
                judged.add(e.answer_loss)
        points.append(
            {
                "start": chunk[0].time,
                "end": chunk[-1].time,
                "feedbacks": len(chunk),
                "mean_loss": {m: _mean(t.total, t.n) for m, t in sorted(per.items())},
                "answers": {m: t.n for m, t in sorted(per.items())},
                "answer_loss": _mean(judged.total, judged.n),
            }
        )
    return {"window": window, "points": points}


def exp3_regret(entries: Sequence[FeedbackEntry]) -> dict[str, Any]:
    one = [e for e in entries if e.policy in ONE_MODEL_POLICIES and len(e.models) == 1 and e.models[0] in e.losses]
    estimated: dict[str, float] = {}  # importance-weighted cumulative loss per model
    own: dict[str, _Tally] = {}  # each model's losses on its own answers
    learner, skipped, n = 0.0, 0, 0
    curve: list[dict[str, Any]] = []
    every = max(1, math.ceil(len(one) / MAX_CURVE_POINTS))
    for i, e in enumerate(one):
        chosen = e.models[0]
        p = e.probabilities.get(chosen, 0.0)
        if not p > 0.0:
            skipped += 1
            continue
        for m in e.probabilities:
            estimated.setdefault(m, 0.0)
        x = e.losses[chosen]
        n += 1
        learner += x
        estimated[chosen] += x / p
        own.setdefault(chosen, _Tally()).add(x)
        if (i + 1) % every == 0 or i == len(one) - 1:
            curve.append(
                {
                    "feedbacks": n,
                    "time": e.time,
                    "regret": learner - min(estimated.values()),
                    "empirical": _empirical(learner, n, own),
                }
            )
    best = min(estimated, key=lambda m: (estimated[m], m)) if estimated else None
    return {
        "policies": sorted({e.policy for e in one}),
        "estimate": REGRET_ESTIMATE,
        "feedbacks": n,
        "skipped": skipped,
        "loss": learner,
        "mean_loss": _mean(learner, n),
        "best_model": best,
        "regret": learner - estimated[best] if best is not None else None,
        "empirical": _empirical(learner, n, own),
        "estimated_mean_loss": {m: estimated[m] / n for m in sorted(estimated)} if n else {},
        "answers": {m: t.n for m, t in sorted(own.items())},
        "curve": curve,
    }


def _empirical(learner: float, n: int, own: Mapping[str, _Tally]) -> float | None:
    means = [t.total / t.n for t in own.values() if t.n]
    return learner - n * min(means) if means else None


class _Bucket:
    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high
        self.feedbacks = self.defaults = 0
        self.loss = _Tally()
        self.confidence = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "low": self.low,
            "high": self.high,
            "feedbacks": self.feedbacks,
            "defaults": self.defaults,
            "judged": self.loss.n,
            "error": _mean(self.loss.total, self.loss.n),
            "mean_confidence": _mean(self.confidence, self.loss.n),
        }


def exp4_calibration(entries: Sequence[FeedbackEntry], buckets: int) -> dict[str, Any]:
    ensemble = [e for e in entries if e.confidence is not None]
    rows = [_Bucket(i / buckets, (i + 1) / buckets) for i in range(buckets)]
    members: dict[str, _Tally] = {}
    judged = _Tally()
    for e in ensemble:
        c = min(1.0, max(0.0, float(e.confidence or 0.0)))
        row = rows[min(int(c * buckets), buckets - 1)]
        row.feedbacks += 1
        row.defaults += e.default
        if e.answer_loss is None:
            continue
        row.loss.add(e.answer_loss)
        row.confidence += c
        judged.add(e.answer_loss)
        for m, x in e.losses.items():
            members.setdefault(m, _Tally()).add(x)
    member_loss = {m: t.total / t.n for m, t in sorted(members.items())}
    best = min(member_loss, key=lambda m: (member_loss[m], m)) if member_loss else None
    return {
        "feedbacks": len(ensemble),
        "judged": judged.n,
        "error": _mean(judged.total, judged.n),
        "buckets": [r.as_dict() for r in rows],
        "member_loss": member_loss,
        "best_member": best,
    }


def canary(entries: Sequence[FeedbackEntry], events: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    split = models(entries)
    out: dict[str, Any] = {}
    for m in sorted(set(split) | set(events)):
        versions = split.get(m, {}).get("versions", {})
        if len(versions) > 1 or events.get(m):
            out[m] = {"versions": versions, "events": [dict(ev) for ev in events.get(m, ())]}
    return out
