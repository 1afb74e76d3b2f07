"""The bandit state of one application (or of one user of it): a value, serialised to the store.

A :class:`SelectionState` holds, per linked model, a weight and two counters, plus the policy's name and a
``version`` that every change increases by one. The store writes a new state conditionally on the version
it read (version 0 means "never stored"); on a conflict the caller reads again and reapplies the change,
so no update is lost.

Weights are a probability distribution: every weight is finite and positive and they sum to 1. Exp3 and
Exp4 reweight through :func:`reweighted`, which keeps every weight at least ``min_ratio`` times the
largest: the floor bounds how far a model can fall behind, so a model that was bad and became good again
is picked again within a bounded number of queries.

Contextual (per-user) selection is a matter of which state is loaded: :func:`state_key` names it. The
rule: a query with a user id loads the user's state; a user without one starts from a copy of the
application's state (:func:`state_for_user`), and the first feedback for that user writes it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

from clipper.errors import InvalidInput

SCHEMA = 1
# The smallest weight a model can have, relative to the largest one. It bounds recovery time: a model's
# log-weight is never more than ln(1 / DEFAULT_MIN_RATIO) ~ 9.2 below the best one's.
DEFAULT_MIN_RATIO = 1e-4
MAX_LOG_DELTA = 1e6


@dataclass(frozen=True)
class Arm:
    """One linked model: its weight, how many feedback labels judged it, and the sum of its losses; ``version``,
    the model's active version the arm learned on (None: not known yet, a state stored before versions were
    followed, or one never checked against the registry)."""

    model: str
    weight: float
    pulls: int = 0
    losses: float = 0.0
    version: str | None = None

    @property
    def mean_loss(self) -> float | None:
        return self.losses / self.pulls if self.pulls else None


@dataclass(frozen=True)
class SelectionState:
    """The state a policy reads and replaces. Immutable: every change returns a new value."""

    policy: str
    arms: tuple[Arm, ...]
    version: int = 0
    updates: int = 0
    # the application's incarnation it was learned for (``Application.incarnation``); another is not used
    incarnation: int = 0

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(a.model for a in self.arms)

    @property
    def weights(self) -> dict[str, float]:
        return {a.model: a.weight for a in self.arms}

    def arm(self, model: str) -> Arm | None:
        return next((a for a in self.arms if a.model == model), None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (str, int, finite float, list, dict). Arms are a list, so their order survives
        stores whose maps are unordered (DynamoDB)."""
        return {
            "schema": SCHEMA,
            "policy": self.policy,
            "version": self.version,
            "updates": self.updates,
            "arms": [_arm_dict(a) for a in self.arms],
            "incarnation": self.incarnation,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SelectionState:
        """The state :meth:`to_dict` wrote. Numbers may come back as ``Decimal`` (DynamoDB) or ``str``.

        Raises ``ValueError`` for a corrupt state (missing fields, a non-positive or non-finite weight,
        a duplicated model, an unknown schema).
        """
        try:
            if int(data.get("schema", SCHEMA)) != SCHEMA:
                raise ValueError(f"unknown selection state schema {data.get('schema')!r}")
            arms = tuple(
                Arm(
                    str(a["model"]),
                    float(a["weight"]),
                    int(a.get("pulls", 0)),
                    float(a.get("losses", 0.0)),
                    None if a.get("version") is None else str(a["version"]),
                )
                for a in data["arms"]
            )
            state = cls(
                str(data["policy"]),
                arms,
                int(data["version"]),
                int(data.get("updates", 0)),
                int(data.get("incarnation", 0)),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"corrupt selection state: {e!r}") from e
        if len(set(state.models)) != len(arms):
            raise ValueError("corrupt selection state: a model appears twice")
        for a in arms:
            if not (math.isfinite(a.weight) and a.weight > 0 and math.isfinite(a.losses) and a.losses >= 0):
                raise ValueError(f"corrupt selection state: model {a.model!r} has weight {a.weight}")
            if a.pulls < 0:
                raise ValueError(f"corrupt selection state: model {a.model!r} has {a.pulls} pulls")
        if state.version < 0:
            raise ValueError("corrupt selection state: negative version")
        return replace(state, arms=tuple(_normalised(arms)))


def _arm_dict(a: Arm) -> dict[str, Any]:
    out: dict[str, Any] = {"model": a.model, "weight": a.weight, "pulls": a.pulls, "losses": a.losses}
    if a.version is not None:
        out["version"] = a.version
    return out


def _normalised(arms: Iterable[Arm]) -> list[Arm]:
    """The arms with weights summing to 1 (left as they are when they already do, so that a state read
    back from the store equals the one written)."""
    arms = list(arms)
    total = math.fsum(a.weight for a in arms)
    if abs(total - 1.0) <= 1e-12:
        return arms
    return [replace(a, weight=a.weight / total) for a in arms]


def reweighted(
    arms: Sequence[Arm], log_deltas: Mapping[str, float], min_ratio: float = DEFAULT_MIN_RATIO
) -> tuple[Arm, ...]:
    """Multiply each weight by ``exp(log_deltas[model])`` (absent: 1), in log space, then lift every weight
    to at least ``min_ratio`` times the largest and normalise. Never NaN, never 0, whatever the deltas
    (a NaN delta counts as 0, an infinite one as +-``MAX_LOG_DELTA``)."""
    if not arms:
        return ()
    logs = []
    for a in arms:
        delta = log_deltas.get(a.model, 0.0)
        delta = 0.0 if math.isnan(delta) else min(max(delta, -MAX_LOG_DELTA), MAX_LOG_DELTA)
        logs.append(math.log(a.weight) + delta)
    top = max(logs)
    floor = math.log(min_ratio)
    weights = [math.exp(max(x - top, floor)) for x in logs]
    total = math.fsum(weights)
    return tuple(replace(a, weight=w / total) for a, w in zip(arms, weights, strict=True))


def with_losses(arms: Sequence[Arm], losses: Mapping[str, float]) -> tuple[Arm, ...]:
    """The arms with their counters advanced by one judged output each (models in ``losses``)."""
    return tuple(
        replace(a, pulls=a.pulls + 1, losses=a.losses + losses[a.model]) if a.model in losses else a for a in arms
    )


def initial_state(policy: str, models: Sequence[str], incarnation: int = 0) -> SelectionState:
    """A never-stored state (version 0): every model with the same weight, counters at zero."""
    unique = list(dict.fromkeys(models))
    arms = tuple(Arm(m, 1.0 / len(unique)) for m in unique)  # empty when no model is linked
    return SelectionState(policy, arms, incarnation=incarnation)


def reconcile(state: SelectionState, models: Sequence[str]) -> SelectionState:
    """Follow a change of the linked models: a new model gets the mean weight of the others (then all are
    normalised), a model no longer linked is dropped, the order becomes that of ``models``. Returns
    ``state`` itself when nothing changed, else a new state with ``version + 1``."""
    wanted = list(dict.fromkeys(models))
    if list(state.models) == wanted:
        return state
    known = {a.model: a for a in state.arms}
    kept = [known[m] for m in wanted if m in known]
    mean = math.fsum(a.weight for a in kept) / len(kept) if kept else 1.0
    arms = [known.get(m) or Arm(m, mean) for m in wanted]
    return replace(state, arms=tuple(_normalised(arms)), version=state.version + 1)


def follow_versions(state: SelectionState, versions: Mapping[str, str]) -> SelectionState:
    """Follow the models' active versions (``versions``: model -> active version; a model absent is left as it
    is): an arm that learned on another version than the active one now starts again, as a newly linked model
    does (the mean weight of the others, counters at zero), since what it learned judged a version that no
    longer answers; an arm that does not know its version yet takes the active one and keeps what it learned.
    Returns ``state`` itself when nothing changed, else a new state with ``version + 1``."""
    outdated = {a.model for a in state.arms if a.version is not None and versions.get(a.model, a.version) != a.version}
    adopting = any(a.version is None and a.model in versions for a in state.arms)
    if not outdated and not adopting:
        return state
    kept = [a for a in state.arms if a.model not in outdated]
    mean = math.fsum(a.weight for a in kept) / len(kept) if kept else 1.0
    arms = [
        Arm(a.model, mean, version=versions[a.model])
        if a.model in outdated
        else replace(a, version=versions.get(a.model, a.version))
        for a in state.arms
    ]
    return replace(state, arms=tuple(_normalised(arms)), version=state.version + 1)


def accuracy_weights(arms: Sequence[Arm]) -> tuple[Arm, ...]:
    """Epsilon-greedy's weights: each arm's estimated accuracy with one optimistic prior success, normalised
    (never 0; an arm never judged estimates 1, the most, so it is tried early)."""
    estimates = [(a.pulls - a.losses + 1.0) / (a.pulls + 1.0) for a in arms]
    total = math.fsum(estimates)
    return tuple(replace(a, weight=e / total) for a, e in zip(arms, estimates, strict=True))


def ensure_state(
    state: SelectionState | None,
    policy: str,
    models: Sequence[str],
    incarnation: int = 0,
    versions: Mapping[str, str] | None = None,
) -> SelectionState:
    """The state to use for ``policy`` over ``models`` in the application's ``incarnation``: a fresh one when
    there is none, when the application switched policy, or when the state was learned for another
    incarnation (an application deleted and added again under the same name) -- its version continues the
    old one, so the conditional write still applies --, else the stored one reconciled with the linked
    models; with ``versions`` (model -> active version), its arms follow them (:func:`follow_versions`)."""
    kept = False  # the stored state, reconciled (an initial state's weights are uniform, as its estimates)
    if state is None:
        fresh = initial_state(policy, models, incarnation)
    elif state.policy != policy or state.incarnation != incarnation:
        fresh = replace(initial_state(policy, models, incarnation), version=state.version + 1)
    else:
        fresh, kept = reconcile(state, models), True
    followed = fresh if versions is None else follow_versions(fresh, versions)
    if policy == "epsilon_greedy" and kept and followed is not state:
        # a model linked (or an arm restarted) since: its optimistic estimate, not the others' mean weight
        followed = replace(followed, arms=accuracy_weights(followed.arms))
    return followed


def state_key(app: str, user_id: str | None = None) -> str:
    """The store key of an application's state (``user_id`` None) or of one user's state within it.

    Both parts are percent-encoded, so different (app, user) pairs never share a key:
    ``state_key("digits")`` is ``"app/digits"``, ``state_key("digits", "u 1")`` is ``"app/digits/user/u%201"``.
    """
    if not app:
        raise InvalidInput("app", "a non-empty application name")
    key = f"app/{quote(app, safe='')}"
    if user_id is None:
        return key
    if not user_id:
        raise InvalidInput("user_id", "a non-empty string when given")
    return f"{key}/user/{quote(user_id, safe='')}"


def is_user_key(key: str) -> bool:
    """Whether ``key`` is a user's state key (``state_key(app, user)``), not an application's."""
    return key.count("/") == 3 and key.startswith("app/") and key.split("/", 3)[2] == "user"


def user_is_current(app_state: SelectionState, user_state: SelectionState | None) -> bool:
    """Whether a user's stored state was learned for the application as it is (its incarnation, its policy)."""
    return (
        user_state is not None
        and user_state.incarnation == app_state.incarnation
        and user_state.policy == app_state.policy
    )


def state_for_user(app_state: SelectionState, user_state: SelectionState | None) -> SelectionState:
    """The fallback rule of contextual selection: the user's own state when it exists (learned for the
    application's incarnation under its policy); otherwise a copy of the application's weights (and the versions
    they learned on) with zeroed counters and version 0 (not yet stored under the user's key, stored for an
    application of the same name deleted since, or learned under the policy the application had before
    set_app_policy: a returning user then starts where a new one does, not from uniform weights). Epsilon-greedy's
    weights are its counters (each model's accuracy so far), so its copy keeps them: zeroed, the user's first
    feedback would rebuild the weights from that one label."""
    if user_state is not None and user_is_current(app_state, user_state):
        return user_state
    if app_state.policy == "epsilon_greedy":
        arms = app_state.arms
    else:
        arms = tuple(replace(a, pulls=0, losses=0.0) for a in app_state.arms)
    return SelectionState(app_state.policy, arms, incarnation=app_state.incarnation)


def drawn_state(
    policy: str,
    models: Sequence[str],
    incarnation: int,
    versions: Mapping[str, str] | None,
    app_state: SelectionState | None,
    user_state: SelectionState | None = None,
    for_user: bool = False,
) -> SelectionState:
    """The state a query is drawn with: the application's stored state followed to its links and versions
    (``ensure_state``), and for a user (``for_user``) the user's own state or, without a current one, the
    application's copy (``state_for_user``), followed the same way. The frontend's selector draws with it; the
    management API shows it."""
    state = ensure_state(app_state, policy, models, incarnation, versions)
    if not for_user:
        return state
    return ensure_state(state_for_user(state, user_state), policy, models, incarnation, versions)


__all__ = [
    "DEFAULT_MIN_RATIO",
    "Arm",
    "SelectionState",
    "drawn_state",
    "ensure_state",
    "follow_versions",
    "initial_state",
    "is_user_key",
    "reconcile",
    "reweighted",
    "state_for_user",
    "state_key",
    "with_losses",
]
