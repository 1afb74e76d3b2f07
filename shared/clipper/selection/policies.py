"""Model selection policies (Clipper's bandits). Stateless: every method is a pure function of a
:class:`~clipper.selection.state.SelectionState`, its input and an injected ``random.Random``.

Per query the frontend calls ``select`` (which models to query, and the probability each had), then
``combine`` on the replies that arrived by the deadline. The feedback path calls ``update`` with the
selection and outputs it cached for the query and the true label; it returns a new state, ``version + 1``.

- ``single`` (today's behaviour): always the first linked model; feedback only counts.
- ``epsilon_greedy``: the model with the best observed accuracy, a uniformly random one with
  probability ``epsilon``. Accuracy is estimated with one optimistic prior success, so every model is
  tried early.
- ``exp3``: one model, drawn with probability ``(1 - gamma) * weight + gamma / K``; feedback multiplies
  the chosen model's weight by ``exp(-eta * loss / p)``, ``p`` being the probability it was drawn with.
- ``exp4``: every linked model (or the ``k`` heaviest), combined by weight (vote or mean, see
  :mod:`clipper.selection.combining`), with a confidence; feedback multiplies every model's weight by
  ``exp(-eta * loss)``.

Losses are in [0, 1]: 0/1 by equality for class labels, the absolute error divided by the application's
``loss_scale`` (capped at 1) for scores. A
selected model that gave no output (no reply within the SLO, an error: ``missing``) loses 1 (``MISSING_LOSS``),
as a wrong answer does: the query was answered without it. Not judging it let a model that stopped answering
keep, and then win, the share the others lost on their mistakes. Weights stay a distribution with a floor
relative to the heaviest (``min_ratio``), so they are never NaN or 0.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

from clipper.errors import InvalidInput
from clipper.selection.combining import Combined, combine_outputs, loss
from clipper.selection.params import TAKES, PolicyParams
from clipper.selection.state import (
    DEFAULT_MIN_RATIO,
    Arm,
    SelectionState,
    accuracy_weights,
    reweighted,
    with_losses,
)


@dataclass(frozen=True)
class Selection:
    """The models to query, in order, and the probability each linked model had of being picked (for
    ``exp4``: its mixing weight). Cache it with the prediction: ``update`` needs it."""

    policy: str
    models: tuple[str, ...]
    probabilities: Mapping[str, float] = field(default_factory=dict)
    state_version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "models": list(self.models),
            "probabilities": [[m, p] for m, p in self.probabilities.items()],
            "state_version": self.state_version,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Selection:
        try:
            probabilities = {str(m): float(p) for m, p in data.get("probabilities", [])}
            models = tuple(str(m) for m in data["models"])
            return cls(str(data["policy"]), models, probabilities, int(data.get("state_version", 0)))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"corrupt selection: {e!r}") from e


class SelectionPolicy(Protocol):
    @property
    def name(self) -> str: ...

    def select(self, state: SelectionState, rng: random.Random) -> Selection: ...

    def combine(
        self,
        state: SelectionState,
        selection: Selection,
        outputs: Mapping[str, Any],
        missing: Set[str] = frozenset(),
    ) -> Combined: ...

    def update(
        self,
        state: SelectionState,
        selection: Selection,
        outputs: Mapping[str, Any],
        label: Any,
        missing: Set[str] = frozenset(),
    ) -> SelectionState: ...


def _draw(probabilities: Mapping[str, float], rng: random.Random) -> str:
    point = rng.random() * math.fsum(probabilities.values())
    acc = 0.0
    last = ""
    for model, p in probabilities.items():
        acc += p
        last = model
        if point < acc:
            return model
    return last


MISSING_LOSS = 1.0  # a selected model that gave no output: the worst loss


def _judged(
    state: SelectionState, outputs: Mapping[str, Any], label: Any, missing: Iterable[str] = (), scale: float = 1.0
) -> dict[str, float]:
    known = set(state.models)
    judged = {m: loss(o, label, scale) for m, o in outputs.items() if m in known}
    judged |= {m: MISSING_LOSS for m in missing if m in known and m not in outputs}
    return judged


@dataclass(frozen=True)
class _Policy:
    """What the policies share: combining by weight, and an update that counts before it reweights.
    ``loss_scale``: the absolute error of a score that is a whole loss (feedback's losses are in [0, 1]), and the
    unit of ``tolerance``, within which combined scores agree."""

    name: ClassVar[str] = ""
    tolerance: ClassVar[float] = 0.1
    loss_scale: float = field(default=1.0, kw_only=True)

    def __post_init__(self) -> None:
        if not self.loss_scale > 0.0 or not math.isfinite(self.loss_scale):
            raise ValueError("loss_scale must be positive")

    def combine(
        self,
        state: SelectionState,
        selection: Selection,
        outputs: Mapping[str, Any],
        missing: Set[str] = frozenset(),
    ) -> Combined:
        weights = state.weights
        mean = 1.0 / len(weights) if weights else 1.0
        for m in selection.models:
            if m not in weights:
                weights[m] = selection.probabilities.get(m) or mean
        return combine_outputs(weights, selection.models, outputs, missing, self.tolerance * self.loss_scale)

    def update(
        self,
        state: SelectionState,
        selection: Selection,
        outputs: Mapping[str, Any],
        label: Any,
        missing: Set[str] = frozenset(),
    ) -> SelectionState:
        """``missing``: the selected models that gave no output for the query (each loses ``MISSING_LOSS``)."""
        asked = set(selection.models)
        judged = {m: o for m, o in outputs.items() if m in asked}
        losses = _judged(state, judged, label, missing & asked, self.loss_scale)
        arms = self._reweight(state, selection, losses)
        return replace(state, arms=with_losses(arms, losses), version=state.version + 1, updates=state.updates + 1)

    def _reweight(self, state: SelectionState, selection: Selection, losses: Mapping[str, float]) -> tuple[Arm, ...]:
        return state.arms


@dataclass(frozen=True)
class SinglePolicy(_Policy):
    """Always the first linked model (the registry's link order), as the frontend did before bandits."""

    name: ClassVar[str] = "single"

    def select(self, state: SelectionState, rng: random.Random) -> Selection:
        if not state.arms:
            return Selection(self.name, (), {}, state.version)
        first = state.models[0]
        probabilities = {m: 1.0 if m == first else 0.0 for m in state.models}
        return Selection(self.name, (first,), probabilities, state.version)


@dataclass(frozen=True)
class EpsilonGreedyPolicy(_Policy):
    """The most accurate model so far; with probability ``epsilon`` a uniformly random one."""

    name: ClassVar[str] = "epsilon_greedy"
    epsilon: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.epsilon <= 1.0:
            raise ValueError("epsilon must be in (0, 1]")

    def select(self, state: SelectionState, rng: random.Random) -> Selection:
        if not state.arms:
            return Selection(self.name, (), {}, state.version)
        best = max(state.arms, key=lambda a: a.weight).model  # the first of equals
        k = len(state.arms)
        probabilities = {m: self.epsilon / k + (1.0 - self.epsilon if m == best else 0.0) for m in state.models}
        chosen = best if rng.random() >= self.epsilon else state.models[rng.randrange(k)]
        return Selection(self.name, (chosen,), probabilities, state.version)

    def _reweight(self, state: SelectionState, selection: Selection, losses: Mapping[str, float]) -> tuple[Arm, ...]:
        # Weight = estimated accuracy with one optimistic prior success, normalised; never 0.
        weights = {a.model: a.weight for a in accuracy_weights(with_losses(state.arms, losses))}
        return tuple(replace(a, weight=weights[a.model]) for a in state.arms)


@dataclass(frozen=True)
class Exp3Policy(_Policy):
    """Exp3: one model per query, drawn by weight with an exploration floor of ``gamma / K``."""

    name: ClassVar[str] = "exp3"
    gamma: float = 0.02
    eta: float = 0.2
    min_ratio: float = DEFAULT_MIN_RATIO

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError("gamma must be in (0, 1]")
        if not self.eta > 0.0 or not math.isfinite(self.eta):
            raise ValueError("eta must be positive")
        if not 0.0 < self.min_ratio <= 1.0:
            raise ValueError("min_ratio must be in (0, 1]")

    def probabilities(self, state: SelectionState) -> dict[str, float]:
        k = len(state.arms)
        return {a.model: (1.0 - self.gamma) * a.weight + self.gamma / k for a in state.arms}

    def select(self, state: SelectionState, rng: random.Random) -> Selection:
        if not state.arms:
            return Selection(self.name, (), {}, state.version)
        probabilities = self.probabilities(state)
        return Selection(self.name, (_draw(probabilities, rng),), probabilities, state.version)

    def _reweight(self, state: SelectionState, selection: Selection, losses: Mapping[str, float]) -> tuple[Arm, ...]:
        if not selection.models or selection.models[0] not in losses:
            return state.arms
        chosen = selection.models[0]
        # the floor of the draw as it was made: K the models it was among (links change between query and label)
        floor = self.gamma / (len(selection.probabilities) or len(state.arms))
        p = selection.probabilities.get(chosen) or self.probabilities(state)[chosen]
        p = min(1.0, max(floor, p))  # importance weight at most K / gamma
        return reweighted(state.arms, {chosen: -self.eta * losses[chosen] / p}, self.min_ratio)


@dataclass(frozen=True)
class Exp4Policy(_Policy):
    """Exp4: every linked model (or the ``k`` heaviest) answers; outputs are combined by weight."""

    name: ClassVar[str] = "exp4"
    eta: float = 0.1
    k: int | None = None
    tolerance: float = 0.1  # type: ignore[misc]  # Exp4's own, a field (the base's is a class constant)
    min_ratio: float = DEFAULT_MIN_RATIO

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.eta > 0.0 or not math.isfinite(self.eta):
            raise ValueError("eta must be positive")
        if self.k is not None and self.k < 1:
            raise ValueError("k must be at least 1")
        if not 0.0 < self.min_ratio <= 1.0:
            raise ValueError("min_ratio must be in (0, 1]")
        if not self.tolerance >= 0.0:
            raise ValueError("tolerance must not be negative")

    def select(self, state: SelectionState, rng: random.Random) -> Selection:
        ranked = sorted(state.arms, key=lambda a: -a.weight)  # stable: link order among equals
        chosen = tuple(a.model for a in ranked[: self.k])
        return Selection(self.name, chosen, state.weights, state.version)

    def _reweight(self, state: SelectionState, selection: Selection, losses: Mapping[str, float]) -> tuple[Arm, ...]:
        return reweighted(state.arms, {m: -self.eta * x for m, x in losses.items()}, self.min_ratio)


POLICIES: dict[str, Callable[..., SelectionPolicy]] = {
    "single": SinglePolicy,
    "epsilon_greedy": EpsilonGreedyPolicy,
    "exp3": Exp3Policy,
    "exp4": Exp4Policy,
}


def policy_for(name: str, params: PolicyParams | None = None) -> SelectionPolicy:
    """The policy called ``name``, with the application's ``params`` where set (the parameters it does not take
    are ignored) and its defaults for the rest. Parameters out of range raise ``InvalidInput`` naming the first."""
    try:
        make = POLICIES[name]
    except KeyError:
        raise InvalidInput("policy", f"one of {', '.join(sorted(POLICIES))}", repr(name)) from None
    given = params.for_policy(name) if params is not None else {}
    try:
        return make(**given)
    except ValueError as e:  # the policy's own range check
        check_params(name, params or PolicyParams())
        raise InvalidInput("policy_params", str(e)) from e


def check_params(policy: str, params: PolicyParams, changed: Iterable[str] = ()) -> None:
    """Refuse, naming the field, a parameter in ``changed`` that ``policy`` does not take, and any value the policy
    refuses (each is checked by building the policy with it alone)."""
    takes = TAKES.get(policy, ())
    for name in changed:
        if name not in takes:
            expected = f"a parameter of {policy} ({', '.join(takes) or 'it takes none'})"
            raise InvalidInput(name, expected, f"{name} (set the policy first: set_app_policy)")
    for name, value in params.for_policy(policy).items():
        try:
            POLICIES[policy](**{name: value})
        except ValueError as e:
            raise InvalidInput(name, str(e).removeprefix(f"{name} must be "), repr(value)) from e


__all__ = [
    "POLICIES",
    "EpsilonGreedyPolicy",
    "Exp3Policy",
    "Exp4Policy",
    "PolicyParams",
    "Selection",
    "SelectionPolicy",
    "SinglePolicy",
    "check_params",
    "policy_for",
]
