"""What must run again when Lambda SnapStart restores the frontend from a snapshot.

Every container restored from one snapshot starts with the same memory: the same random-number generator
states (query ids would repeat across containers, and the bandit would draw the same models), connections
opened before the snapshot (dead after it), and figures collected before it. ``after_restore`` re-seeds,
drops the connections (the clients reconnect on their next call) and forgets the cached state; it is
registered with the runtime's hook (``snapshot_restore_py``, present only in Lambda's Python runtime).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class Restorable(Protocol):
    def after_restore(self) -> None: ...


class Resettable(Protocol):
    def reset(self) -> None: ...


def after_restore(processor: Restorable, redis_clients: Iterable[Any] = (), metrics: Resettable | None = None) -> None:
    random.seed()  # the module's generator makes the query ids (clipper.wiring.new_query_id)
    processor.after_restore()  # the selector's generator, the cached registry and bandit states
    for client in redis_clients:
        client.close()  # sockets of the snapshot; the client connects again on its next call
    if metrics is not None:
        metrics.reset()
    logger.info("restored from a snapshot: generators re-seeded, connections and caches dropped")


def register_after_restore(
    hook: Callable[[], None], register: Callable[[Callable[[], None]], Any] | None = None
) -> bool:
    """Register ``hook`` with the runtime's after-restore hooks; ``False`` where there is no such runtime
    (anywhere but Lambda's Python runtime, where ``snapshot_restore_py`` is part of the runtime)."""
    if register is None:
        try:
            from snapshot_restore_py import register_after_restore as runtime_register
        except ImportError:
            return False
        register = runtime_register
    register(hook)
    return True
