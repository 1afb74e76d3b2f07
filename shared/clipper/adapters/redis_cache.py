"""The prediction cache in Redis (ElastiCache): bounded memory, evicted by the server's LRU policy (every key
has a TTL, so ``volatile-lru`` or ``allkeys-lru`` both approximate Clipper's CLOCK cache).

An entry ``clipper:cache:{<key>}`` holds a model's output as JSON; its claim ``clipper:inflight:{<key>}``
marks it as being computed by one query (single flight: the claim holds that query's token), and holds
``!<cause>`` for a moment when that query's model failed on it. A query that ran out of time deletes its claim
instead (only while it still holds it: scripts compare the token), and a query waiting on it with time left
claims the key and computes it (``poll_or_claim``). Both carry the key as their hash tag, so ``lookup`` (a
cached output, else the claim, in one script) runs in cluster mode too (ElastiCache Serverless); every other
command names one key, as cluster mode requires (``MGET`` over keys in different slots fails with CROSSSLOT),
pipelined in one round trip.

Calls go through the lean client (``clipper.adapters.resp``); a query's calls are bounded by its remaining
time (``timeout``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from clipper.adapters.resp import RespClient, RespError
from clipper.errors import Unavailable

# KEYS: entry, claim; ARGV: claim ttl ms, owner. {1, output}: a hit; {0, 1}: claimed by this caller; {0, 0}:
# another query computes it.
_LOOKUP = """
local v = redis.call('GET', KEYS[1])
if v then return {1, v} end
if redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[1], 'NX') then return {0, 1} end
return {0, 0}
"""

# KEYS: entry, claim; ARGV: claim ttl ms, owner. {1, output}: a hit; {2, 1}: nobody held it, claimed by this
# caller; {3, cause}: its owner failed; {0, 0}: another query computes it.
_POLL_OR_CLAIM = """
local v = redis.call('GET', KEYS[1])
if v then return {1, v} end
local c = redis.call('GET', KEYS[2])
if not c then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[1])
  return {2, 1}
end
if string.sub(c, 1, 1) == '!' then return {3, string.sub(c, 2)} end
return {0, 0}
"""

# KEYS: claim; ARGV: owner, then the failure's '!cause' and ttl ms (none: the claim is deleted). Only the owner's
# claim changes.
_END_CLAIM = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] then return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) and 1 or 0 end
return redis.call('DEL', KEYS[1])
"""


def _lookup_result(unique: list[str], replies: Sequence[Any]) -> tuple[dict[str, Any], set[str]]:
    hits: dict[str, Any] = {}
    owned: set[str] = set()
    for k, (hit, value) in zip(unique, replies, strict=True):
        if hit:
            hits[k] = orjson.loads(value)
        elif value:
            owned.add(k)
    return hits, owned


def _checked(replies: Sequence[Any]) -> Sequence[Any]:
    for r in replies:
        if isinstance(r, RespError):
            raise Unavailable(f"redis cache: {r}")
    return replies


