"""Canary rollout decisions from live evidence (pure: no I/O, no clock, no environment).

``evidence`` holds the per-version counters (feedback labels and their loss, queries, endpoint errors, SLO
misses) that the serving path accumulates; ``statistics`` the two tests (a sequential probability ratio
test on the loss rates, and a rate guard on errors and SLO misses); ``decision`` the rule that turns the
evidence into a verdict (:func:`decide` -> :class:`Decision`: promote, rollback or continue).

Error rates, measured by simulation at the defaults (alpha 5%, beta 10%, margin 0.05; the table is in
``statistics``): a canary as good as the current version was rolled back in at most 5.9% of runs (1.1%
at a 0.05 loss rate and 10% of the traffic), a canary worse by the margin promoted in at most 9.9%; the
error and SLO guard rolled back 0.55% of canaries that failed as often as the current version (level 1%).
The caller feeds :func:`decide` the merged evidence whenever it likes (every feedback, every minute):
looking more often does not change these figures much, and only a ``promote`` or ``rollback`` needs an
event.

    >>> from clipper.canary import CanaryEvidence, VersionEvidence, decide
    >>> current = VersionEvidence(feedback=900, loss_sum=27.0)
    >>> canary = VersionEvidence(feedback=100, loss_sum=15.0)
    >>> decide(CanaryEvidence(current, canary)).kind
    'rollback'
"""

from __future__ import annotations

from clipper.canary.decision import CanaryParams, Decision, Kind, Rule, decide
from clipper.canary.evidence import CanaryEvidence, VersionEvidence

__all__ = ["CanaryEvidence", "CanaryParams", "Decision", "Kind", "Rule", "VersionEvidence", "decide"]
