"""The offline replay of a live stream through the policies of ``clipper.selection``, with the feedback either
seen at once (``visible=None``: what ``bench/selection.py`` models) or as the live frontend saw it.

``visible[t]``: how many feedback updates the state that chose query ``t`` held. The live stack records it with
every query (the selection's ``state_version`` in the query record that feedback joins with): the frontend reads
bandit states up to its selection TTL old, and feedback reaches the state through a queue and a worker. The
updates themselves are applied in order to the newest state, with the selection recorded for the query, as the
feedback worker does (``clipper.feedback``); the replay keeps every intermediate state to select from an old one.

For the per-user experiment there are two states per query, the user's and the application's: the user's own
state when it exists (``user_visible[t]``: the user's updates the frontend saw; 0 means it saw none and started
the user from a copy of the application's state), a user's first update starts from the application's newest
state, and every update also updates the application's state (``clipper.feedback``'s order: the user's first).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import numpy as np

from clipper.selection import SelectionPolicy, SelectionState, initial_state, state_for_user


def replay(
    policy: SelectionPolicy,
    models: list[str],
    preds: Mapping[str, np.ndarray],
    labels: np.ndarray,
    seed: int,
    visible: np.ndarray | None = None,
) -> np.ndarray:
    """Whether each query's answer was right. ``preds[m][t]``: model ``m``'s output for query ``t``."""
    rng = random.Random(seed)
    columns = {m: preds[m].tolist() for m in models}
    truth = labels.tolist()
    seen = None if visible is None else visible.tolist()
    states: list[SelectionState] = [initial_state(policy.name, models)]
    correct = np.zeros(len(truth), bool)
    for t, label in enumerate(truth):
        state = states[t if seen is None else min(seen[t], t)]
        selection = policy.select(state, rng)
        outputs = {m: columns[m][t] for m in selection.models}
        correct[t] = policy.combine(state, selection, outputs).output == label
        states.append(policy.update(states[t], selection, outputs, label))
    return correct


def replay_users(
    policy: SelectionPolicy,
    models: list[str],
    preds: Mapping[str, np.ndarray],
    labels: np.ndarray,
    users: np.ndarray,
    seed: int,
    user_visible: np.ndarray | None = None,
    app_visible: np.ndarray | None = None,
) -> np.ndarray:
    """Per-user selection (a state per user, falling back to a copy of the application's). Without
    ``user_visible`` every earlier update is seen; ``app_visible[t]`` (default: all) is the application's
    updates seen by a query whose user has no state yet."""
    rng = random.Random(seed)
    columns = {m: preds[m].tolist() for m in models}
    truth, who = labels.tolist(), users.tolist()
    app_states: list[SelectionState] = [initial_state(policy.name, models)]
    user_states: dict[int, list[SelectionState]] = {}  # user -> its states after 1, 2, ... updates
    correct = np.zeros(len(truth), bool)
    for t, (label, u) in enumerate(zip(truth, who, strict=True)):
        own = user_states.setdefault(u, [])
        k = len(own) if user_visible is None else min(int(user_visible[t]), len(own))
        app_seen = t if app_visible is None else min(int(app_visible[t]), t)
        state = own[k - 1] if k > 0 else state_for_user(app_states[app_seen], None)
        selection = policy.select(state, rng)
        outputs = {m: columns[m][t] for m in selection.models}
        correct[t] = policy.combine(state, selection, outputs).output == label
        base = own[-1] if own else state_for_user(app_states[t], None)  # the worker's: the newest states
        own.append(policy.update(base, selection, outputs, label))
        app_states.append(policy.update(app_states[t], selection, outputs, label))
    return correct
