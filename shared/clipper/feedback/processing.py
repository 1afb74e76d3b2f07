"""The feedback worker's side: a feedback message joined with the predictions recorded for its input and
applied to the bandit states and the canary evidence (the package's docstring says how).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from clipper.canary.evidence import VersionEvidence
from clipper.core.cache_keys import record_keys
from clipper.core.domain import Application, Canary
from clipper.core.messages import decode_rows
from clipper.errors import Conflict, NotFound, Unavailable
from clipper.feedback.receiving import FeedbackMessage
from clipper.ports import CanaryFeedbackEvidence, PredictionCache, Registry, SelectionStore
from clipper.selection import Selection, SelectionState, ensure_state, policy_for, state_for_user, state_key
from clipper.selection.combining import loss
from clipper.selection.versions import active_versions

if TYPE_CHECKING:
    from clipper.report.recorder import FeedbackRecorder

logger = logging.getLogger(__name__)

Outcome = Literal[
    "applied",
    "duplicate",
    "no_record",
    "not_learning",
    "unknown_app",
    "canary_only",
    "policy_changed",
    "label_mismatch",
    "version_changed",
]


# the outcomes of a feedback that was dropped, counted for the selection report
SKIPS_COUNTED = frozenset({"no_record", "unknown_app", "policy_changed", "label_mismatch", "version_changed"})


def _kind(value: Any) -> str:
    """An output's or a label's kind for judging one against the other: numbers (int or float) are one kind."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "list"
    return "object" if isinstance(value, dict) else "null"


def _label_fits(label: float | int | str, outputs: Any) -> bool:
    """Whether some model's output is of the label's kind (a record without outputs: nothing to say)."""
    kinds = {_kind(o) for o in outputs if o is not None}
    return not kinds or _kind(label) in kinds


def _output_kinds(record: dict[str, Any]) -> list[str]:
    return sorted({_kind(o) for o in record["outputs"].values() if o is not None})


_Read = tuple[Application, list[str], dict[str, str]]  # an application, its links, their active versions


class _Stale(Exception):
    """The registry copy disagrees with something written after it was read (a stored bandit state, the query's
    record): either may be the outdated one, so the registry itself is read before anything is decided."""