class RedisPredictionCache:
    def __init__(self, client: RespClient, ttl_s: int = 3600, prefix: str = "clipper") -> None:
        self._client = client
        self._ttl = ttl_s
        self._prefix = prefix
        self._lookup = client.script(_LOOKUP)
        self._poll_or_claim = client.script(_POLL_OR_CLAIM)
        self._end_claim = client.script(_END_CLAIM)

    @property
    def client(self) -> RespClient:
        return self._client

    def entry_key(self, key: str) -> str:
        return f"{self._prefix}:cache:{{{key}}}"

    def claim_key(self, key: str) -> str:
        return f"{self._prefix}:inflight:{{{key}}}"

    def get_many(self, keys: list[str], timeout: float | None = None) -> dict[str, Any]:
        if not keys:
            return {}
        values = _checked(self._client.execute([("GET", self.entry_key(k)) for k in keys], timeout))
        return {k: orjson.loads(v) for k, v in zip(keys, values, strict=True) if v is not None}

    def lookup(
        self, keys: list[str], claim_ttl_s: float, timeout: float | None = None, owner: str = "1"
    ) -> tuple[dict[str, Any], set[str]]:
        """The cached outputs of ``keys``, and which of the others this caller now computes (their claims),
        in one round trip."""
        unique, commands = self._lookup_commands(keys, claim_ttl_s, owner)
        return _lookup_result(unique, _checked(self._client.execute(commands, timeout)))

    async def lookup_async(
        self, keys: list[str], claim_ttl_s: float, timeout: float | None = None, owner: str = "1"
    ) -> tuple[dict[str, Any], set[str]]:
        unique, commands = self._lookup_commands(keys, claim_ttl_s, owner)
        return _lookup_result(unique, _checked(await self._client.aio.execute(commands, timeout)))

    def _lookup_commands(
        self, keys: list[str], claim_ttl_s: float, owner: str
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        unique = list(dict.fromkeys(keys))
        ttl_ms = max(1, int(claim_ttl_s * 1000))
        script = self._lookup
        return unique, [script.command([self.entry_key(k), self.claim_key(k)], [ttl_ms, owner]) for k in unique]

    def put_many(self, entries: dict[str, Any], timeout: float | None = None) -> None:
        if entries:
            _checked(self._client.execute(self.put_commands(entries), timeout))

    async def put_many_async(self, entries: dict[str, Any], timeout: float | None = None) -> None:
        if entries:
            _checked(await self._client.aio.execute(self.put_commands(entries), timeout))

    def put_new(self, entries: dict[str, Any], timeout: float | None = None) -> None:
        if entries:
            commands = [("SET", self.entry_key(k), orjson.dumps(v), "EX", self._ttl, "NX") for k, v in entries.items()]
            _checked(self._client.execute(commands, timeout))

    def put_commands(self, entries: dict[str, Any]) -> list[tuple[Any, ...]]:
        """The commands that store ``entries`` and end their claims (for a caller's pipeline)."""
        commands: list[tuple[Any, ...]] = []
        for k, v in entries.items():
            commands.append(("SET", self.entry_key(k), orjson.dumps(v), "EX", self._ttl))
            commands.append(("DEL", self.claim_key(k)))
        return commands

    def claim(self, keys: list[str], ttl_s: float, timeout: float | None = None, owner: str = "1") -> set[str]:
        if not keys:
            return set()
        ttl_ms = max(1, int(ttl_s * 1000))
        results = _checked(
            self._client.execute([("SET", self.claim_key(k), owner, "PX", ttl_ms, "NX") for k in keys], timeout)
        )
        return {k for k, ok in zip(keys, results, strict=True) if ok}

    def fail_many(self, failures: dict[str, str], ttl_s: float, timeout: float | None = None, *, owner: str) -> None:
        """A failed claim holds ``!<cause>`` until it expires: waiting queries read the cause. Only the claims
        ``owner`` still holds."""
        if failures:
            _checked(self._client.execute(self._fail_commands(failures, ttl_s, owner), timeout))

    async def fail_many_async(
        self, failures: dict[str, str], ttl_s: float, timeout: float | None = None, *, owner: str
    ) -> None:
        if failures:
            _checked(await self._client.aio.execute(self._fail_commands(failures, ttl_s, owner), timeout))

    def _fail_commands(self, failures: dict[str, str], ttl_s: float, owner: str) -> list[tuple[Any, ...]]:
        ttl_ms = max(1, int(ttl_s * 1000))
        end = self._end_claim
        return [end.command([self.claim_key(k)], [owner, "!" + cause, ttl_ms]) for k, cause in failures.items()]

    def release(self, keys: list[str], owner: str, timeout: float | None = None) -> None:
        """Delete the claims ``owner`` still holds."""
        if keys:
            _checked(self._client.execute(self._release_commands(keys, owner), timeout))

    async def release_async(self, keys: list[str], owner: str, timeout: float | None = None) -> None:
        if keys:
            _checked(await self._client.aio.execute(self._release_commands(keys, owner), timeout))

    def _release_commands(self, keys: list[str], owner: str) -> list[tuple[Any, ...]]:
        return [self._end_claim.command([self.claim_key(k)], [owner]) for k in dict.fromkeys(keys)]

    def poll_or_claim(
        self, keys: list[str], claim_ttl_s: float, owner: str, timeout: float | None = None
    ) -> tuple[dict[str, Any], dict[str, str], set[str]]:
        """``poll`` and the claim of the keys nobody holds, in one round trip (a script per key)."""
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}, {}, set()
        ttl_ms = max(1, int(claim_ttl_s * 1000))
        script = self._poll_or_claim
        commands = [script.command([self.entry_key(k), self.claim_key(k)], [ttl_ms, owner]) for k in unique]
        hits: dict[str, Any] = {}
        failed: dict[str, str] = {}
        owned: set[str] = set()
        for k, (what, value) in zip(unique, _checked(self._client.execute(commands, timeout)), strict=True):
            if what == 1:
                hits[k] = orjson.loads(value)
            elif what == 2:
                owned.add(k)
            elif what == 3:
                failed[k] = value.decode(errors="replace")
        return hits, failed, owned

    def poll(self, keys: list[str], timeout: float | None = None) -> tuple[dict[str, Any], dict[str, str]]:
        if not keys:
            return {}, {}
        commands: list[tuple[Any, ...]] = []
        for k in keys:
            commands.append(("GET", self.entry_key(k)))
            commands.append(("GET", self.claim_key(k)))
        values = _checked(self._client.execute(commands, timeout))
        hits: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for i, k in enumerate(keys):
            value, claim = values[2 * i], values[2 * i + 1]
            if value is not None:
                hits[k] = orjson.loads(value)
            elif claim is not None and claim[:1] == b"!":
                failed[k] = claim[1:].decode(errors="replace")
        return hits, failed
