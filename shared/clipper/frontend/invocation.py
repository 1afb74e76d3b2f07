"""When the serving function's invocation ends: a query's deadline is its SLO from its start, or earlier when the
function would be stopped first.

On Lambda the frontend runs within the function's timeout (``FrontendTimeout``, 10 s by default) while an
application's SLO may be up to 30 s: a query whose deadline came after the invocation's end was killed with it,
and API Gateway answered its own 500 instead of the application's default output. The handler sets the
invocation's end for the request (``invocation(context)``); the query's deadline is then at most that, less
``ANSWER_ROOM_S`` for the answer to be written. Elsewhere (the local stack, tests) nothing is set and the SLO
alone decides.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

ANSWER_ROOM_S = 0.3  # the default's answer, its metrics line and the way back through API Gateway

_ENDS: ContextVar[float | None] = ContextVar("clipper_invocation_ends", default=None)


def invocation_ends() -> float | None:
    """The current invocation's end (epoch seconds), less the room for the answer; None when not bounded."""
    ends = _ENDS.get()
    return None if ends is None else ends - ANSWER_ROOM_S


def query_deadline(start: float, slo_s: float, ends: float | None) -> float:
    """A query's deadline (epoch seconds): its SLO from ``start``, at most ``ends`` (``invocation_ends``)."""
    deadline = start + slo_s
    return deadline if ends is None else min(deadline, ends)


@contextlib.contextmanager
def invocation(context: Any) -> Iterator[None]:
    """Within it, queries know when the Lambda ``context``'s invocation ends (its remaining time)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    ends = time.time() + remaining() / 1000 if callable(remaining) else None
    token = _ENDS.set(ends)
    try:
        yield
    finally:
        _ENDS.reset(token)
