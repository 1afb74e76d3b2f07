"""The pure parts of a trial: the Poisson schedule, the counting of outcomes, the verdict and the early check
that a trial can no longer pass.

Every query of a trial ends as one outcome: ``REAL`` (a 200 answer from a model), ``DEFAULT`` (a 200 answer
with ``"default": true``: the system gave up on the model), ``ERROR`` (any other status, a broken connection)
or ``TIMEOUT`` (no answer within the request timeout), or ``UNSENT`` (not counted: the trial stopped, its verdict
settled, before the query was sent or answered).
A query's latency runs from its *scheduled* send time, so a late generator counts against the system, never
for it; a query that is not a real answer has an infinite latency. A trial passes when, over its measured
queries (those scheduled after the warm-up), the nearest-rank p99 latency is within the SLO and at least
99.9 % are real answers.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.frontdoor.config import REAL_PER_1000, WITHIN_PER_100

REAL, DEFAULT, ERROR, TIMEOUT, UNSENT, PENDING = 0, 1, 2, 3, 4, 5
MISSES = (DEFAULT, ERROR, TIMEOUT)


def poisson_offsets(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Send times (seconds from the start) of an open-loop Poisson process: exponential gaps of mean 1/rate,
    every arrival before ``duration_s``."""
    if rate <= 0 or duration_s <= 0:
        return np.zeros(0)
    expected = rate * duration_s
    chunk = int(expected + 6 * math.sqrt(expected) + 16)
    gaps = rng.exponential(1.0 / rate, size=chunk)
    offsets = np.cumsum(gaps)
    while offsets[-1] < duration_s:
        offsets = np.concatenate([offsets, offsets[-1] + np.cumsum(rng.exponential(1.0 / rate, size=chunk))])
    return offsets[offsets < duration_s]


def nearest_rank(sorted_values: np.ndarray, q: float) -> float:
    """The nearest-rank ``q`` quantile of ascending values (inf when there are none)."""
    if len(sorted_values) == 0:
        return math.inf
    return float(sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)])


def verdict(measured: int, within_slo: int, real: int) -> bool:
    """Whether a trial passes: nearest-rank p99 within the SLO (at least 99 % of the measured queries are real
    answers within it) and at least 99.9 % real answers. Integer arithmetic: a near miss is a miss."""
    return measured > 0 and 100 * within_slo >= WITHIN_PER_100 * measured and 1000 * real >= REAL_PER_1000 * measured


def certainly_fails(planned: int, not_within: int, misses: int) -> bool:
    """Whether a trial of ``planned`` measured queries fails whatever the rest do: ``not_within`` of them are
    already not real answers within the SLO, ``misses`` not real answers at all."""
    return not verdict(planned, planned - not_within, planned - misses)


@dataclass
class TrialRecord:
    """What the generator saw in one trial (arrays indexed by query)."""

    offsets: np.ndarray  # scheduled send times, seconds from the start
    latency_s: np.ndarray  # answer time - scheduled time (nan without an answer)
    outcome: np.ndarray  # REAL, DEFAULT, ERROR, TIMEOUT, UNSENT (int8)
    late_s: np.ndarray  # actual send time - scheduled time (nan when unsent)
    warmup_s: float
    wall_s: float
    cpu_s: float  # the generator process's CPU time during the trial
    stopped_early: bool = False
    connections: int = 0
    causes: dict[int, str] = field(default_factory=dict)  # query -> its default's explanation


def summarize(record: TrialRecord, slo_ms: float, rate: float) -> dict[str, Any]:
    """The trial's figures and verdict. Percentiles count every miss as an infinite latency (null in JSON)."""
    measured = record.offsets >= record.warmup_s
    outcome = record.outcome[measured]
    sent = outcome != UNSENT
    n = int(sent.sum())
    real_mask = outcome == REAL
    latency_ms = np.where(real_mask, record.latency_s[measured] * 1000, np.inf)[sent]
    ordered = np.sort(latency_ms)
    real = int(real_mask.sum())
    within = int(np.sum(latency_ms <= slo_ms))
    offsets = record.offsets[measured][sent]  # a trial stopped early: the window of what it sent
    window_s = float(offsets[-1] - offsets[0]) if len(offsets) > 1 else 0.0
    late = record.late_s[~np.isnan(record.late_s)]
    answered = np.sort(record.latency_s[measured][np.isin(outcome, (REAL, DEFAULT))] * 1000)
    ok = verdict(n, within, real) and not record.stopped_early
    return {
        "offered_rate": round(rate, 1),
        "queries": n,
        "achieved_rate": round(real / window_s, 1) if window_s > 0 else 0.0,
        "real": real,
        "defaults": int(np.sum(outcome == DEFAULT)),
        "errors": int(np.sum(outcome == ERROR)),
        "timeouts": int(np.sum(outcome == TIMEOUT)),
        "within_slo": within,
        "real_fraction": round(real / n, 5) if n else 0.0,
        **{f"p{q}_ms": _finite(nearest_rank(ordered, q / 100)) for q in (50, 90, 99)},
        "max_ms": _finite(float(ordered[-1])) if n else None,
        "answered_p50_ms": _finite(nearest_rank(answered, 0.5)),
        "answered_p99_ms": _finite(nearest_rank(answered, 0.99)),
        "ok": ok,
        "stopped_early": record.stopped_early,
        "seconds": round(record.wall_s, 2),
        "generator_late_p99_ms": round(nearest_rank(np.sort(late), 0.99) * 1000, 3) if len(late) else None,
        "generator_cpu_fraction": round(record.cpu_s / record.wall_s, 3) if record.wall_s > 0 else None,
        "connections": record.connections,
        "default_causes": default_causes(record, measured),
    }


def cause_of(text: str) -> str:
    """A default's explanation without the parts that differ per query (the parenthesised addresses, times):
    which stage the stack gave up in."""
    return text.split(" (", 1)[0][:120]


def default_causes(record: TrialRecord, measured: np.ndarray) -> dict[str, int]:
    """The measured defaults counted by their explanation (``cause_of``), the thing a failing trial's defaults
    say."""
    counted = Counter(cause_of(cause) for i, cause in record.causes.items() if measured[i])
    return dict(counted.most_common())


def _finite(value: float) -> float | None:
    return round(value, 3) if math.isfinite(value) else None
