"""Reply channel over Redis: each frontend process has an inbox (a Redis list); batchers RPUSH replies on the
inbox a query's reply address names, and one listener thread per process pops the inbox and hands each reply to
the query waiting for it.

A reply address is ``<inbox>.<serial>``: the inbox is a uuid4 (122 random bits), new for each process (and after a
``reset``), and the serial counts that process's queries in hex, so two queries never share one (it is also the key
that drops duplicate answers), and the inbox part tells a batcher where to push.

Why an inbox and a listener rather than a blocking pop per query: Redis checks the timeouts of blocked clients
on its ~100 ms internal tick, so a ``BLPOP`` with a 20 ms timeout returns at ~100 ms and every default came
late; here a query waits on a ``threading.Event`` with its exact remaining time, and one blocking connection
serves every query of the process. Replies that arrive for a query no longer waiting (late, after its
deadline) are dropped by the listener.

A successful answer claims a ``done`` key (SET NX) and pushes the reply in one atomic step (a Lua script), so a
redelivered query is answered once and a claim never stands without its reply. Both keys carry the inbox as
their hash tag, so the script runs in cluster mode too. ``publish_many`` runs the script for a whole batch in
one pipeline.

Queries wait either on a thread (``wait``) or on an event loop (``wait_async``: the listener hands the reply to
the loop, so the frontend's route awaits its replies without holding a thread).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from clipper.adapters.resp import RespClient, RespError
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


def inbox_of(address: str) -> str:
    """The inbox part of a reply address (the whole address when it has none)."""
    return address.split(".", 1)[0]


class _Waiter:
    """The replies of one query so far: at most one per model, a success winning over an error."""

    __slots__ = ("_event", "_lock", "finished", "future", "loop", "loop_thread", "models", "replies")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.finished = False  # every expected model replied
        self._event: threading.Event | None = None  # made for a thread that waits (``block``), not on a loop
        self.models: frozenset[str] | None = None
        self.replies: dict[str, Reply] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread = 0  # the thread that runs ``loop``
        self.future: asyncio.Future[None] | None = None

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

    def block(self, timeout_s: float) -> None:
        """Wait on this thread until every expected model replied, at most ``timeout_s``."""
        with self._lock:
            if self.finished:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        event.wait(timeout_s)

    def _check(self) -> None:
        if self.models is not None and self.models <= self.replies.keys() and not self.finished:
            self.finished = True
            if self._event is not None:
                self._event.set()
            if self.loop is not None and self.future is not None:
                if threading.get_ident() == self.loop_thread:  # on the waiter's loop (its listener's)
                    _resolve(self.future)
                else:
                    self.loop.call_soon_threadsafe(_resolve, self.future)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def published(replies: list[Any]) -> list[Any]:
    """The replies of publish commands; ``Unavailable`` when Redis refused one."""
    for r in replies:
        if isinstance(r, RespError):
            raise Unavailable(f"redis: {r}")
    return replies


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class RedisReplyChannel:
    def __init__(self, client: RespClient, ttl_s: int = 300, prefix: str = "clipper") -> None:
        self._client = client
        self._ttl = ttl_s
        self._prefix = prefix
        self._publish = client.script(_PUBLISH)
        self._lock = threading.Lock()
        self._inbox: str | None = None
        self._waiters: dict[str, _Waiter] = {}
        self._serials = itertools.count(1)  # the serial part of this process's reply addresses
        self._listener: threading.Thread | None = None
        self._loop_listener: asyncio.Task[None] | None = None
        self._loop_thread = 0
        self._generation = 0
        self._error: str | None = None
        self.dropped = 0  # replies that found no query waiting (late ones)

    # -- keys ------------------------------------------------------------------------------------------------
    def _inbox_key(self, inbox: str) -> str:
        return f"{self._prefix}:inbox:{{{inbox}}}"

    def _done_key(self, reply_to: str, model: str) -> str:
        return f"{self._prefix}:done:{{{inbox_of(reply_to)}}}:{reply_to}:{model}"

    # -- the batcher's side --------------------------------------------------------------------------------------
    def publish_command(self, reply_to: str, reply: Reply) -> tuple[Any, ...]:
        keys = [self._done_key(reply_to, reply.model), self._inbox_key(inbox_of(reply_to))]
        return self._publish.command(keys, [f"{reply_to} {reply.to_json()}", self._ttl, "1" if reply.ok else "0"])

    @property
    def client(self) -> RespClient:
        return self._client

    def _execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        return published(self._client.execute(commands))

    def publish(self, reply_to: str, reply: Reply) -> bool:
        return self.publish_many([(reply_to, reply)])[0]

    def publish_many(self, replies: Sequence[tuple[str, Reply]]) -> list[bool]:
        """Publish a batch of replies in one pipelined round trip (each claimed and pushed atomically). For
        each, False when it was a duplicate (dropped)."""
        if not replies:
            return []
        return [bool(n) for n in self._execute([self.publish_command(q, r) for q, r in replies])]

    def answered_many(self, keys: Sequence[tuple[str, str]]) -> list[bool]:
        if not keys:
            return []
        return [bool(n) for n in self._execute([("EXISTS", self._done_key(q, m)) for q, m in keys])]

    def answered(self, reply_to: str, model: str) -> bool:
        return self.answered_many([(reply_to, model)])[0]

    # -- the frontend's side ----------------------------------------------------------------------------------
    def new_address(self) -> str:
        with self._lock:
            if self._inbox is None:
                self._inbox = uuid.uuid4().hex
            return f"{self._inbox}.{next(self._serials):x}"

    def _loop_listener_here(self) -> asyncio.AbstractEventLoop | None:
        """The loop listener's loop when this thread runs it (no asyncio lookup: that costs a getpid call)."""
        task = self._loop_listener
        if task is not None and self._loop_thread == threading.get_ident() and not task.done():
            loop = task.get_loop()
            if loop.is_running():
                return loop
        return None

    def expect(self, reply_to: str) -> None:
        if self._loop_listener_here() is not None:
            self._waiter(reply_to)
            return  # the event loop's listener serves every waiter of the process
        loop = _running_loop()
        with self._lock:
            self._waiter(reply_to)
            listening = self._loop_listener is not None and not self._loop_listener.done()
            if listening and (loop is None or self._loop_listener.get_loop() is loop):  # type: ignore[union-attr]
                return  # the event loop's listener serves every waiter of the process
            if loop is not None:  # expected on an event loop: its replies are read on that loop
                self._start_loop_listener(loop)
            elif self._listener is None or not self._listener.is_alive():
                self._start_listener()

    def forget(self, reply_to: str) -> None:
        with self._lock:
            self._waiters.pop(reply_to, None)

    def wait(self, reply_to: str, models: Collection[str], timeout_s: float) -> list[Reply]:
        self.expect(reply_to)
        waiter = self._waiters[reply_to]
        waiter.expect(models)
        try:
            waiter.block(max(0.0, timeout_s))
        finally:
            with self._lock:
                self._waiters.pop(reply_to, None)
        return self._outcome(waiter, models)

    async def wait_async(self, reply_to: str, models: Collection[str], timeout_s: float) -> list[Reply]:
        """``wait`` for a query on an event loop: no thread is held while it waits, and the replies are read
        by a listener on the same loop (its own connection), so no thread is woken for them either."""
        loop = self._loop_listener_here()
        if loop is None:
            loop = asyncio.get_running_loop()
            with self._lock:
                listener = self._loop_listener
                if listener is None or listener.done() or listener.get_loop() is not loop:
                    self._start_loop_listener(loop)
        waiter = self._waiter(reply_to)
        waiter.loop, waiter.loop_thread = loop, threading.get_ident()
        waiter.future = loop.create_future()
        waiter.expect(models)  # resolves the future at once when every model replied already
        expire = loop.call_later(max(0.0, timeout_s), _resolve, waiter.future)
        try:
            await waiter.future
        finally:
            expire.cancel()
            with self._lock:
                self._waiters.pop(reply_to, None)
        return self._outcome(waiter, models)

    def _waiter(self, reply_to: str) -> _Waiter:
        """The query's waiter, made on its first use (``expect``, then ``wait``/``wait_async``: one a query)."""
        waiter = self._waiters.get(reply_to)
        if waiter is None:
            waiter = self._waiters[reply_to] = _Waiter()
        return waiter

    def _outcome(self, waiter: _Waiter, models: Collection[str]) -> list[Reply]:
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
            if self._loop_listener is not None:
                loop = self._loop_listener.get_loop()
                if not loop.is_closed():
                    loop.call_soon_threadsafe(self._loop_listener.cancel)
            self._loop_listener = None
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
        backoff = 0.01
        while self._generation == generation:
            try:
                items = self._pop(key)
                if self._error is not None:
                    logger.warning("reply listener reads its inbox again")
                self._error = None
                backoff = 0.01
            except (Unavailable, RespError) as e:
                if self._error is None:
                    logger.warning("reply listener cannot read its inbox: %s", e)
                self._error = f"redis: {e}"
                time.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            for raw in items:
                self._dispatch(raw)

    def _pop(self, key: str) -> list[bytes]:
        """The inbox's replies: block for the first (up to ``LISTEN_BLOCK_S``) and take what else is there, in
        one round trip (the server runs the pipelined LPOP once the BLPOP returns)."""
        first, rest = self._client.execute(
            [("BLPOP", key, LISTEN_BLOCK_S), ("LPOP", key, DRAIN_BATCH)], timeout=LISTEN_BLOCK_S + 2
        )
        for reply in (first, rest):
            if isinstance(reply, RespError):
                raise reply
        return [first[1], *(rest or [])] if first is not None else list(rest or [])

    def _start_loop_listener(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called with the lock held: the listener becomes a task of ``loop`` (the thread listener, if any,
        stops within ``LISTEN_BLOCK_S``)."""
        if self._inbox is None:
            self._inbox = uuid.uuid4().hex
        if self._listener is not None:
            self._generation += 1  # the thread listener's loop ends
            self._listener = None
        from clipper.adapters.resp_async import AsyncRespClient

        connection = AsyncRespClient(self._client)  # its own connection: the blocking pops would hold a shared one
        self._loop_thread = threading.get_ident()
        # a context of its own: a task copies the context it is made in, here the first query's, whose correlation
        # id and application its log lines (the inbox unreadable, read again) carried for the process's life
        self._loop_listener = loop.create_task(
            self._listen_on_loop(connection, self._inbox_key(self._inbox), self._generation),
            name="clipper-reply-listener",
            context=contextvars.Context(),
        )

    async def _listen_on_loop(self, connection: Any, key: str, generation: int) -> None:
        backoff = 0.01
        try:
            while self._generation == generation:
                try:
                    first, rest = await connection.execute(
                        [("BLPOP", key, LISTEN_BLOCK_S), ("LPOP", key, DRAIN_BATCH)], timeout=LISTEN_BLOCK_S + 2
                    )
                    for reply in (first, rest):
                        if isinstance(reply, RespError):
                            raise reply
                    if self._error is not None:
                        logger.warning("reply listener reads its inbox again")
                    self._error = None
                    backoff = 0.01
                except (Unavailable, RespError) as e:
                    if self._error is None:
                        logger.warning("reply listener cannot read its inbox: %s", e)
                    self._error = f"redis: {e}"
                    await asyncio.sleep(backoff)
                    backoff = min(1.0, backoff * 2)
                    continue
                for raw in [first[1], *(rest or [])] if first is not None else list(rest or []):
                    self._dispatch(raw)
        finally:
            connection.close()

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
