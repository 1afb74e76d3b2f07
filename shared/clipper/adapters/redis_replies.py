"""Reply channel over Redis: the batcher RPUSHes replies on a list, the frontend BLPOPs it.

A successful answer first claims a ``done`` key (SET NX), so a redelivered query is answered once. The batch
methods (``answered_many``, ``publish_many``) do the same for a whole batch in two pipelined round trips.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import redis

from clipper.core.messages import Reply
from clipper.errors import Unavailable


class RedisLike(Protocol):
    """The part of ``redis.Redis`` the channel uses."""

    def pipeline(self, transaction: bool = True) -> Any: ...

    def set(self, name: str, value: str, ex: int | None = None, nx: bool = False) -> Any: ...

    def exists(self, *names: str) -> Any: ...

    def blpop(self, keys: list[str], timeout: float) -> Any: ...


class RedisReplyChannel:
    def __init__(self, client: RedisLike, ttl_s: int = 300, prefix: str = "clipper") -> None:
        self._client = client
        self._ttl = ttl_s
        self._prefix = prefix

    def _list_key(self, reply_to: str) -> str:
        return f"{self._prefix}:reply:{{{reply_to}}}"

    def _done_key(self, reply_to: str, model: str) -> str:
        return f"{self._prefix}:done:{{{reply_to}}}:{model}"

    def publish(self, reply_to: str, reply: Reply) -> bool:
        try:
            if reply.ok and not self._client.set(self._done_key(reply_to, reply.model), "1", ex=self._ttl, nx=True):
                return False
            pipe = self._client.pipeline(transaction=False)
            pipe.rpush(self._list_key(reply_to), reply.to_json())
            pipe.expire(self._list_key(reply_to), self._ttl)
            pipe.execute()
        except redis.RedisError as e:
            raise Unavailable(f"redis: {type(e).__name__}") from e
        return True

    def publish_many(self, replies: Sequence[tuple[str, Reply]]) -> list[bool]:
        """Publish a batch of replies: one pipeline claims the ``done`` keys of the successful ones, a second
        pushes every reply that is not a duplicate. For each, False when it was a duplicate (dropped)."""
        try:
            claims = self._client.pipeline(transaction=False)
            for reply_to, reply in replies:
                if reply.ok:
                    claims.set(self._done_key(reply_to, reply.model), "1", ex=self._ttl, nx=True)
            claimed = iter(claims.execute() if len(claims) else [])
            fresh = [not reply.ok or bool(next(claimed)) for _, reply in replies]
            pushes = self._client.pipeline(transaction=False)
            for (reply_to, reply), new in zip(replies, fresh, strict=True):
                if new:
                    key = self._list_key(reply_to)
                    pushes.rpush(key, reply.to_json())
                    pushes.expire(key, self._ttl)
            if len(pushes):
                pushes.execute()
        except redis.RedisError as e:
            raise Unavailable(f"redis: {type(e).__name__}") from e
        return fresh

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
