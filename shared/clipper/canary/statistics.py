"""The two tests behind a canary decision, as pure functions of counts.

**Loss test** (:func:`loss_sprt`): Wald's sequential probability ratio test of

    H0: the canary's loss rate equals the current version's      (d = 0)
    H1: the canary's loss rate is worse by ``margin``            (d = margin)

on the normal approximation of the difference of the two mean losses, ``D = canary - current``. Its
variance ``V = v_canary / n_canary + v_current / n_current`` is taken from the current version's rate
``p`` alone (smoothed to ``(losses + 1) / (n + 2)``, so that no loss yet does not claim an exact rate):
``v_current = p(1 - p)`` and ``v_canary`` the larger of ``p(1 - p)`` (its value under H0) and ``(p +
margin)(1 - p - margin)`` (under H1). Not estimating the canary's variance from the canary's own losses
matters: with a plug-in variance, a worse canary that starts lucky also looks precise, and the simulation
promoted up to 17% of canaries worse by the margin at beta = 10% (loss rates near 0.02-0.1, 10% of the
traffic); with this variance it stays at or below beta. In the information ``I = 1 / V`` the log likelihood
ratio of H1 against H0 is

    log LR = margin * I * (D - margin / 2)

(Whitehead's SPRT on the score and the information; the score ``D * I`` is a Brownian motion with drift
``d`` in information time). Wald's boundaries: ``log LR >= log((1 - beta) / alpha)`` accepts H1 (roll
back); ``log LR <= log(beta / (1 - alpha))`` accepts H0 (promote). For an exact likelihood ratio
watched continuously these give error rates alpha and beta exactly; watched from time to time, Wald's
inequalities bound them by ``alpha / (1 - beta)`` and ``beta / (1 - alpha)`` (5.6% and 10.5% at the
defaults). Ours is a normal approximation, so the rates were measured. A loss in [0, 1] with mean ``p``
has variance at most ``p(1 - p)``, so for losses that are not 0/1 the test is conservative.

Measured (defaults: alpha 0.05, beta 0.10, margin 0.05, min_feedback 50; 2,000 seeded simulated canaries
with 0/1 losses per cell, standard error about 0.5 point; "looks" is how often the evidence is decided on):

    canary share, looks                   loss rate  rolled back when equal  promoted when worse by margin
    10%, every 10 canary labels            0.05       1.1%                    4.8%
                                           0.2        3.6%                    6.9%
                                           0.3        3.8%                    7.3%
                                           0.5        3.9%                    8.7%
    10%, every canary label                0.02       0.1%                    4.6%
                                           0.1        2.5%                    6.8%
                                           0.3        4.3%                    9.1%
                                           0.5        5.3%                    8.4%
    50%, every canary label                0.02       0.5%                    2.9%
                                           0.1        5.9%                    5.7%
                                           0.3        5.4%                    8.5%
                                           0.5        4.9%                    9.9%

So the false-alarm rate (rolling back a canary as good as the current version) measured at most 5.9%
(alpha 5%, Wald's bound 5.6%), and a canary worse by the margin was promoted at most 9.9% of the time
(beta 10%). ``tests/unit/test_canary_simulation.py`` repeats the first block's 0.3 and 0.05 rows.
A decision took 120-540 canary labels on average at 10% of the traffic looking at every label (99th
percentile up to 1,800; the higher the loss rate, the more), and up to 970 on average at 50%.

**Rate guard** (:func:`rate_guard`): are the canary's endpoint errors (or SLO misses) more frequent than
the current version's? Given ``k`` such events in all, and the canary's share ``s`` of the queries, each
event is the canary's with probability ``s`` when the two rates are equal, and with ``s' = r s / (r s + 1
- s)`` when the canary's rate is ``r`` times the current one. The log likelihood ratio of ``s'`` against
``s`` over the events seen is a nonnegative martingale under equal rates, so by Ville's inequality it
ever reaches ``log(1 / alpha)`` with probability at most ``alpha``, however often it is looked at. It
needs no feedback at all. Measured: with both versions failing 2% of queries and the canary taking 10%,
0.55% of 2,000 canaries were rolled back over 20,000 queries each, looking every 100 queries (guard_alpha
1%); a canary failing 6% of its queries was rolled back in all 500 runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LossTest:
    """The loss SPRT at one point: the statistic and the two boundaries it is compared with."""

    log_lr: float
    promote_below: float  # log(beta / (1 - alpha)), negative
    rollback_above: float  # log((1 - beta) / alpha), positive
    difference: float  # canary mean loss - current mean loss
    information: float  # 1 / variance of the difference


def wald_bounds(alpha: float, beta: float) -> tuple[float, float]:
    """Wald's (lower, upper) boundaries on the log likelihood ratio for error rates alpha and beta."""
    return math.log(beta / (1.0 - alpha)), math.log((1.0 - beta) / alpha)


def loss_sprt(
    current_n: int,
    current_losses: float,
    canary_n: int,
    canary_losses: float,
    *,
    margin: float,
    alpha: float,
    beta: float,
) -> LossTest:
    """The SPRT statistic for the canary's loss against the current version's (both counts positive)."""
    if current_n <= 0 or canary_n <= 0:
        raise ValueError("the loss test needs feedback for both versions")
    difference = canary_losses / canary_n - current_losses / current_n
    rate = (current_losses + 1.0) / (current_n + 2.0)
    variance = max(_bernoulli_variance(rate), _bernoulli_variance(rate + margin)) / canary_n
    variance += _bernoulli_variance(rate) / current_n
    information = 1.0 / variance
    lower, upper = wald_bounds(alpha, beta)
    return LossTest(
        log_lr=margin * information * (difference - margin / 2.0),
        promote_below=lower,
        rollback_above=upper,
        difference=difference,
        information=information,
    )


def _bernoulli_variance(rate: float) -> float:
    rate = min(rate, 1.0)
    return rate * (1.0 - rate)


@dataclass(frozen=True)
class RateGuard:
    """The guard's statistic for one kind of event (errors or SLO misses)."""

    log_lr: float
    threshold: float  # log(1 / alpha)
    canary_share: float  # the canary's share of the queries


def rate_guard(
    current_queries: int,
    current_events: int,
    canary_queries: int,
    canary_events: int,
    *,
    ratio: float,
    alpha: float,
) -> RateGuard | None:
    """The guard's log likelihood ratio that the canary's event rate is ``ratio`` times the current one's,
    or None while either version has no queries (there is no share to compare with)."""
    if current_queries <= 0 or canary_queries <= 0:
        return None
    share = canary_queries / (canary_queries + current_queries)
    worse_share = ratio * share / (ratio * share + 1.0 - share)
    log_lr = canary_events * math.log(worse_share / share) + current_events * math.log(
        (1.0 - worse_share) / (1.0 - share)
    )
    return RateGuard(log_lr=log_lr, threshold=math.log(1.0 / alpha), canary_share=share)
