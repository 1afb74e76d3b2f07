"""The search for the highest rate a system sustains: double from a start rate until a trial fails, then
bisect between the last rate that passed and the first that failed. Each rate is tried once: a near miss is a
miss. Pure: the trial is a function of the rate."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Trial = dict[str, Any]  # a trial's figures; "ok" says whether it passed


@dataclass
class SearchResult:
    rate: float  # the highest offered rate that passed (0: none did)
    at_rate: Trial | None  # that trial
    trials: list[Trial] = field(default_factory=list)  # every trial, in the order run
    capped: bool = False  # the rate reached ``cap`` and passed there: the true limit is at least ``rate``


def find_max_rate(
    measure: Callable[[float], Trial],
    start: float,
    *,
    floor: float,
    cap: float,
    refine_steps: int,
) -> SearchResult:
    """Highest rate whose trial passes, assuming that passing is monotone in the rate.

    From ``start``: while a trial fails, halve (giving up below ``floor``: rate 0); once one passes, double
    until a trial fails or the rate would pass ``cap`` (tried at ``cap`` itself once); then ``refine_steps``
    bisections between the highest pass and the lowest failure."""
    result = SearchResult(0.0, None)

    def attempt(rate: float) -> bool:
        trial = measure(rate)
        result.trials.append(trial)
        if trial["ok"] and rate > result.rate:
            result.rate, result.at_rate = rate, trial
        return bool(trial["ok"])

    rate = min(start, cap)
    hi = math.inf
    while not attempt(rate):
        hi, rate = rate, rate / 2
        if rate < floor:
            return result
    lo = rate
    while math.isinf(hi):
        if lo >= cap:
            result.capped = True
            return result
        rate = min(2 * lo, cap)
        if attempt(rate):
            lo = rate
        else:
            hi = rate
    for _ in range(refine_steps):
        rate = (lo + hi) / 2
        if attempt(rate):
            lo = rate
        else:
            hi = rate
    return result
