"""The canary decision: promote, roll back or continue, from the evidence so far.

:func:`decide` applies these rules in order and returns the first verdict (a :class:`Decision`):

1. ``error-guard``, then ``slo-guard``: roll back, without waiting for feedback, when the canary's endpoint
   errors (then its SLO misses) are more frequent than the current version's with confidence: the rate
   guard of :mod:`clipper.canary.statistics` reaches ``log(1 / guard_alpha)`` for a rate ``guard_ratio``
   times the current one, and the canary has at least ``guard_min_events`` such events.
2. ``min-feedback``: continue while either version has fewer than ``min_feedback`` feedback labels.
3. ``loss-sprt``: the loss SPRT; roll back when the canary is worse with confidence, promote when it is
   not worse by more than ``margin``, else continue.
4. ``max-feedback``: once the canary has ``max_feedback`` labels without a verdict, decide on the side
   the evidence leans to: promote when the log likelihood ratio is at most 0 (the canary's loss is closer
   to the current version's than to ``margin`` worse), else roll back.

Every decision carries the rule that made it, a sentence saying why, the statistic and the threshold it
was compared with (for ``continue`` from the SPRT, the roll-back boundary), the evidence and the figures
computed from it: what an event, a metric or an alarm needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from clipper.canary.evidence import CanaryEvidence, VersionEvidence
from clipper.canary.statistics import loss_sprt, rate_guard
from clipper.errors import InvalidInput

Kind = Literal["promote", "rollback", "continue"]
Rule = Literal["error-guard", "slo-guard", "min-feedback", "loss-sprt", "max-feedback"]
# The guards, in order: their rule, the evidence field they count, and what they call it.
_GUARDS: tuple[tuple[Rule, str, str], ...] = (
    ("error-guard", "errors", "endpoint error"),
    ("slo-guard", "slo_misses", "SLO miss"),
)


MIN_PARAM = 1e-9  # the smallest probability or margin a canary takes


@dataclass(frozen=True)
class CanaryParams:
    """The decision's parameters. Rates and margins are absolute (a loss rate of 0.05 is 5 points).

    ``alpha``: the probability of rolling back a canary as good as the current version (loss test).
    ``beta``: the probability of promoting a canary worse by ``margin``.
    ``min_feedback``: labels each version needs before the loss test speaks.
    ``max_feedback``: canary labels after which the test stops and the side it leans to wins.
    ``guard_alpha``, ``guard_ratio``, ``guard_min_events``: the error and SLO guards roll a canary back
    when its rate is ``guard_ratio`` times the current one's at level ``guard_alpha``, once it has at
    least ``guard_min_events`` errors (or misses).
    """

    alpha: float = 0.05
    beta: float = 0.10
    margin: float = 0.05
    min_feedback: int = 50
    max_feedback: int = 5000
    guard_alpha: float = 0.01
    guard_ratio: float = 2.0
    guard_min_events: int = 5

    def __post_init__(self) -> None:
        # at least 1e-9: the registry stores them as DynamoDB numbers, which cannot be under 1e-130 (a margin of
        # 1e-200 was accepted, then refused by the store: a 503 for a bad parameter)
        for name in ("alpha", "beta", "guard_alpha"):
            if not MIN_PARAM <= getattr(self, name) < 0.5:
                raise InvalidInput(name, "a probability in [1e-9, 0.5)", repr(getattr(self, name)))
        if not MIN_PARAM <= self.margin <= 1.0:
            raise InvalidInput("margin", "a loss-rate difference in [1e-9, 1]", repr(self.margin))
        if not self.guard_ratio > 1.0:
            raise InvalidInput("guard_ratio", "a rate ratio above 1", repr(self.guard_ratio))
        if self.min_feedback < 1:
            raise InvalidInput("min_feedback", "at least 1", repr(self.min_feedback))
        if self.max_feedback < self.min_feedback:
            raise InvalidInput("max_feedback", f"at least min_feedback ({self.min_feedback})", repr(self.max_feedback))
        if self.guard_min_events < 1:
            raise InvalidInput("guard_min_events", "at least 1", repr(self.guard_min_events))


@dataclass(frozen=True)
class Decision:
    """A verdict on a canary and what it was made from."""

    kind: Kind
    rule: Rule
    reason: str
    statistic: float
    threshold: float
    evidence: CanaryEvidence
    figures: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (every number finite) for an event."""
        return {
            "kind": self.kind,
            "rule": self.rule,
            "reason": self.reason,
            "statistic": self.statistic,
            "threshold": self.threshold,
            "figures": dict(self.figures),
            "evidence": self.evidence.to_dict(),
        }


