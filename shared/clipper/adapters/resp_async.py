"""The lean Redis client on an event loop: the frontend's query path awaits Redis without a thread.

One connection per event loop (an ``asyncio.Protocol``) carries every caller's pipelines in order: a pipeline is
written with one ``write`` and its replies are parsed from the connection's buffer as they arrive, resolving its
future. Concurrent queries on one loop share the connection (Redis answers in order), so their commands go out
and come back in as few reads and writes as the loop's turns allow, with no thread switch.

Each call has a deadline (a query passes its remaining time): when it passes, the caller gets ``Unavailable``
and its replies, when they come, are dropped. A connection whose oldest call has waited longer than the client's
default timeout is taken as hung and closed (every call on it fails; the next call connects again).

It shares its settings and its scripts with the thread client it is made from (``RespClient.aio``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from clipper.adapters.resp import Command, ReplyScan, RespError, _Incomplete, pack, parse
from clipper.errors import Unavailable

if TYPE_CHECKING:
    from clipper.adapters.resp import RespClient


class _Call:
    __slots__ = ("future", "replies", "started", "wanted")

    def __init__(self, future: asyncio.Future[list[Any]], wanted: int) -> None:
        self.future = future
        self.wanted = wanted
        self.replies: list[Any] = []
        self.started = time.monotonic()


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.calls: collections.deque[_Call] = collections.deque()
        self.closed = False
        self.outgoing: list[bytes] = []
        self.need = 0  # > 0: the reply at the buffer's start is incomplete, and needs a buffer this long at least
        self.scan: ReplyScan | None = None  # that reply's end, looked for as its parts come
        self.loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if len(buf) < self.need:  # the reply at the buffer's start is known to need more (resp.ReplyScan)
            return
        pos = 0
        calls = self.calls
        try:
            if self.scan is not None:  # that reply came in parts: parsed once it is whole, not again at every part
                self.need = self.scan.need(buf)
                if self.need:
                    return
                self.scan = None
            while calls:
                try:
                    value, pos = parse(buf, pos)
                except _Incomplete:
                    scan = ReplyScan(pos)
                    self.need = scan.need(buf) - pos  # from the buffer's start, once the answered are cut
                    scan.shift(pos)
                    self.scan = scan
                    break
                call = calls[0]
                call.replies.append(value)
                if len(call.replies) == call.wanted:
                    calls.popleft()
                    if not call.future.done():  # a caller past its deadline is gone: its replies are dropped
                        call.future.set_result(call.replies)
        except ValueError as e:  # not RESP: nothing on this connection can be trusted
            self.fail(ConnectionError(f"garbage from the server: {e}"))
            return
        del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(exc or ConnectionError("connection closed by the server"))

    def fail(self, exc: Exception) -> None:
        self.closed = True
        while self.calls:
            call = self.calls.popleft()
            if not call.future.done():
                call.future.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def send(self, commands: Sequence[Command], future: asyncio.Future[list[Any]]) -> _Call:
        """Queue the commands; they are written at the end of this turn of the loop, with those of every other
        query that sent in the same turn (one write, one syscall, under load)."""
        call = _Call(future, len(commands))
        self.calls.append(call)
        if not self.outgoing:
            self.loop.call_soon(self._flush)
        self.outgoing.append(pack(commands))
        return call

    def _flush(self) -> None:
        data, self.outgoing = self.outgoing, []
        if self.transport is not None and not self.closed and data:
            self.transport.write(b"".join(data) if len(data) > 1 else data[0])


def _expire(future: asyncio.Future[list[Any]]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class AsyncRespClient:
    def __init__(self, client: RespClient) -> None:
        self._client = client
        self._connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Protocol] = weakref.WeakKeyDictionary()
        self._connecting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._by_thread: dict[int, _Protocol] = {}

    async def _connection(self, deadline: float) -> _Protocol:
        # The connection of the loop this thread runs, found without asking asyncio for the running loop (which
        # costs a getpid system call in CPython 3.11): a thread runs one loop at a time, so the thread's last
        # connection is this loop's while its loop is running and not closed.
        fast = self._by_thread.get(threading.get_ident())
        if fast is not None and not fast.closed and fast.loop.is_running():
            return fast
        loop = asyncio.get_running_loop()
        known = self._connections.get(loop)
        if known is not None and not known.closed:
            self._by_thread[threading.get_ident()] = known
            return known
        lock = self._connecting.setdefault(loop, asyncio.Lock())
        async with lock:
            known = self._connections.get(loop)
            if known is not None and not known.closed:
                return known
            c = self._client
            timeout = max(0.001, min(c.connect_timeout, deadline - time.monotonic()))
            ssl = True if c.tls else None
            _, made = await asyncio.wait_for(
                loop.create_connection(_Protocol, c.host, c.port, ssl=ssl, server_hostname=c.host if c.tls else None),
                timeout,
            )
            conn = made
            setup: list[Command] = []
            if c.password is not None:
                setup.append(("AUTH", c.username, c.password) if c.username else ("AUTH", c.password))
            if c.db:
                setup.append(("SELECT", c.db))
            if setup:
                future: asyncio.Future[list[Any]] = loop.create_future()
                conn.send(setup, future)
                try:
                    replies = await asyncio.wait_for(future, max(0.001, deadline - time.monotonic()))
                except BaseException:  # not answered in time (or cancelled): the connection is not kept, so closed
                    conn.fail(ConnectionError("connection set-up not answered"))
                    raise
                for reply in replies:
                    if isinstance(reply, RespError):
                        conn.fail(ConnectionError(str(reply)))
                        raise reply
            self._connections[loop] = conn
            self._by_thread[threading.get_ident()] = conn
            return conn

    async def execute(self, commands: Sequence[Command], timeout: float | None = None) -> list[Any]:
        """As ``RespClient.execute``, on the running event loop."""
        if not commands:
            return []
        deadline = time.monotonic() + (self._client.timeout if timeout is None else timeout)
        replies = await self._roundtrip(commands, deadline)
        missing = [i for i, r in enumerate(replies) if isinstance(r, RespError) and str(r).startswith("NOSCRIPT")]
        if missing:  # the server lost its scripts (a restart, a failover): load them and run those again
            scripts = self._client.scripts
            shas = {str(commands[i][1]) for i in missing}
            loads: list[Command] = [("SCRIPT", "LOAD", scripts[sha]) for sha in shas if sha in scripts]
            again = (await self._roundtrip([*loads, *(commands[i] for i in missing)], deadline))[len(loads) :]
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _roundtrip(self, commands: Sequence[Command], deadline: float) -> list[Any]:
        where = f"redis {self._client.host}:{self._client.port}"
        try:
            conn = await self._connection(deadline)
            loop = conn.loop
            future: asyncio.Future[list[Any]] = loop.create_future()
            conn.send(commands, future)
            expire = loop.call_later(max(0.0005, deadline - time.monotonic()), _expire, future)
            try:
                return await future
            finally:
                expire.cancel()
        except TimeoutError as e:
            self._check_hung()
            raise Unavailable(f"{where}: no answer in time") from e
        except RespError as e:  # refused at connection set-up (AUTH, SELECT)
            raise Unavailable(f"{where}: {e}") from e
        except (OSError, ValueError) as e:
            raise Unavailable(f"{where}: {type(e).__name__}") from e

    def _check_hung(self) -> None:
        """Close this loop's connection when its oldest call has waited longer than the client's timeout."""
        conn = self._by_thread.get(threading.get_ident())
        if conn is not None and conn.calls and time.monotonic() - conn.calls[0].started > self._client.timeout:
            conn.fail(ConnectionError("no answer within the client's timeout: connection dropped"))

    def close(self) -> None:
        """Fail every loop's connection and its calls in flight; a loop running on another thread does it on its
        own thread (its futures and transport are not thread-safe: from here they were touched mid-turn)."""
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for conn in list(self._connections.values()):
            error = ConnectionError("client closed")
            loop = getattr(conn, "loop", None)
            if loop is not None and loop.is_closed():  # its transport went with it: nothing to close or fail
                continue
            if loop is not None and loop is not here and loop.is_running():
                with contextlib.suppress(RuntimeError):  # closed meanwhile: nothing left to fail
                    loop.call_soon_threadsafe(conn.fail, error)
            else:
                conn.fail(error)
        self._connections.clear()
        self._by_thread.clear()
