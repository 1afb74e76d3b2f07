"""The local stack's Redis append-only file, compacted when the stack is quiet.

The stack's redis-server keeps an append-only file (AOF): the request queues, the cache and the replies survive a
restart. The file grows by every write (about 2 KB a query: the message, its delivery, the reply, the cache
entry, the in-flight claim), and a rewrite compacts it: a forked child writes the whole dataset anew. Redis's own
rule (a rewrite once the file doubled since the last one and passed 64 MB) starts one every ~20 s at 1,000 q/s,
and the child's burst of CPU (tens of ms, more as the cache grows) lands on the core the queries use: on the pinned
stack every trial a rewrite fell in failed, with 8 to 19 defaults (bench/README.md, "Front door").

So the stack turns Redis's automatic rewrite off (``--auto-aof-rewrite-percentage 0``) and the launcher's
background thread asks for one (``BGREWRITEAOF``) when the file grew by as much as Redis would have waited for
(``due_bytes``, or the last compacted size if larger) and Redis is quiet (fewer than ``quiet_ops`` commands a
second: no queries to speak of), or, quiet or not, once it grew by ``force_bytes`` (or the last compacted size if
larger): under a load that never stops the file stays bounded, and is compacted that much less often.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from clipper.adapters.resp import RespClient, RespError
from clipper.errors import Unavailable

logger = logging.getLogger("clipper.local")

MIB = 1024 * 1024
# Redis's own start options for this: no automatic rewrite (the compactor decides)
REDIS_OPTIONS = ["--auto-aof-rewrite-percentage", "0"]


@dataclass(frozen=True)
class AofPolicy:
    due_bytes: int = 64 * MIB  # Redis's auto-aof-rewrite-min-size
    force_bytes: int = 512 * MIB
    quiet_ops: int = 100  # instantaneous_ops_per_sec below this: quiet (an idle stack makes 10-30)
    retry_s: float = 60.0  # after a rewrite was asked for, the next one no sooner (a failing one is Redis's to log)


def rewrite_reason(info: dict[str, str], policy: AofPolicy) -> str | None:
    """Why a rewrite is due now, from ``INFO persistence stats``; None when it is not."""
    if info.get("aof_enabled") != "1" or info.get("aof_rewrite_in_progress") != "0":
        return None
    if info.get("aof_rewrite_scheduled", "0") != "0" or info.get("rdb_bgsave_in_progress", "0") != "0":
        return None
    try:
        base, current = int(info["aof_base_size"]), int(info["aof_current_size"])
        ops = int(info["instantaneous_ops_per_sec"])
    except (KeyError, ValueError):
        return None
    grown = current - base
    if grown >= max(policy.force_bytes, base):
        return f"the append-only file grew by {grown / MIB:.0f} MB since its last rewrite ({ops} commands a second)"
    if grown >= max(policy.due_bytes, base) and ops < policy.quiet_ops:
        return f"the append-only file grew by {grown / MIB:.0f} MB since its last rewrite and redis is quiet"
    return None


def parse_info(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and not name.startswith("#"):
            out[name.strip()] = value.strip()
    return out


class AofCompactor:
    def __init__(
        self, client: RespClient, policy: AofPolicy | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._client = client
        self.policy = policy or AofPolicy()
        self._clock = clock
        self._asked_at: float | None = None
        self.rewrites = 0  # rewrites asked for

    def tick(self) -> str | None:
        """Ask for a rewrite when one is due (what ``rewrite_reason`` says); returns the reason, or None. Redis
        unreachable (restarting): nothing, the next tick sees."""
        now = self._clock()
        if self._asked_at is not None and now - self._asked_at < self.policy.retry_s:
            return None
        try:
            raw = self._client.call("INFO", "persistence", "stats")
            info = parse_info(raw.decode() if isinstance(raw, bytes) else str(raw))
            reason = rewrite_reason(info, self.policy)
            if reason is None:
                return None
            self._client.call("BGREWRITEAOF")
        except (Unavailable, OSError) as e:
            logger.debug("append-only file not checked: %s", e)
            return None
        except RespError as e:  # a rewrite or a save already running: the next tick sees
            logger.debug("append-only file rewrite not started: %s", e)
            return None
        self._asked_at = now
        self.rewrites += 1
        logger.info("redis append-only file rewrite started: %s", reason)
        return reason
