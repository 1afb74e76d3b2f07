"""``GET /admin/apps/{app}/report``: an application's live selection quality, from the feedback log
(``clipper.report.figures`` says what each figure is and how it is estimated).

``since`` and ``until`` take epoch seconds, an ISO 8601 time (UTC unless it says otherwise) or an age such as
``90m``, ``24h``, ``7d`` (before now); ``since`` defaults to 7 days ago and cannot reach past the log's retention.
The canary decisions are each linked model's last events from the registry's ``canary_events(model, limit)`` that
fall in the range, where the registry has it (read with ``getattr``: registries without canary events give none).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from fastapi import FastAPI, Query

from clipper.errors import ClipperError, InvalidInput, Unavailable
from clipper.ports import Clock
from clipper.report.entry import FeedbackEntry
from clipper.report.figures import selection_report
from clipper.selection.policies import policy_for
from clipper.selection.state import SelectionState, drawn_state, state_key, user_is_current
from clipper.selection.versions import active_versions

logger = logging.getLogger(__name__)

DEFAULT_SINCE_S = 7 * 24 * 3600
RETENTION_S = 30 * 24 * 3600  # the log's TTL (clipper.adapters.dynamodb_feedback_log.LOG_TTL_S)
_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
CANARY_EVENTS = 20


class FeedbackLogReader(Protocol):
    def entries(self, app: str, since: float, until: float, limit: int) -> tuple[list[FeedbackEntry], bool]:
        """The app's entries applied in [since, until], oldest first: the newest ``limit``, and whether older
        ones were left out."""
        ...


class ReportRegistry(Protocol):
    def app_and_links(self, name: str) -> tuple[Any, list[str]]: ...

    def active_version(self, name: str) -> Any: ...


def parse_time(text: str | None, now: float, field: str, default: float) -> float:
    """Epoch seconds, an ISO 8601 time, or an age before ``now`` (``90m``, ``24h``, ``7d``), between the epoch
    and ``now``'s year (a time outside is refused: it names no logged feedback)."""
    if text is None or text == "":
        return default
    expected = "epoch seconds, an ISO 8601 time or an age such as 24h or 7d, since 1970"
    age = _AGE.match(text.strip())
    try:
        if age:
            value = now - float(age.group(1)) * _UNIT_S[age.group(2)]
        else:
            try:
                value = float(text)
            except ValueError:
                parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
                value = (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError):
        raise InvalidInput(field, expected, text) from None
    if not math.isfinite(value) or not 0 <= value <= now + 366 * 86400:
        # a well-formed time out of range is named as such (it read as malformed: "expected ... ISO 8601")
        raise InvalidInput(field, "a time between 1970 and a year from now (it names no logged feedback)", text)
    return value


class StateReader(Protocol):
    def load(self, key: str) -> SelectionState | None: ...


