"""Model selection (Clipper's bandits): stateless policies over a serialisable state.

``state`` holds the value the store keeps per application (or per application and user), ``policies``
the policies (``single``, ``epsilon_greedy``, ``exp3``, ``exp4``), ``combining`` how outputs are combined
and judged. Everything here is pure: no I/O, no environment, randomness from an injected ``random.Random``.
"""

from __future__ import annotations

from clipper.selection.combining import Combined, Resolution, combine_outputs, loss, resolve
from clipper.selection.policies import (
    POLICIES,
    EpsilonGreedyPolicy,
    Exp3Policy,
    Exp4Policy,
    PolicyParams,
    Selection,
    SelectionPolicy,
    SinglePolicy,
    check_params,
    policy_for,
)
from clipper.selection.state import (
    Arm,
    SelectionState,
    ensure_state,
    follow_versions,
    initial_state,
    reconcile,
    state_for_user,
    state_key,
)

__all__ = [
    "POLICIES",
    "Arm",
    "Combined",
    "EpsilonGreedyPolicy",
    "Exp3Policy",
    "Exp4Policy",
    "PolicyParams",
    "Resolution",
    "Selection",
    "SelectionPolicy",
    "SelectionState",
    "SinglePolicy",
    "check_params",
    "combine_outputs",
    "ensure_state",
    "follow_versions",
    "initial_state",
    "loss",
    "policy_for",
    "reconcile",
    "resolve",
    "state_for_user",
    "state_key",
]
