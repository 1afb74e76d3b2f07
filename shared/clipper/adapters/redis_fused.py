"""Round trips fused where the prediction cache, the reply channel and the request queues (Redis Streams) are one
standalone Redis (the local stack): the frontend's cache lookup and send of a single-input query
(``RedisLookupOrSend``), and the batcher's cache fill and reply publish of a batch (``RedisPublishAndFill``).

For each model, one script: the cached output if there is one; else, if this query can claim the input, the
query's message is added to the model's stream; else another query is computing it. The message is built before
the lookup (it is small: one input) and dropped by the script on a hit. The script names keys of the cache and of
the queue, which a Redis cluster keeps in different slots: it is only for a standalone server (wiring turns it on
when ``CLIPPER_REDIS_CLUSTER`` is false, the cache and the queues share ``REDIS_URL``, and the queues are Redis
Streams)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson

from clipper.adapters.redis_cache import RedisPredictionCache
from clipper.adapters.redis_replies import RedisReplyChannel, published
from clipper.adapters.redis_streams import RedisStreamRequestQueue
from clipper.adapters.resp import RespError
from clipper.core.messages import Reply
from clipper.errors import Unavailable

logger = logging.getLogger(__name__)

# KEYS: cache entry, claim, stream; ARGV: claim ttl ms, message body, MINID of the stream ('' for none), owner.
# {1, output}: a hit; {0, 1}: claimed and sent; {0, 0}: another query computes it.
_LOOKUP_OR_SEND = """
local v = redis.call('GET', KEYS[1])
if v then return {1, v} end
if not redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[1], 'NX') then return {0, 0} end
if ARGV[3] == '' then
  redis.call('XADD', KEYS[3], '*', 'body', ARGV[2])
else
  redis.call('XADD', KEYS[3], 'MINID', '~', ARGV[3], '*', 'body', ARGV[2])
end
return {0, 1}
"""

Outcome = tuple[str, Any]  # ("hit", output) | ("sent", None) | ("waiting", None)


class RedisLookupOrSend:
    def __init__(self, cache: RedisPredictionCache, queue: RedisStreamRequestQueue) -> None:
        if cache.client is not queue.client:
            raise ValueError("the cache and the queues must share one Redis client")
        self._cache = cache
        self._queue = queue
        self._client = cache.client
        self._script = self._client.script(_LOOKUP_OR_SEND)

    def _commands(
        self, requests: Sequence[tuple[str, str, str]], claim_ttl_s: float, owner: str
    ) -> list[tuple[Any, ...]]:
        ttl_ms = max(1, int(claim_ttl_s * 1000))
        minid = self._queue.minid()
        return [
            self._script.command(
                [self._cache.entry_key(key), self._cache.claim_key(key), self._queue.stream_key(url)],
                [ttl_ms, body, "" if minid is None else minid, owner],
            )
            for key, url, body in requests
        ]

    @staticmethod
    def _outcomes(replies: Sequence[Any]) -> list[Outcome]:
        out: list[Outcome] = []
        for reply in replies:
            if isinstance(reply, RespError):
                raise Unavailable(f"redis: {reply}")
            hit, value = reply
            out.append(("hit", orjson.loads(value)) if hit else ("sent", None) if value else ("waiting", None))
        return out

    def lookup_or_send(
        self,
        requests: Sequence[tuple[str, str, str]],
        claim_ttl_s: float,
        timeout: float | None = None,
        owner: str = "1",
    ) -> list[Outcome]:
        """For each ``(cache key, queue URL, message body)``: its cached output, or its message sent (this query
        computes it: ``owner`` holds the claim), or neither (another query computes it)."""
        return self._outcomes(self._client.execute(self._commands(requests, claim_ttl_s, owner), timeout))

    async def lookup_or_send_async(
        self,
        requests: Sequence[tuple[str, str, str]],
        claim_ttl_s: float,
        timeout: float | None = None,
        owner: str = "1",
    ) -> list[Outcome]:
        return self._outcomes(await self._client.aio.execute(self._commands(requests, claim_ttl_s, owner), timeout))


class RedisPublishAndFill:
    """A batch's outputs written to the cache and its replies published in one pipelined round trip (they were
    two: the publish, then the fill), the cache entries first: a query told of its answer finds it cached."""

    def __init__(self, replies: RedisReplyChannel, cache: RedisPredictionCache) -> None:
        if replies.client is not cache.client:
            raise ValueError("the reply channel and the cache must share one Redis client")
        self._replies = replies
        self._cache = cache
        self._client = cache.client

    def publish_and_fill(self, replies: Sequence[tuple[str, Reply]], entries: dict[str, Any]) -> list[bool]:
        fill = self._cache.put_commands(entries)
        results = self._client.execute([*fill, *(self._replies.publish_command(q, r) for q, r in replies)])
        failed = [r for r in results[: len(fill)] if isinstance(r, RespError)]
        if failed:  # the replies may still have gone out; a later miss only costs a recomputation
            logger.warning("cache not filled", extra={"error": str(failed[0])})
        return [bool(n) for n in published(results[len(fill) :])]