@dataclass
class FeedbackProcessor:
    """The worker's side: join with the recorded predictions, update the state(s) and the canaries' evidence.

    ``registry`` is usually a copy (``CachedRegistry``, seconds old). Where the copy disagrees with a stored state
    or the query's record (the application's policy, incarnation or links, a model's active version), the copy
    may be the one behind (a ``set_app_policy``, a link, a rollout moments ago, which the frontend already
    follows) or the state may be (written before the change): the feedback is then decided on the registry read
    itself (the copy's ``uncached`` registry), and the copy is dropped when that read shows it was behind. Decided
    on the copy alone, a stale copy would reset the new policy's state or move an arm back to the old version (and
    its learning with it), or drop feedback on the new policy's choices."""

    registry: Registry
    store: SelectionStore
    cache: PredictionCache
    max_attempts: int = 20
    evidence: CanaryFeedbackEvidence | None = None
    touched: set[str] = field(default_factory=set)
    log: FeedbackRecorder | None = None  # the feedback log of the selection report: never fails the feedback
    # the local worker's canary reviews take the touched models on a thread of their own
    _touched_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def take_touched(self) -> set[str]:
        """The models whose canary evidence grew since the last call."""
        with self._touched_lock:
            touched, self.touched = self.touched, set()
        return touched

    def process(self, message: FeedbackMessage) -> Outcome:
        copy = self.registry
        try:
            held = self._read(copy, message.app)
            if held is None:
                raise _Stale  # or added since the copy was read (it holds "no such application" a second)
            return self._counted(message, self._process(copy, held, message, fresh=False))
        except _Stale:
            pass
        source: Registry = getattr(copy, "uncached", copy)
        read = self._read(source, message.app)
        if read is None:  # deleted since the feedback was accepted: nothing left to learn, no retry helps
            logger.info("feedback for an application that no longer exists", extra={"app": message.app})
            outcome: Outcome = "unknown_app"
        else:
            outcome = self._process(source, read, message, fresh=True)
        invalidate = getattr(copy, "invalidate", None)
        if invalidate is not None and source is not copy and self._read(copy, message.app) != read:
            invalidate()  # the copy was behind: the next feedback reads what this one did
        return self._counted(message, outcome)

    def _counted(self, message: FeedbackMessage, outcome: Outcome) -> Outcome:
        """``outcome``, counted in the feedback log when the feedback was dropped for something the sender can
        mend (the answer to its POST was 200 all the same: the report says what was not learned, and why). Not
        what is by design: a single-model application learns nothing (``not_learning``), or only its canary's
        evidence (``canary_only``); each count is a write, and those come with every such feedback."""
        if outcome in SKIPS_COUNTED and self.log is not None:
            self.log.skipped(message, outcome)
        return outcome

    @staticmethod
    def _read(registry: Registry, app_name: str) -> _Read | None:
        """The application, its links and their active versions (a model without one left out), read once for
        every state and the evidence this feedback updates; None when there is no such application. A registry
        that cannot be read fails the feedback (retried), never taken for "no active version"."""
        both = getattr(registry, "app_and_links", None)  # the registry itself: one query for both
        try:
            if both is not None:
                app, linked = both(app_name)
            else:
                app = registry.get_app(app_name)
                linked = registry.linked_models(app.name)
        except NotFound as e:
            if e.kind != "application":
                raise  # a missing table, not a missing application: a deployment fault, retried
            return None
        return app, list(linked), active_versions(registry, linked, tolerate=NotFound)

    def _process(self, registry: Registry, read: _Read, message: FeedbackMessage, fresh: bool) -> Outcome:
        app, linked, versions = read
        canaries = self._canaries(registry, linked)
        rows = decode_rows(message.payload)
        # the record the frontend read when it accepted the feedback (a later query of the input replaces the
        # cache's); a message without one (the frontend could not read it, or an older frontend's) reads it now
        record = message.record
        if record is None:
            (key,) = record_keys(app.name, message.user, rows)
            record = self.cache.get_many([key]).get(key)
        if record is not None and not fresh and not self._record_agrees(registry, record, app, linked, versions):
            raise _Stale  # answered under what the copy does not know yet, or no longer
        if app.policy == "single" and not canaries:
            return "not_learning"
        if record is None:
            if not fresh and app.policy == "single":
                # the copy may hold a canary the registry has ended (rolled back, promoted: the queries since
                # keep no record): decided on the registry itself, that is "not_learning", not "no_record"
                raise _Stale
            logger.info("feedback without a recorded prediction", extra={"app": app.name})
            return "no_record"
        if record.get("incarnation", 0) != app.incarnation:  # answered by a deleted application of this name
            logger.info("feedback on a prediction of a deleted application of this name", extra={"app": app.name})
            return "no_record"
        if not _label_fits(message.label, record["outputs"].values()):
            # "5" against the outputs 5: judged, every model would lose on every such label (and a canary's
            # version with them), so the bandit would learn the client's mistake; nothing is learned
            label_kind, output_kinds = _kind(message.label), _output_kinds(record)
            logger.warning(
                "feedback label of another kind (%s) than the models' outputs (%s): not learned",
                label_kind,
                ", ".join(output_kinds),
                extra={"app": app.name, "label": label_kind, "outputs": output_kinds},
            )
            return "label_mismatch"
        outcome: Outcome = "canary_only"
        if app.policy != "single":
            outcome = self._learn(registry, app, linked, versions, message, record, fresh)
        if canaries:
            self._add_evidence(canaries, record, message, versions, app.policy_params.scale)
        return outcome

    @staticmethod
    def _record_agrees(
        registry: Registry, record: dict[str, Any], app: Application, linked: list[str], versions: dict[str, str]
    ) -> bool:
        """Whether the query's record was answered under what the copy says: the application's incarnation and
        policy, and for each linked model that answered, its active version or its running canary's."""
        if record.get("incarnation", 0) != app.incarnation:
            return False
        if Selection.from_dict(record["selection"]).policy != app.policy:
            return False
        for model, version in (record.get("versions") or {}).items():
            if model in linked and version != versions.get(model):
                canary = registry.canary(model)
                if canary is None or canary.version != version:
                    return False
        return True

    def _learn(
        self,
        registry: Registry,
        app: Application,
        linked: list[str],
        versions: dict[str, str],
        message: FeedbackMessage,
        record: dict[str, Any],
        fresh: bool,
    ) -> Outcome:
        selection = Selection.from_dict(record["selection"])
        if selection.policy != app.policy:
            # chosen by the policy the application had before set_app_policy: the new policy's update would read
            # its probabilities as its own (an Exp4 mixture as Exp3's draw), so the bandit learns nothing from it
            logger.info("feedback on a prediction of the application's previous policy", extra={"app": app.name})
            return "policy_changed"
        answered = record.get("versions") or {}
        outputs = self._serving(registry, record["outputs"], answered, versions)
        # the selected models that gave no output, of versions that still answer (the version asked then)
        missing = set(self._serving(registry, dict.fromkeys(record.get("missing") or ()), answered, versions))
        if not outputs and not missing:
            # every model asked answered with a version it no longer serves (rolled out, back or promoted since
            # the query): nothing judges the arms, which stand for the versions serving now
            logger.info("feedback on a prediction of versions no longer served", extra={"app": app.name})
            return "version_changed"
        # the user's state first: a new user's copy of the app-wide state must not hold this feedback yet
        keys = ([state_key(app.name, message.user)] if message.user else []) + [state_key(app.name)]
        # every state read, and checked against the copy, before any is written: found behind by the app-wide
        # state after the user's was saved, the user's would keep what the copy said (its marker then stops
        # the second pass from mending it); the app-wide state is a new user's start, so it is checked too
        loaded = {k: self.store.load(k) for k in keys}
        if not fresh and not all(_agrees(stored, app, linked, versions) for stored in loaded.values()):
            raise _Stale
        applied = [
            self._apply(app, linked, versions, k, message, selection, outputs, fresh, loaded, missing) for k in keys
        ]
        # logged by the delivery that applied the app-wide state, the last key: when two deliveries of one
        # message race (a redelivery while the first still runs), one may apply the user's state and the other
        # the app's; both answer "applied", and one logs
        if applied[-1] and self.log is not None:
            self.log.record(message, record, app.policy_params.scale, app.incarnation)
        return "applied" if any(applied) else "duplicate"

    def _canaries(self, registry: Registry, linked: list[str]) -> dict[str, Canary]:
        if self.evidence is None:
            return {}
        running = {m: registry.canary(m) for m in linked}
        return {m: c for m, c in running.items() if c is not None}

    def _add_evidence(
        self,
        canaries: dict[str, Canary],
        record: dict[str, Any],
        msg: FeedbackMessage,
        active: dict[str, str],
        scale: float = 1.0,
    ) -> None:
        """Each canaried model's loss on this feedback, to the version that answered, once per feedback id
        (``active``: each linked model's active version; ``scale``: the application's loss scale)."""
        assert self.evidence is not None
        versions: dict[str, str] = record.get("versions") or {}
        trials: dict[str, str] = record.get("trials") or {}
        for model, output in record["outputs"].items():
            canary, version = canaries.get(model), versions.get(model)
            if canary is None or version is None:
                continue  # no trial running, or a record from before versions were kept
            if trials.get(model) != canary.trial:
                continue  # answered in another trial (one aborted since), or before this one started
            if version != canary.version and version != active.get(model):
                continue  # a version that is in neither side of the trial (switched since the query)
            delta = VersionEvidence.of_feedback(min(1.0, max(0.0, loss(output, msg.label, scale))))
            if self.evidence.add_once(model, canary.trial, version, delta, msg.feedback_id):
                with self._touched_lock:
                    self.touched.add(model)

    def _serving(
        self, registry: Registry, outputs: dict[str, Any], answered: dict[str, str], active: dict[str, str]
    ) -> dict[str, Any]:
        """The outputs of versions that still answer: the model's active version, or its running canary's (a
        share of its queries); another version's output (switched, rolled back or promoted since the query)
        judged a version the model's arm no longer stands for. A record without versions is taken whole."""
        kept = {}
        for model, output in outputs.items():
            version = answered.get(model)
            if version is None or version == active.get(model):
                kept[model] = output
                continue
            canary = registry.canary(model) if model in active else None
            if canary is not None and canary.version == version:
                kept[model] = output
        return kept

    def _apply(
        self,
        app: Application,
        linked: list[str],
        versions: dict[str, str],
        key: str,
        msg: FeedbackMessage,
        sel: Selection,
        outputs: dict[str, Any],
        fresh: bool = True,
        loaded: dict[str, SelectionState | None] | None = None,
        missing: frozenset[str] | set[str] = frozenset(),
    ) -> bool:
        """Apply the feedback to the state under ``key``; ``fresh``: ``app``, ``linked`` and ``versions`` were read
        from the registry itself (not a copy that may be stale), so a stored state that disagrees with them is
        the outdated one (reset, reconciled, its arms restarted) rather than a reason to read the registry."""
        policy = policy_for(app.policy, app.policy_params)
        first = dict(loaded or {})  # what the caller read (and checked) for the first attempt
        for _ in range(self.max_attempts):
            stored = first.pop(key) if key in first else self.store.load(key)
            if not fresh and not _agrees(stored, app, linked, versions):
                raise _Stale
            if key != state_key(app.name) and (
                stored is None or stored.incarnation != app.incarnation or stored.policy != app.policy
            ):
                # a user without a state of this application's own (none, one of a deleted namesake's, or one
                # learned under the policy it had before): a copy of the application's (state_for_user)
                app_key = state_key(app.name)
                app_stored = first.pop(app_key) if app_key in first else self.store.load(app_key)
                if not fresh and not _agrees(app_stored, app, linked, versions):
                    raise _Stale
                app_state = ensure_state(app_stored, app.policy, linked, app.incarnation, versions)
                base = state_for_user(app_state, None)
            else:
                base = ensure_state(stored, app.policy, linked, app.incarnation, versions)
            expected = stored.version if stored is not None else 0
            updated = policy.update(base, sel, outputs, msg.label, missing)
            if updated.version <= expected:
                updated = replace(updated, version=expected + 1)
            try:
                return self.store.save(key, updated, expected, msg.feedback_id)
            except Conflict:
                continue  # another update won the race: read it and apply this one on top
        raise Unavailable(f"feedback {msg.feedback_id}: state {key} kept changing; will retry")


def _agrees(stored: SelectionState | None, app: Application, linked: list[str], versions: dict[str, str]) -> bool:
    """Whether a stored state was learned for what the registry copy says: the application's incarnation and
    policy, its linked models, each arm's version the model's active one (an arm that does not know its version,
    or a model without an active version, agrees)."""
    if stored is None:
        return True
    if stored.incarnation != app.incarnation or stored.policy != app.policy or set(stored.models) != set(linked):
        return False
    return all(a.version is None or versions.get(a.model, a.version) == a.version for a in stored.arms)
