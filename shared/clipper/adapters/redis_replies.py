"""Reply channel over Redis: each frontend process has an inbox (a Redis list); batchers RPUSH replies on the
inbox a query's reply address names, and one listener thread per process pops the inbox and hands each reply to
the query waiting for it.

A reply address is ``<inbox>.<uuid4 hex>``: 122 random bits per query, so two live queries never share one (it
is also the key that drops duplicate answers), and the inbox part tells a batcher where to push.

Why an inbox and a listener rather than a blocking pop per query: Redis checks the timeouts of blocked clients
on its ~100 ms internal tick, so a ``BLPOP`` with a 20 ms timeout returns at ~100 ms and every default came
late; here a query waits on a ``threading.Event`` with its exact remaining time, and one blocking connection
serves every query of the process. Replies that arrive for a query no longer waiting (late, after its
deadline) are dropped by the listener.

A successful answer claims a ``done`` key (SET NX) and pushes the reply in one atomic step (a Lua script), so a
redelivered query is answered once and a claim never stands without its reply. Both keys carry the inbox as
their hash tag, so the script runs in cluster mode too. ``publish_many`` runs the script for a whole batch in
one pipeline.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

import redis

from clipper.core.messages import Reply
from clipper.errors import ClipperError, Unavailable

logger = logging.getLogger(__name__)

# KEYS: done key, inbox key; ARGV: "<address> <reply JSON>", ttl, "1" when the reply is an answer to claim.
# 1: pushed, 0: a duplicate (already answered), nothing pushed.
_PUBLISH = """
if ARGV[3] == '1' and not redis.call('SET', KEYS[1], '1', 'EX', ARGV[2], 'NX') then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

# How long one blocking pop of the listener lasts: a reset or a stop is noticed within it.
LISTEN_BLOCK_S = 1.0
# Replies popped in one round trip after the blocking pop returns (a backlog is drained in few calls).
DRAIN_BATCH = 256


class RedisLike(Protocol):
    """The part of ``redis.Redis`` the channel uses."""

    def pipeline(self, transaction: bool = True) -> Any: ...

    def register_script(self, script: str) -> Any: ...

    def exists(self, *names: str) -> Any: ...

    def blpop(self, keys: list[str], timeout: float) -> Any: ...

    def lpop(self, name: str, count: int | None = None) -> Any: ...


def inbox_of(address: str) -> str:
    """The inbox part of a reply address (the whole address when it has none)."""
    return address.split(".", 1)[0]


class _Waiter:
    """The replies of one query so far: at most one per model, a success winning over an error."""

    __slots__ = ("_lock", "done", "models", "replies")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.done = threading.Event()
        self.models: frozenset[str] | None = None
        self.replies: dict[str, Reply] = {}

    def add(self, reply: Reply) -> None:
        with self._lock:
            known = self.replies.get(reply.model)
            if known is None or (reply.ok and not known.ok):
                self.replies[reply.model] = reply
            self._check()

    def expect(self, models: Collection[str]) -> None:
        with self._lock:
            self.models = frozenset(models)
            self._check()

    def _check(self) -> None:
        if self.models is not None and self.models <= self.replies.keys():
            self.done.set()


