"""The canary reviewer: reads a running trial's evidence, decides (:func:`clipper.canary.decide`) and, on a
verdict, ends the trial and keeps the decision as an event with a metric.

It is the one part of ``clipper.canary`` that talks to ports (the registry, the evidence store, the control that
ends a trial, the metrics); the decision itself stays pure. Any number of reviewers may run at once (one per
feedback worker, a scheduled function): ``CanaryControl.end_canary`` ends a trial only if it still runs, and
only the reviewer whose call ended it writes the event and counts the metric, so a decision is recorded once.

Run it where evidence arrives: the local stack's feedback worker reviews the running canaries each second,
looking for them every 10 s and reviewing at once those whose evidence its feedback grew (``run``); on AWS a
scheduled function reviews every minute and the feedback function reviews the models whose evidence its batch
grew.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from clipper.canary.decision import Decision, decide
from clipper.canary.evidence import CanaryEvidence, VersionEvidence
from clipper.core.domain import Canary
from clipper.errors import NotFound, Unavailable
from clipper.ports import CanaryControl, CanaryDecisionMetrics, CanaryEvidenceStore, Clock, Registry

logger = logging.getLogger(__name__)


def decision_event(model: str, canary: Canary, active: str, decision: Decision, at: float) -> dict[str, Any]:
    """The event of a decision: its kind, rule, reason, statistic, threshold, figures and evidence, with the
    trial, the two versions compared, the version active after it, who decided ("reviewer", as the operator's
    events say "operator") and when (``at``, seconds since the epoch)."""
    return decision.to_dict() | {
        "who": "reviewer",
        "at": at,
        "model": model,
        "trial": canary.trial,
        "version": canary.version,
        "versions": {"current": active, "canary": canary.version},
        "active_version": canary.version if decision.kind == "promote" else active,
        "previous_version": active,
    }


class CanaryReviewer:
    def __init__(
        self,
        registry: Registry,
        evidence: CanaryEvidenceStore,
        control: CanaryControl,
        metrics: CanaryDecisionMetrics,
        clock: Clock,
        model_names: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        """``registry``: read fresh (not a copy minutes old: a decision acts on the trial it read).
        ``model_names``: the models ``review_all`` reviews (every model, or those with a canary); by default the
        registry's ``model_names``."""
        self._registry = registry
        self._evidence = evidence
        self._control = control
        self._metrics = metrics
        self._clock = clock
        self._model_names = model_names or getattr(registry, "model_names", None)

    def review(self, model: str) -> Decision | None:
        """Decide on the model's running canary: None when none runs, or when another reviewer (or an operator)
        ended the trial first; else the decision (``continue`` changes nothing)."""
        running = self._running(model)
        if running is None:
            return None
        canary, active = running
        counts = self._evidence.load(model, canary.trial)
        evidence = CanaryEvidence(counts.get(active, VersionEvidence()), counts.get(canary.version, VersionEvidence()))
        decision = decide(evidence, canary.params)
        if decision.kind == "continue":
            return decision
        if not self._control.end_canary(model, canary.trial, promote=decision.kind == "promote"):
            logger.info("canary trial already ended", extra={"model": model, "trial": canary.trial})
            return None
        logger.warning(
            "canary decision",
            extra={"model": model, "trial": canary.trial, "kind": decision.kind, "reason": decision.reason},
        )
        try:
            self._control.add_canary_event(model, decision_event(model, canary, active, decision, self._clock.now()))
        finally:  # the trial ended either way: the metric (and its alarm) must say so
            self._metrics.decision(model, decision.kind)
        return decision

    def _running(self, model: str) -> tuple[Canary, str] | None:
        """The model's canary and active version, in one read where the registry offers ``model_record``."""
        record_of = getattr(self._registry, "model_record", None)
        if record_of is not None:
            try:
                head = record_of(model).head
            except NotFound:
                return None
            return (head.canary, head.active_version) if head.canary is not None else None
        canary = self._registry.canary(model)
        if canary is None:
            return None
        return canary, self._registry.active_version(model).version

    def review_all(self) -> dict[str, Decision]:
        """Review every model with a canary; one model's failure is logged and the others are reviewed."""
        decisions = {}
        for model in self._names():
            _, decision = self._review_logged(model)
            if decision is not None:
                decisions[model] = decision
        return decisions

    def review_many(self, models: Iterable[str]) -> None:
        """Review these models (those whose evidence just grew); failures are logged."""
        for model in sorted(models):
            self._review_logged(model)

    def _review_logged(self, model: str) -> tuple[bool, Decision | None]:
        """``review``, its failure logged: (False, None) when it failed (the registry or the evidence store
        unavailable: the next round tries again; anything else with its traceback)."""
        ok, decision, unavailable = self._review_caught(model)
        if unavailable is not None:
            logger.warning("canary review of %s waits: %s", model, unavailable)
        return ok, decision

    def _review_caught(self, model: str) -> tuple[bool, Decision | None, Unavailable | None]:
        """``review``: (whether it ran, its decision, the store's unavailability it met, not logged: the caller
        says it); any other failure is logged with its traceback."""
        try:
            return True, self.review(model), None
        except Unavailable as e:
            return False, None, e
        except Exception:
            logger.exception("canary review failed", extra={"model": model})
            return False, None, None

    def run(
        self,
        stop: threading.Event,
        every_s: float = 1.0,
        touched: Callable[[], Iterable[str]] | None = None,
        sweep_s: float = 0.0,
    ) -> None:
        """Review every model with a canary each ``every_s`` until ``stop``; no failure stops the loop. The
        registry unavailable (a throttle, the local emulator restarting) is one warning when it starts and one
        line when it ends, not a traceback a second.

        With ``touched`` (the models whose evidence grew since it was last called: ``FeedbackProcessor.take_touched``)
        the models with a canary are found each ``sweep_s`` (a scan of the registry's models), not each round: a
        round reviews those found at the last sweep and still running, and the touched ones. So an idle registry
        is scanned each ``sweep_s`` rather than each second, a running canary is still reviewed each round (its
        error and SLO guards need no feedback), and one started since the last sweep is reviewed once its
        feedback comes or at the next sweep."""
        down = False
        running: set[str] = set()
        swept = time.monotonic() - sweep_s  # the first round sweeps
        while not stop.wait(every_s):
            try:
                if touched is None:
                    self.review_all()
                else:
                    if time.monotonic() - swept >= sweep_s:
                        running = set(self._names())  # (unavailable: the touched ones wait for the next round)
                        swept = time.monotonic()
                    running, unavailable = self._review_running(running | set(touched()))
                    if unavailable is not None:
                        raise unavailable  # said once while it lasts, as a round's scan failing is
            except Unavailable as e:
                if not down:
                    logger.warning("canary reviews wait for the registry: %s", e)
                down = True
                continue
            except Exception:
                logger.exception("canary review round failed")
            if down:
                logger.warning("canary reviews go on: the registry answers again")
                down = False

    def _names(self) -> Iterable[str]:
        if self._model_names is None:
            raise TypeError("the registry lists no models: give the reviewer model_names")
        return self._model_names()

    def _review_running(self, models: set[str]) -> tuple[set[str], Unavailable | None]:
        """Review these models: those whose canary still runs, or whose review failed, and the registry's or the
        evidence store's unavailability if a review met it (the others are still reviewed)."""
        still: set[str] = set()
        unavailable = None
        for model in sorted(models):
            ok, decision, down = self._review_caught(model)
            unavailable = unavailable or down
            if not ok or (decision is not None and decision.kind == "continue"):
                still.add(model)
        return still, unavailable