def decide(evidence: CanaryEvidence, params: CanaryParams | None = None) -> Decision:
    """The verdict on the canary from ``evidence`` (pure: same evidence, same decision)."""
    params = params or CanaryParams()
    for rule, field, what in _GUARDS:
        guarded = _guard(evidence, params, rule, field, what)
        if guarded is not None:
            return guarded
    return _loss_decision(evidence, params)


def _guard(evidence: CanaryEvidence, params: CanaryParams, rule: Rule, field: str, what: str) -> Decision | None:
    current, canary = evidence.current, evidence.canary
    current_events, canary_events = getattr(current, field), getattr(canary, field)
    if canary_events < params.guard_min_events:
        return None
    guard = rate_guard(
        current.queries,
        current_events,
        canary.queries,
        canary_events,
        ratio=params.guard_ratio,
        alpha=params.guard_alpha,
    )
    if guard is None or guard.log_lr < guard.threshold:
        return None
    reason = (
        f"rollback: the canary's {what} rate {_rate(canary_events, canary.queries)} is above the current "
        f"version's {_rate(current_events, current.queries)} with confidence (log likelihood ratio "
        f"{guard.log_lr:.2f} >= {guard.threshold:.2f}: rate x{params.guard_ratio:g} at level {params.guard_alpha:g})"
    )
    figures = {
        "current_rate": current_events / current.queries,
        "canary_rate": canary_events / canary.queries,
        "canary_share": guard.canary_share,
        "ratio": params.guard_ratio,
        "alpha": params.guard_alpha,
    }
    return Decision("rollback", rule, reason, guard.log_lr, guard.threshold, evidence, figures)


def _loss_decision(evidence: CanaryEvidence, params: CanaryParams) -> Decision:
    current, canary = evidence.current, evidence.canary
    fewest = min(current.feedback, canary.feedback)
    if fewest < params.min_feedback:
        reason = (
            f"continue: waiting for feedback (canary {canary.feedback}, current {current.feedback} labels; "
            f"{params.min_feedback} each before the loss test)"
        )
        figures = {"canary_feedback": float(canary.feedback), "current_feedback": float(current.feedback)}
        return Decision(
            "continue", "min-feedback", reason, float(fewest), float(params.min_feedback), evidence, figures
        )
    test = loss_sprt(
        current.feedback,
        current.loss_sum,
        canary.feedback,
        canary.loss_sum,
        margin=params.margin,
        alpha=params.alpha,
        beta=params.beta,
    )
    figures = {
        "current_loss_rate": current.loss_sum / current.feedback,
        "canary_loss_rate": canary.loss_sum / canary.feedback,
        "difference": test.difference,
        "information": test.information,
        "margin": params.margin,
        "promote_threshold": test.promote_below,
        "rollback_threshold": test.rollback_above,
    }
    rates = (
        f"canary loss {_loss(canary)} vs current {_loss(current)} (difference {test.difference:+.4f}, "
        f"margin {params.margin:g})"
    )
    if test.log_lr >= test.rollback_above:
        reason = (
            f"rollback: the canary is worse with confidence: {rates}; "
            f"log LR {test.log_lr:.2f} >= {test.rollback_above:.2f}"
        )
        return Decision("rollback", "loss-sprt", reason, test.log_lr, test.rollback_above, evidence, figures)
    if test.log_lr <= test.promote_below:
        reason = (
            f"promote: the canary is not worse by more than the margin: {rates}; "
            f"log LR {test.log_lr:.2f} <= {test.promote_below:.2f}"
        )
        return Decision("promote", "loss-sprt", reason, test.log_lr, test.promote_below, evidence, figures)
    if canary.feedback >= params.max_feedback:
        kind: Kind = "promote" if test.log_lr <= 0.0 else "rollback"
        leans = "not worse" if kind == "promote" else "closer to worse by the margin"
        reason = (
            f"{kind}: no verdict after {canary.feedback} canary labels (max {params.max_feedback}); the evidence "
            f"leans to {leans}: {rates}; log LR {test.log_lr:.2f} vs 0"
        )
        return Decision(kind, "max-feedback", reason, test.log_lr, 0.0, evidence, figures)
    reason = (
        f"continue: no verdict yet: {rates}; log LR {test.log_lr:.2f} in "
        f"({test.promote_below:.2f}, {test.rollback_above:.2f})"
    )
    return Decision("continue", "loss-sprt", reason, test.log_lr, test.rollback_above, evidence, figures)


def _rate(events: int, queries: int) -> str:
    return f"{events}/{queries} ({events / queries:.2%})" if queries else f"{events}/0"


def _loss(version: VersionEvidence) -> str:
    return f"{version.loss_sum:g}/{version.feedback} ({version.loss_sum / version.feedback:.4f})"