class ReportService:
    def __init__(
        self,
        registry: ReportRegistry,
        log: FeedbackLogReader | None,
        clock: Clock,
        max_entries: int = 50_000,
        why_no_log: str = "no feedback log is configured (CLIPPER_SELECTION_TABLE)",
        states: StateReader | None = None,
    ) -> None:
        self._registry = registry
        self._states = states
        self._log = log
        self._clock = clock
        self._max_entries = max_entries
        self._why_no_log = why_no_log

    def report(
        self, app: str, since: str | None = None, until: str | None = None, window: int | None = None
    ) -> dict[str, Any]:
        application, links = self._registry.app_and_links(app)  # NotFound: 404
        now = self._clock.now()
        end = min(parse_time(until, now, "until", now), now)  # nothing is logged after now
        start = max(parse_time(since, now, "since", now - DEFAULT_SINCE_S), now - RETENTION_S)
        if start > end:
            raise InvalidInput("since", f"a time before until ({_iso(end)})", since or "")
        if self._log is None:
            raise Unavailable(f"the selection report: {self._why_no_log}")
        entries, truncated = self._log.entries(app, start, end, self._max_entries)
        # an application deleted and added again under the name is a new one: the old one's feedback is left out
        # (an entry logged before entries carried the incarnation, 0, is kept)
        incarnation = getattr(application, "incarnation", 0)
        entries = [e for e in entries if not e.incarnation or not incarnation or e.incarnation == incarnation]
        figures = selection_report(entries, window=window, canary_events=self._canary_events(links, start, end))
        skipped = getattr(self._log, "skipped", None)
        figures["skipped"] = skipped(app, start, end) if skipped is not None else {}
        head = {
            "app": app,
            "policy": getattr(application, "policy", None),
            "linked_models": links,
            "since": start,
            "until": end,
            "since_iso": _iso(start),
            "until_iso": _iso(end),
            "truncated": truncated,
        }
        return head | figures

    def selection(self, app: str, user_id: str | None = None) -> dict[str, Any]:
        """The bandit state an application's next query is drawn with (``user_id``: that user's), as the frontend
        reads it: each linked model's weight, its probability of being drawn (Exp3), how often it was judged and
        its mean loss. ``learned_from`` says whose state it is: ``user`` (the user's own), ``application`` (the
        application's, which a user without a state of its own starts from) or ``initial`` (nothing learned yet,
        or learned for another policy or an application deleted since)."""
        application, links = self._registry.app_and_links(app)  # NotFound: 404
        if self._states is None:
            raise Unavailable(f"the selection state: {self._why_no_log}")
        incarnation = getattr(application, "incarnation", 0)
        # as the frontend's Selector.state_for: an arm whose model's active version changed since starts again
        versions = active_versions(self._registry, links)
        stored = self._states.load(state_key(app))
        own = None if user_id is None else self._states.load(state_key(app, user_id))
        state = drawn_state(application.policy, links, incarnation, versions, stored, own, user_id is not None)
        # whose it is: a stored state is used when learned for this incarnation and policy (the state's own)
        learned_from = "application" if user_is_current(state, stored) else "initial"
        if user_id is not None and user_is_current(state, own):
            learned_from = "user"
        policy = policy_for(application.policy, application.policy_params)
        drawn = getattr(policy, "probabilities", None)
        probabilities = drawn(state) if drawn is not None and state.arms else {}
        return {
            "app": app,
            "user_id": user_id,
            "policy": application.policy,
            "learned_from": learned_from,
            "updates": state.updates if learned_from != "initial" else 0,
            "models": [
                {
                    "model": a.model,
                    "weight": a.weight,
                    **({"probability": probabilities[a.model]} if a.model in probabilities else {}),
                    "judged": a.pulls,
                    "mean_loss": a.mean_loss,
                    "version": a.version,
                }
                for a in state.arms
            ],
        }

    def _canary_events(self, models: list[str], start: float, end: float) -> dict[str, list[dict[str, Any]]]:
        """Each model's last canary events (newest first) within the report's range (an event without a time: kept)."""
        read: Callable[..., Any] | None = getattr(self._registry, "canary_events", None)
        if read is None:
            return {}
        out: dict[str, list[dict[str, Any]]] = {}
        for m in models:
            try:
                events = read(m, CANARY_EVENTS)
            except ClipperError as e:  # the report goes on without that model's decisions
                logger.warning("canary events of %s not read: %s", m, e)
                continue
            kept = [dict(ev) for ev in events if not isinstance(ev.get("at"), int | float) or start <= ev["at"] <= end]
            if kept:
                out[m] = kept
        return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def add_report_route(
    app: FastAPI, report: ReportService, dependencies: list[Any], responses: dict[int | str, dict[str, Any]]
) -> None:
    """Adds ``GET /admin/apps/{app}/report`` to the admin API (its guard and error bodies)."""

    @app.get(
        "/admin/apps/{app_name}/report",
        dependencies=dependencies,
        tags=["admin"],
        summary="An application's live selection quality from recorded predictions and feedback",
        responses=responses,
    )
    def get_report(
        app_name: str,
        since: str | None = Query(None, description="epoch seconds, ISO 8601, or an age: 24h, 7d (default 7d)"),
        until: str | None = Query(None, description="as since (default now)"),
        window: int | None = Query(None, ge=1, le=1_000_000, description="feedbacks per loss-over-time point"),
    ) -> dict[str, Any]:
        return report.report(app_name, since, until, window)

    @app.get(
        "/admin/apps/{app_name}/selection",
        dependencies=dependencies,
        tags=["admin"],
        summary="The bandit state an application's (or a user's) next query is drawn with",
        responses=responses,
    )
    def get_selection(
        app_name: str,
        uid: str | None = Query(None, min_length=1, max_length=512, description="a user's state (the query's uid)"),
    ) -> dict[str, Any]:
        return report.selection(app_name, uid)
