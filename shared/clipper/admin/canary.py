"""The canary operations of the management API: start a canary (a registered version takes a share of a model's
queries beside the active version), look at it (with its live evidence, what the decision would say now, and its
last events), and promote or abort it by hand. Every start and every end by hand is a canary event
(``who: "operator"``); the automatic decisions are the reviewer's (``clipper.canary``).

While a canary runs the active version is not switched by hand (``set_model_version``, ``rollback_model``,
``add_model`` with activate): 409 naming the canary; promote or abort it first. Deleting the canary's version
aborts the canary (an event says so)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from clipper.admin import schemas
from clipper.admin.compatibility import check_serves_linked_apps
from clipper.admin.views import no_version
from clipper.canary import CanaryEvidence, CanaryParams, VersionEvidence, decide
from clipper.core.domain import Application, Canary, Model, ModelRecord
from clipper.errors import ClipperError, Conflict
from clipper.ports import CanaryEvidenceStore

EVENTS_SHOWN = 10

logger = logging.getLogger(__name__)


def record_event(registry: CanaryRegistry, model: str, event: dict[str, Any]) -> bool:
    """Write a canary event once the change it records is made; whether it was written. A failure (a throttle, the
    table unreachable) is logged, not raised: the change stands, and a 503 would invite a retry that the change
    now refuses (a 409 "no canary running", a 404 for a deleted version), reading as if nothing had happened."""
    try:
        registry.add_canary_event(model, event)
        return True
    except ClipperError as e:
        logger.warning("canary event not recorded (the %s of %s stands): %s", event.get("kind"), model, e)
        return False


def said(answer: dict[str, Any], recorded: bool) -> dict[str, Any]:
    """A change's answer, saying ``event_recorded: false`` when its event was lost (``record_event``)."""
    return answer if recorded else {**answer, "event_recorded": False}


class CanaryRegistry(Protocol):
    def model_record(self, name: str) -> ModelRecord: ...

    def app_and_links(self, name: str) -> tuple[Application, list[str]]: ...

    def start_canary(
        self,
        model: str,
        version: str,
        share: float,
        now: float,
        params: CanaryParams | None = None,
        beside: str | None = None,
    ) -> Canary: ...

    def end_canary(self, model: str, trial: str, promote: bool) -> bool: ...

    def add_canary_event(self, model: str, event: dict[str, Any]) -> None: ...

    def canary_events(self, model: str, limit: int = 20) -> list[dict[str, Any]]: ...


def refuse_switch_while_canary(head: Model) -> None:
    """``Conflict`` (409) naming the running canary: the active version is not switched by hand under it."""
    c = head.canary
    if c is not None:
        raise Conflict(
            f"model {head.name} has a canary running ({head.name}:{c.version} on {c.share:.0%} of its queries, "
            f"trial {c.trial}): promote or abort it first (clipper canary {head.name} --promote or --abort)"
        )


def canary_info(canary: Canary) -> dict[str, Any]:
    return {**canary.to_dict(), "share_percent": round(canary.share * 100, 6)}


def start_canary(registry: CanaryRegistry, req: schemas.StartCanary, now: float) -> dict[str, Any]:
    """Start the canary; refused (nothing written) for an unknown model or version (404), the active version, a
    version that cannot serve an application linked to the model, or a bad parameter (400, naming it), or while
    another canary runs (409). Its start event lost (``record_event``): the answer says ``event_recorded: false``."""
    given = req.params.model_dump(exclude_none=True) if req.params is not None else {}
    params = CanaryParams(**given)  # InvalidInput naming the parameter (max_feedback below min_feedback...)
    record = registry.model_record(req.model_name)  # NotFound
    active = record.head.active_version
    candidate = record.versions.get(req.model_version)
    if candidate is None and req.model_version in record.rejected:
        raise no_version(record, req.model_version)  # its upload was rejected: the 404 says why
    if candidate is not None:  # an unknown version: the registry's 404 below
        # it answers a share of the queries, then all of them if promoted
        check_serves_linked_apps(registry, candidate, "model_version", record.linked_apps)
    # beside the active version read: what the answer and the start event say (ChangedMeanwhile: read again)
    canary = registry.start_canary(req.model_name, req.model_version, req.share_percent / 100, now, params, active)
    recorded = record_event(
        registry,
        req.model_name,
        {
            "kind": "start",
            "who": "operator",
            "at": now,
            "trial": canary.trial,
            "version": canary.version,
            "share": canary.share,
            "active_version": active,
            "params": canary.to_dict()["params"],
            "reason": f"{canary.version} started on {canary.share * 100:.10g}% of the queries beside {active}",
        },
    )
    return said({"model_name": req.model_name, "active_version": active, "canary": canary_info(canary)}, recorded)


def get_canary(
    registry: CanaryRegistry, evidence: CanaryEvidenceStore | None, model: str, events: int = EVENTS_SHOWN
) -> dict[str, Any]:
    """The model's canary (null when none runs), its evidence per version and the decision it would get now
    (when an evidence store is wired), and the model's last canary events, newest first."""
    head = registry.model_record(model).head  # NotFound
    out: dict[str, Any] = {
        "model_name": model,
        "active_version": head.active_version,
        "canary": canary_info(head.canary) if head.canary else None,
    }
    if head.canary is not None and evidence is not None:
        counted = evidence.load(model, head.canary.trial)
        pair = CanaryEvidence(
            counted.get(head.active_version, VersionEvidence()), counted.get(head.canary.version, VersionEvidence())
        )
        verdict = decide(pair, head.canary.params)
        out["evidence"] = {version: e.to_dict() for version, e in sorted(counted.items())}
        out["decision_now"] = {"kind": verdict.kind, "rule": verdict.rule, "reason": verdict.reason}
    out["events"] = registry.canary_events(model, events) if events else []
    return out


def end_by_hand(registry: CanaryRegistry, model: str, promote: bool, now: float) -> dict[str, Any]:
    """Promote (the canary's version becomes the active one; ``rollback_model`` returns to the one before) or
    abort (the active version keeps every query) the running canary. 409 when none runs, as when it ended
    meanwhile (a reviewer's decision): the caller cannot tell the two apart, and neither is its input's fault. Its
    event lost (``record_event``): the answer says ``event_recorded: false``."""
    head = registry.model_record(model).head  # NotFound
    canary = head.canary
    if canary is None:
        raise Conflict(f"model {model}: no canary running (active version {head.active_version}); nothing to end")
    if not registry.end_canary(model, canary.trial, promote):
        raise Conflict(f"model {model}: canary trial {canary.trial} ended meanwhile; look at the model again")
    active = canary.version if promote else head.active_version
    kind = "promote" if promote else "abort"
    recorded = record_event(
        registry,
        model,
        {
            "kind": kind,
            "who": "operator",
            "at": now,
            "trial": canary.trial,
            "version": canary.version,
            "active_version": active,
            "previous_version": head.active_version,
            "reason": f"{kind} by hand: {active} is active",
        },
    )
    return said({"model_name": model, "ended": kind, "canary": canary_info(canary), "active_version": active}, recorded)


def deleted_canary_event(model: str, canary: Canary, now: float) -> dict[str, Any]:
    return {
        "kind": "abort",
        "who": "operator",
        "at": now,
        "trial": canary.trial,
        "version": canary.version,
        "reason": f"its version {canary.version} was deleted",
    }
