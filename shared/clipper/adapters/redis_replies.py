"""Reply channel over Redis: the batcher RPUSHes replies on a list, the frontend BLPOPs it.

A successful answer claims a ``done`` key (SET NX) and pushes the reply in one atomic step (a Lua script), so a
redelivered query is answered once and a claim never stands without its reply (a failure between the two
would make the retry look like a duplicate and lose the answer). Both keys carry the ``{reply_to}`` hash tag,
so the script runs in cluster mode too. ``publish_many`` runs the script for a whole batch in one pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import redis

from clipper.core.messages import Reply
from clipper.errors import Unavailable

# KEYS: done key, list key; ARGV: reply JSON, ttl, "1" when the reply is an answer to claim. 1: pushed,
# 0: a duplicate (already answered), nothing pushed.
_PUBLISH = """
if ARGV[3] == '1' and not redis.call('SET', KEYS[1], '1', 'EX', ARGV[2], 'NX') then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""


class RedisLike(Protocol):
    """The part of ``redis.Redis`` the channel uses."""

    def pipeline(self, transaction: bool = True) -> Any: ...

    def register_script(self, script: str) -> Any: ...

    def set(self, name: str, value: str, ex: int | None = None, nx: bool = False) -> Any: ...

    def exists(self, *names: str) -> Any: ...

    def blpop(self, keys: list[str], timeout: float) -> Any: ...


class RedisReplyChannel:
    def __init__(self, client: RedisLike, ttl_s: int = 300, prefix: str = "clipper") -> None:
        self._client = client
        self._ttl = ttl_s
        self._prefix = prefix
        self._publish = client.register_script(_PUBLISH)  # EVALSHA, loaded on first use

    def _list_key(self, reply_to: str) -> str:
        return f"{self._prefix}:reply:{{{reply_to}}}"

    def _done_key(self, reply_to: str, model: str) -> str:
        return f"{self._prefix}:done:{{{reply_to}}}:{model}"

    def _run_publish(self, reply_to: str, reply: Reply, client: Any = None) -> Any:
        keys = [self._done_key(reply_to, reply.model), self._list_key(reply_to)]
        return self._publish(keys=keys, args=[reply.to_json(), self._ttl, "1" if reply.ok else "0"], client=client)

    def publish(self, reply_to: str, reply: Reply) -> bool:
        try:
            return bool(self._run_publish(reply_to, reply))
        except redis.RedisError as e:
            raise Unavailable(f"redis: {type(e).__name__}") from e

    def publish_many(self, replies: Sequence[tuple[str, Reply]]) -> list[bool]:
        """Publish a batch of replies in one pipelined round trip (each claimed and pushed atomically). For
        each, False when it was a duplicate (dropped)."""
        if not replies:
            return []
        try:
            pipe = self._client.pipeline(transaction=False)
            for reply_to, reply in replies:
                self._run_publish(reply_to, reply, client=pipe)
            return [bool(n) for n in pipe.execute()]
        except redis.RedisError as e:
            raise Unavailable(f"redis: {type(e).__name__}") from e

    def answered_many(self, keys: Sequence[tuple[str, str]]) -> list[bool]:
        try:
            pipe = self._client.pipeline(transaction=False)
            for reply_to, model in keys:
                pipe.exists(self._done_key(reply_to, model))
            return [bool(n) for n in pipe.execute()] if keys else []
        except redis.RedisError as e:
            raise Unavailable(f"redis: {type(e).__name__}") from e

    def answered(self, reply_to: str, model: str) -> bool:
        try:
            return bool(self._client.exists(self._done_key(reply_to, model)))
        except redis.RedisError as e:
            raise Unavailable(f"redis: {type(e).__name__}") from e

    def wait(self, reply_to: str, expected: int, timeout_s: float) -> list[Reply]:
        replies: list[Reply] = []
        end = time.monotonic() + timeout_s
        key = self._list_key(reply_to)
        try:
            while len(replies) < expected:
                remaining = end - time.monotonic()
                if remaining < 0.001:
                    break
                item = self._client.blpop([key], timeout=remaining)
                if item is None:
                    break
                replies.append(Reply.from_json(item[1]))
        except redis.RedisError as e:
            raise Unavailable(f"redis: {type(e).__name__}") from e
        return replies
