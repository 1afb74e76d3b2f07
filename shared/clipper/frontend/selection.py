"""Model selection for the frontend: which models a query goes to, from the application's policy and its
bandit state (per application, or per (application, user) when the query carries a user id).

States are read from the store and kept for ``ttl_s`` in the warm container (a bandit tolerates weights a
moment old), at most ``max_states`` of them (least recently used out first: there is one per user, and users
are unbounded); the single-model policy needs no state at all. With a ``refresh`` runner (the registry copy's
background thread), a state past ``ttl_s`` is still used while it is read again off the query path, once
however many queries ask meanwhile (stale-while-revalidate, as ``clipper.core.registry_cache``), so a warm
container's queries do not wait for the store each ``ttl_s``; only a state older than ``ttl_s + max_stale_s``
(no query for a while, or reads that keep failing) is read on the query path, unless its read is still in flight
(``clipper.core.registry_cache.RELOAD_PATIENCE_S``: the store is slow, and a read of the query's own would be too);
the queries that read a state at once share one read (``clipper.core.single_flight``).

While a model has a canary (``Registry.canary``), the canary's share of the model's queries go to the canary's
version: drawn per query, or fixed per user when the query carries a user id (a hash of the user, the model and
the trial), so one user sees one version throughout a trial.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from clipper.core.domain import Application, ModelVersion
from clipper.core.log_sampling import SampledLog
from clipper.core.registry_cache import BackgroundReloads
from clipper.core.single_flight import SingleFlight
from clipper.errors import ClipperError, NotFound, Unavailable
from clipper.ports import Clock, Registry, SelectionStore
from clipper.selection import (
    Selection,
    SelectionPolicy,
    SelectionState,
    initial_state,
    policy_for,
    state_key,
)
from clipper.selection.state import drawn_state, is_user_key
from clipper.selection.versions import active_versions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    policy: SelectionPolicy
    state: SelectionState
    selection: Selection
    models: list[ModelVersion]
    # the canary trial each model with a canary running drew this query's version in (its canary's or the
    # active one): the query's record carries it, so its feedback counts in that trial only
    trials: dict[str, str] = field(default_factory=dict)


class Selector:
    def __init__(
        self,
        registry: Registry,
        store: SelectionStore | None,
        clock: Clock,
        rng: random.Random,
        ttl_s: float,
        max_states: int = 10_000,
        refresh: Callable[[Callable[[], None]], Any] | None = None,
        max_stale_s: float | None = None,
        keep_warm_s: float = 0.0,
    ) -> None:
        """``keep_warm_s``: states a query used within it are read again off the path while no query comes
        (``clipper.core.keep_warm``; it needs a ``refresh`` runner)."""
        self._registry = registry
        # a registry copy that can tell whether choosing reads nothing (CachedRegistry); others always answer fast
        self._ready_for: Callable[[str], bool] | None = getattr(registry, "ready_for", None)
        self._store = store
        self._clock = clock
        self._errors_log = SampledLog(logger, clock=clock.now)  # at most a line a second for each state
        self._rng = rng
        self._ttl = ttl_s
        self._max_states = max_states
        self._states: OrderedDict[str, tuple[float, SelectionState | None]] = OrderedDict()
        self._reloads: BackgroundReloads | None = None
        if refresh is not None:
            self._reloads = BackgroundReloads(refresh, "bandit state not read again", ttl_s, max_stale_s, clock.now)
        self._lock = threading.Lock()
        self._flights: SingleFlight[SelectionState | None] = SingleFlight()  # reads on a query's path, shared
        self._generation = 0  # after_restore moves it on: a read started before is not kept
        self._warm = (
            self._reloads.keep_warm(
                clock, keep_warm_s, self._age_of, self._reload_in_background, "clipper-selection-warm"
            )
            if self._reloads is not None
            else None
        )

    def after_restore(self) -> None:
        """After a SnapStart restore: every container restored from one snapshot starts with this RNG in the
        same state, so it is re-seeded from the OS; cached bandit states (from the snapshot) are dropped."""
        self._rng.seed()
        with self._lock:
            self._states.clear()
            self._generation += 1
        self._flights.forget()

    @property
    def cached_states(self) -> int:
        return len(self._states)

    def is_cached(self, app: Application, user: str | None) -> bool:
        """Whether ``choose`` for this application and user reads no store: the registry copy holds its links and
        versions (when the registry is a cache that can tell), and its bandit states are fresh in memory."""
        if self._ready_for is not None and not self._ready_for(app.name):
            return False
        if app.policy == "single" or self._store is None:
            return True
        now = self._clock.now()
        keys = [state_key(app.name)] + ([state_key(app.name, user)] if user is not None else [])
        return all(self._usable(key, now) is not None for key in keys)

    def _usable(self, key: str, now: float) -> tuple[SelectionState | None] | None:
        """The held state of ``key`` (in a 1-tuple: a state may be None) when a query may use it now, else None; a
        stale one that may still be used is read again in the background."""
        hit = self._states.get(key)
        if hit is None:
            return None
        age = now - hit[0]
        if self._warm is not None and not is_user_key(key):  # one per application; users' are unbounded
            self._warm.touch(key, now)
        if age < self._ttl:
            return (hit[1],)
        if self._reloads is None or not self._reloads.usable(key, age):
            return None
        self._reload_in_background(key)
        return (hit[1],)

    def _age_of(self, key: Hashable, now: float) -> float | None:
        hit = self._states.get(key)  # type: ignore[call-overload]
        return None if hit is None else now - hit[0]

    def _reload_in_background(self, key: str, patient: bool = True) -> None:
        assert self._reloads is not None
        self._reloads.submit(key, lambda: self._read(key, self._clock.now()), patient=patient)

    def _load(self, key: str) -> SelectionState | None:
        now = self._clock.now()
        held = self._usable(key, now)
        if held is not None:
            return held[0]
        hit = self._states.get(key)
        if (hit is not None or is_user_key(key)) and self._reloads is not None and self._reloads.failing:
            # the store failing (``FailureWindow``): the state held is answered without a read of this query's own
            # (a store failing slowly held each query for its read) and read again off the path (its success ends
            # this); a user's never held is none (the application's answers), not read at all (users are unbounded:
            # each would queue a read on the one refresh thread, the registry's reloads behind them)
            age = "none held: the application's"
            if hit is not None:
                self._reload_in_background(key, patient=False)
                age = f"{now - hit[0]:.0f} s old"
            self._errors_log.warning(
                ("failing", "user" if is_user_key(key) else key),
                "bandit state store failing: answered as last held (%s), read again off the path",
                age,
            )
            return hit[1] if hit is not None else None
        # one read however many queries ask at once (a read another query started within ttl_s is as recent as a
        # fresh state): after a quiet while each query read the state itself, all at the store at once
        try:
            state = self._flights.run(key, partial(self._read_counted, key, now), now, now - self._ttl)
        except Unavailable as e:
            return self._held_on_error(key, now, e)
        if self._warm is not None and not is_user_key(key):
            self._warm.touch(key, now)
        return state

    def _held_on_error(self, key: str, now: float, error: Unavailable) -> SelectionState | None:
        """While the store cannot be read: the state held for ``key``, however old (weights a little behind pick
        models as well; the query's default would answer none), or, for a user's state never held, none (the
        application's state answers that query); ``error`` for an application's state never held."""
        hit = self._states.get(key)
        if hit is None and not is_user_key(key):
            raise error
        age = f"{now - hit[0]:.0f} s old" if hit is not None else "none held: the application's"
        self._errors_log.warning(
            "user" if is_user_key(key) else key, "bandit state unreadable, answered as last held (%s): %s", age, error
        )
        return hit[1] if hit is not None else None

    def _read_counted(self, key: str, now: float) -> SelectionState | None:
        """``_read`` on a query's path, its outcome counted once (by the flight's own read, from its start: a query
        that joins it reports nothing) for whether the store is failing."""
        read = partial(self._read, key, now)
        return self._reloads.counted(now, read) if self._reloads is not None else read()

    def _read(self, key: str, now: float) -> SelectionState | None:
        generation = self._generation
        try:
            state = self._store.load(key) if self._store is not None else None
        except NotFound as e:
            if e.kind != "resource":
                raise
            # the table missing (the local stack's emulator restoring its tables, a deployment fault): the store
            # unavailable, as the registry copy takes it (``registry_cache._absent``), so the state held answers
            raise Unavailable(f"bandit state store unavailable: {e}") from e
        with self._lock:
            held = self._states.get(key)
            if generation != self._generation or (held is not None and held[0] > now):
                return state  # restored meanwhile, or a later read is held: this one is not kept
            self._states[key] = (now, state)
            self._states.move_to_end(key)
            while len(self._states) > self._max_states:
                self._states.popitem(last=False)
        return state

    def state_for(self, app: Application, linked: list[str], user: str | None) -> SelectionState:
        if app.policy == "single" or self._store is None:
            return initial_state(app.policy, linked, app.incarnation)
        versions = active_versions(self._registry, linked)  # an arm that learned on another version starts again
        app_state = self._load(state_key(app.name))
        user_state = None if user is None else self._load(state_key(app.name, user))
        return drawn_state(app.policy, linked, app.incarnation, versions, app_state, user_state, user is not None)

    def choose(self, app: Application, user: str | None) -> Choice | None:
        linked = self._registry.linked_models(app.name)
        if not linked:
            return None
        policy = policy_for(app.policy, app.policy_params)
        state = self.state_for(app, linked, user)
        selection = policy.select(state, self._rng)
        models, trials = [], {}
        unreadable: Unavailable | None = None
        for name in selection.models:
            try:
                version, trial = self._version_for(name, user)
            except Unavailable as e:  # its version unreadable (and none held): the others still answer
                unreadable = unreadable or e
                continue
            except ClipperError:
                continue  # a linked model without an active version cannot answer; the others can
            models.append(version)
            if trial is not None:
                trials[name] = trial
        if not models and unreadable is not None:
            raise unreadable  # none left because the registry cannot be read: the default names that, not 'no model'
        return Choice(policy, state, selection, models, trials) if models else None

    def _version_for(self, model: str, user: str | None) -> tuple[ModelVersion, str | None]:
        """The version that answers this query for ``model``: its canary for the canary's share of queries (the
        same for every query of one user: a user sees one version, not a mix), else the active version; and the
        running canary's trial, if any."""
        active = self._registry.active_version(model)
        canary = self._registry.canary(model)
        if canary is None or canary.version == active.version:
            return active, None
        draw = self._rng.random() if user is None else sticky_draw(user, model, canary.trial)
        if draw >= canary.share:
            return active, canary.trial
        try:
            return self._registry.get_version(model, canary.version), canary.trial
        except ClipperError:
            return active, None  # the canary's version is gone (deleted meanwhile): the active one answers


def sticky_draw(user: str, model: str, trial: str) -> float:
    """A user's fixed draw in [0, 1) for one canary trial: a new trial (or model) draws anew."""
    digest = hashlib.blake2b(f"{trial}\x00{model}\x00{user}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64
