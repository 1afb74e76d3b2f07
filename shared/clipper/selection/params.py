"""An application's selection-policy parameters, stored with the application: Exp3's and Exp4's learning rate
``eta``, Exp3's exploration ``gamma``, epsilon-greedy's ``epsilon``, and ``k``, how many of the heaviest models Exp4
queries. A parameter left unset (None) is the policy's default; a policy ignores the parameters it does not take
(:data:`TAKES`), so they survive a change of policy and apply again when it changes back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

# which parameters each policy takes
TAKES: dict[str, tuple[str, ...]] = {
    "single": (),
    "epsilon_greedy": ("epsilon",),
    "exp3": ("gamma", "eta"),
    "exp4": ("eta", "k"),
}


@dataclass(frozen=True)
class PolicyParams:
    eta: float | None = None
    gamma: float | None = None
    epsilon: float | None = None
    k: int | None = None

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
        )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
