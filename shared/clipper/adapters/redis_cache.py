"""The prediction cache in Redis (ElastiCache): bounded memory, evicted by the server's LRU policy
(``maxmemory-policy allkeys-lru``, which approximates Clipper's CLOCK cache), entries with a TTL.

Every command names one key: ElastiCache Serverless runs in cluster mode, where a multi-key command
(``MGET``) over keys in different hash slots fails with CROSSSLOT, so lookups are pipelined ``GET``s."""

from __future__ import annotations

import json
from typing import Any

import redis

from clipper.errors import Unavailable


class RedisPredictionCache:
    def __init__(self, client: Any, ttl_s: int = 3600, prefix: str = "clipper") -> None:
        self._client = client
        self._ttl = ttl_s
        self._prefix = prefix

    def _key(self, key: str) -> str:
        return f"{self._prefix}:cache:{key}"

    def _claim_key(self, key: str) -> str:
        return f"{self._prefix}:inflight:{key}"

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        if not keys:
            return {}
        try:
            pipe = self._client.pipeline(transaction=False)
            for k in keys:
                pipe.get(self._key(k))
            values = pipe.execute()
        except redis.RedisError as e:
            raise Unavailable(f"redis cache: {type(e).__name__}") from e
        return {k: json.loads(v) for k, v in zip(keys, values, strict=True) if v is not None}

    def put_many(self, entries: dict[str, Any]) -> None:
        if not entries:
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for k, v in entries.items():
                pipe.set(self._key(k), json.dumps(v), ex=self._ttl)
                pipe.delete(self._claim_key(k))
            pipe.execute()
        except redis.RedisError as e:
            raise Unavailable(f"redis cache: {type(e).__name__}") from e

    def claim(self, keys: list[str], ttl_s: float) -> set[str]:
        if not keys:
            return set()
        try:
            pipe = self._client.pipeline(transaction=False)
            for k in keys:
                pipe.set(self._claim_key(k), "1", px=max(1, int(ttl_s * 1000)), nx=True)
            results = pipe.execute()
        except redis.RedisError as e:
            raise Unavailable(f"redis cache: {type(e).__name__}") from e
        return {k for k, ok in zip(keys, results, strict=True) if ok}

    def fail_many(self, failures: dict[str, str], ttl_s: float) -> None:
        """A failed claim holds ``!<cause>`` until it expires: waiting queries read the cause."""
        if not failures:
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for k, cause in failures.items():
                pipe.set(self._claim_key(k), "!" + cause, px=max(1, int(ttl_s * 1000)))
            pipe.execute()
        except redis.RedisError as e:
            raise Unavailable(f"redis cache: {type(e).__name__}") from e

    def poll(self, keys: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
        if not keys:
            return {}, {}
        try:
            pipe = self._client.pipeline(transaction=False)
            for k in keys:
                pipe.get(self._key(k))
                pipe.get(self._claim_key(k))
            values = pipe.execute()
        except redis.RedisError as e:
            raise Unavailable(f"redis cache: {type(e).__name__}") from e
        hits: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for i, k in enumerate(keys):
            value, claim = values[2 * i], values[2 * i + 1]
            if value is not None:
                hits[k] = json.loads(value)
            elif claim is not None and claim[:1] == b"!":
                failed[k] = claim[1:].decode(errors="replace")
        return hits, failed