class RedisReplyChannel:
    def __init__(
        self,
        client: RedisLike,
        ttl_s: int = 300,
        prefix: str = "clipper",
        listener_client: Callable[[], RedisLike] | None = None,
    ) -> None:
        """``listener_client`` makes the client of the listener's blocking pops (its socket timeout must exceed
        ``LISTEN_BLOCK_S``); by default ``client`` itself."""
        self._client = client
        self._ttl = ttl_s
        self._prefix = prefix
        self._publish = client.register_script(_PUBLISH)  # EVALSHA, loaded on first use
        self._make_listener_client = listener_client or (lambda: client)
        self._lock = threading.Lock()
        self._inbox: str | None = None
        self._waiters: dict[str, _Waiter] = {}
        self._listener: threading.Thread | None = None
        self._generation = 0
        self._error: str | None = None
        self.dropped = 0  # replies that found no query waiting (late ones)

    # -- keys ------------------------------------------------------------------------------------------------
    def _inbox_key(self, inbox: str) -> str:
        return f"{self._prefix}:inbox:{{{inbox}}}"

    def _done_key(self, reply_to: str, model: str) -> str:
        return f"{self._prefix}:done:{{{inbox_of(reply_to)}}}:{reply_to}:{model}"

    # -- the batcher's side --------------------------------------------------------------------------------------
    def _run_publish(self, reply_to: str, reply: Reply, client: Any = None) -> Any:
        keys = [self._done_key(reply_to, reply.model), self._inbox_key(inbox_of(reply_to))]
        args = [f"{reply_to} {reply.to_json()}", self._ttl, "1" if reply.ok else "0"]
        return self._publish(keys=keys, args=args, client=client)

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

    # -- the frontend's side ----------------------------------------------------------------------------------
    def new_address(self) -> str:
        with self._lock:
            if self._inbox is None:
                self._inbox = uuid.uuid4().hex
            return f"{self._inbox}.{uuid.uuid4().hex}"

    def expect(self, reply_to: str) -> None:
        with self._lock:
            self._waiters.setdefault(reply_to, _Waiter())
            if self._listener is None or not self._listener.is_alive():
                self._start_listener()

    def wait(self, reply_to: str, models: Collection[str], timeout_s: float) -> list[Reply]:
        self.expect(reply_to)
        waiter = self._waiters[reply_to]
        waiter.expect(models)
        try:
            waiter.done.wait(max(0.0, timeout_s))
        finally:
            with self._lock:
                self._waiters.pop(reply_to, None)
        replies = list(waiter.replies.values())
        error = self._error
        if error is not None and len(replies) < len(models):
            raise Unavailable(error)
        return replies

    def reset(self) -> None:
        """A new inbox (after a SnapStart restore every container would share the snapshot's); the listener
        of the old one stops within ``LISTEN_BLOCK_S``."""
        with self._lock:
            self._inbox = None
            self._generation += 1
            self._listener = None
            self._waiters.clear()

    def close(self) -> None:
        """Stop the listener (within ``LISTEN_BLOCK_S``); a later ``expect`` starts a new one."""
        self.reset()

    # -- the listener ----------------------------------------------------------------------------------------
    def _start_listener(self) -> None:
        """Called with the lock held."""
        if self._inbox is None:
            self._inbox = uuid.uuid4().hex
        thread = threading.Thread(
            target=self._listen,
            args=(self._inbox_key(self._inbox), self._generation),
            name="clipper-reply-listener",
            daemon=True,
        )
        self._listener = thread
        thread.start()

    def _listen(self, key: str, generation: int) -> None:
        client = self._make_listener_client()
        backoff = 0.01
        while self._generation == generation:
            try:
                item = client.blpop([key], timeout=LISTEN_BLOCK_S)
                items = [item[1]] if item is not None else []
                if items:
                    items.extend(client.lpop(key, DRAIN_BATCH) or [])
                if self._error is not None:
                    logger.warning("reply listener reads its inbox again")
                self._error = None
                backoff = 0.01
            except redis.RedisError as e:
                if self._error is None:
                    logger.warning("reply listener cannot read its inbox: redis: %s", type(e).__name__)
                self._error = f"redis: {type(e).__name__}"
                time.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            for raw in items:
                self._dispatch(raw)

    def _dispatch(self, raw: bytes | str) -> None:
        text = raw.decode() if isinstance(raw, bytes) else raw
        address, _, body = text.partition(" ")
        waiter = self._waiters.get(address)
        if waiter is None:
            self.dropped += 1
            return
        try:
            waiter.add(Reply.from_json(body))
        except ClipperError as e:
            logger.warning("undecodable reply dropped: %s", e)
