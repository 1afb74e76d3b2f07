"""An application's selection-policy parameters, stored with the application: Exp3's and Exp4's learning rate
``eta``, Exp3's exploration ``gamma``, epsilon-greedy's ``epsilon``, ``k``, how many of the heaviest models Exp4
queries, and every policy's ``loss_scale``, the absolute error of a score (a regression output) that is a whole
loss (feedback's losses are in [0, 1]; 1 unless set), which is also the unit of the agreement tolerance among
combined scores. A parameter left unset (None) is the policy's default; a policy ignores the parameters it does
not take (:data:`TAKES`), so they survive a change of policy and apply again when it changes back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

# which parameters each policy takes
TAKES: dict[str, tuple[str, ...]] = {
    "single": ("loss_scale",),  # a canary's evidence judges its outputs too (its feedback teaches no bandit)
    "epsilon_greedy": ("epsilon", "loss_scale"),
    "exp3": ("gamma", "eta", "loss_scale"),
    "exp4": ("eta", "k", "loss_scale"),
}


@dataclass(frozen=True)
class PolicyParams:
    eta: float | None = None
    gamma: float | None = None
    epsilon: float | None = None
    k: int | None = None
    loss_scale: float | None = None

    @property
    def scale(self) -> float:
        """The loss scale in use (1 unless set)."""
        return 1.0 if self.loss_scale is None else self.loss_scale

    def for_policy(self, policy: str) -> dict[str, Any]:
        """The set parameters ``policy`` takes, as its constructor's keyword arguments."""
        return {name: value for name in TAKES.get(policy, ()) if (value := getattr(self, name)) is not None}

    def with_values(self, changes: Mapping[str, float | int | None]) -> PolicyParams:
        """These parameters with ``changes`` applied (None: back to the policy's default)."""
        return PolicyParams.from_dict({**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})

    def to_dict(self) -> dict[str, float | int]:
        """The set parameters only (what the registry stores)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyParams:
        return cls(
            eta=_float(data.get("eta")),
            gamma=_float(data.get("gamma")),
            epsilon=_float(data.get("epsilon")),
            k=None if data.get("k") is None else int(data["k"]),
            loss_scale=_float(data.get("loss_scale")),
        )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
