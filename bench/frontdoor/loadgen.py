"""The open-loop load generator: pre-encoded HTTP/1.1 requests sent at their scheduled times over keep-alive
connections, on an asyncio (uvloop) event loop in the benchmark's own process, pinned to the generator's core.

Open loop: a query is sent at its scheduled time whether or not earlier ones were answered. A query goes out
on a free connection; when none is free the generator opens another (up to ``max_connections``) and the query
waits for the first connection that frees up. Its latency still counts from its scheduled time, so neither a
stalled system nor a stalled generator can hide queueing (no coordinated omission). A query not answered
within the request timeout is a timeout: its connection is dropped (HTTP/1.1 answers in order). Responses are
parsed by hand (status line, ``Content-Length``, the body); a 200 whose JSON body has ``"default": true`` is
a default, not a real answer.

Once the queries answered so far make the trial's verdict a failure whatever the rest do
(``stats.certainly_fails``), the trial stops: the verdict is exact, and an overloaded system is not left with a
backlog that would spill into the next trial.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import time
from collections import deque
from typing import Any

import numpy as np
import orjson

from bench.frontdoor.stats import DEFAULT, ERROR, PENDING, REAL, TIMEOUT, UNSENT, TrialRecord, certainly_fails

WATCH_EVERY_S = 0.02


class _Connection(asyncio.Protocol):
    def __init__(self, owner: OpenLoop) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.query = -1  # the query whose answer this connection waits for

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        self.owner.connected(self)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            length = _content_length(bytes(buffer[:end]))
            if length < 0:  # no Content-Length: this generator cannot frame the answer
                self.owner.answered(self, 0, b"")
                self.close()
                return
            total = end + 4 + length
            if len(buffer) < total:
                return
            status = int(buffer[9:12]) if buffer[:5] == b"HTTP/" else 0
            body = bytes(buffer[end + 4 : total])
            del buffer[:total]
            self.owner.answered(self, status, body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.lost(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def _content_length(head: bytes) -> int:
    at = head.lower().find(b"\r\ncontent-length:")
    if at < 0:
        return -1
    start = at + len(b"\r\ncontent-length:")
    end = head.find(b"\r\n", start)
    return int(head[start : end if end >= 0 else len(head)])


class OpenLoop:
    """One trial: ``requests[i]`` sent at ``offsets[i]`` seconds after the start."""

    def __init__(
        self,
        host: str,
        port: int,
        requests: list[bytes],
        offsets: np.ndarray,
        *,
        warmup_s: float,
        slo_s: float,
        timeout_s: float,
        max_connections: int,
        initial_connections: int,
        stop_early: bool = True,
    ) -> None:
        self.host, self.port = host, port
        self.requests = requests
        self.offsets = offsets
        self._offsets = offsets.tolist()
        n = len(offsets)
        self.latency = np.full(n, math.nan)
        self.late = np.full(n, math.nan)
        self.outcome = np.full(n, PENDING, dtype=np.int8)
        self.causes: dict[int, str] = {}  # query -> its default's explanation (what the stack gave up on)
        self.warmup_s, self.slo_s, self.timeout_s = warmup_s, slo_s, timeout_s
        self.max_connections, self.initial = max_connections, initial_connections
        self.planned = int(np.sum(offsets >= warmup_s))
        self.not_within = self.misses = self.finished = 0
        self.free: list[_Connection] = []
        self.live: set[_Connection] = set()
        self.waiting: deque[int] = deque()
        self.opening = 0
        self.opened = 0
        self.stop = False
        self.stop_early = stop_early
        self.closing = False
        self.t0 = 0.0
        self._done: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self) -> TrialRecord:
        loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        await asyncio.gather(*(self._connect() for _ in range(self.initial)))
        gc.collect()
        gc.disable()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        self.t0 = time.perf_counter() + 0.005
        watchdog = loop.create_task(self._watch())
        try:
            await self._send_all()
            if not self.stop and self.finished < len(self._offsets):
                last = self._offsets[-1] if self._offsets else 0.0
                left = self.t0 + last + self.timeout_s + 0.5 - time.perf_counter()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._done.wait(), timeout=max(0.1, left))
        finally:
            watchdog.cancel()
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            gc.enable()
            self.closing = True
            for conn in list(self.live):
                conn.close()
            await asyncio.sleep(0)
        if not self.stop:  # every query still without an answer waited past the request timeout
            self.outcome[(self.outcome == PENDING) & ~np.isnan(self.late)] = TIMEOUT
        self.outcome[self.outcome == PENDING] = UNSENT  # never sent, or abandoned when the trial stopped
        return TrialRecord(
            offsets=self.offsets,
            latency_s=self.latency,
            outcome=self.outcome,
            late_s=self.late,
            warmup_s=self.warmup_s,
            wall_s=wall,
            cpu_s=cpu,
            stopped_early=self.stop,
            connections=self.opened,
            causes=self.causes,
        )

    async def _send_all(self) -> None:
        offsets, clock, t0 = self._offsets, time.perf_counter, self.t0
        i, n = 0, len(offsets)
        while i < n and not self.stop:
            now = clock() - t0
            if offsets[i] > now:
                await asyncio.sleep(offsets[i] - now)
                continue
            while i < n and offsets[i] <= now and not self.stop:
                self._due(i)
                i += 1

    def _due(self, i: int) -> None:
        if self.free:
            self._write(self.free.pop(), i)
            return
        self.waiting.append(i)
        if len(self.live) + self.opening < self.max_connections:
            task = asyncio.get_running_loop().create_task(self._connect())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self) -> None:
        self.opening += 1
        try:
            await asyncio.get_running_loop().create_connection(lambda: _Connection(self), self.host, self.port)
        except OSError:
            pass  # the waiting queries time out; the next due query tries again
        finally:
            self.opening -= 1

    def _write(self, conn: _Connection, i: int) -> None:
        conn.query = i
        self.late[i] = time.perf_counter() - self.t0 - self._offsets[i]
        assert conn.transport is not None
        conn.transport.write(self.requests[i])

    def _idle(self, conn: _Connection) -> None:
        if self.stop:
            return
        if self.waiting:
            self._write(conn, self.waiting.popleft())
        else:
            self.free.append(conn)

    # -- callbacks of the connections ----------------------------------------------------------------------
    def connected(self, conn: _Connection) -> None:
        self.live.add(conn)
        self.opened += 1
        self._idle(conn)

    def answered(self, conn: _Connection, status: int, body: bytes) -> None:
        i, conn.query = conn.query, -1
        if i < 0 or self.outcome[i] != PENDING:
            conn.close()  # an answer nobody waits for: the connection is out of step
            return
        outcome = ERROR
        if status == 200:
            try:
                answer = orjson.loads(body)
                outcome = DEFAULT if answer.get("default") is True else REAL
                if outcome == DEFAULT:
                    self.causes[i] = str(answer.get("default_explanation") or "")
            except (orjson.JSONDecodeError, AttributeError):
                outcome = ERROR
        self._record(i, outcome, time.perf_counter() - self.t0 - self._offsets[i])
        self._idle(conn)

    def lost(self, conn: _Connection) -> None:
        self.live.discard(conn)
        if conn in self.free:
            self.free.remove(conn)
        if conn.query >= 0 and self.outcome[conn.query] == PENDING and not self.closing:
            self._record(conn.query, ERROR, math.nan)
        conn.query = -1

    def _record(self, i: int, outcome: int, latency_s: float) -> None:
        self.outcome[i] = outcome
        self.latency[i] = latency_s
        self.finished += 1
        if self._offsets[i] >= self.warmup_s:
            if outcome != REAL:
                self.misses += 1
                self.not_within += 1
            elif latency_s > self.slo_s:
                self.not_within += 1
            if self.stop_early and not self.stop and certainly_fails(self.planned, self.not_within, self.misses):
                self.stop = True
        if (self.stop or self.finished >= len(self._offsets)) and self._done is not None:
            self._done.set()

    async def _watch(self) -> None:
        """Time out queries: those waiting for a connection, and those whose connection has not answered."""
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            now = time.perf_counter() - self.t0
            limit = now - self.timeout_s
            while self.waiting and self._offsets[self.waiting[0]] < limit:
                self._record(self.waiting.popleft(), TIMEOUT, math.nan)
            for conn in list(self.live):
                if conn.query >= 0 and self._offsets[conn.query] < limit:
                    self._record(conn.query, TIMEOUT, math.nan)
                    conn.query = -1
                    conn.close()


class Runner:
    """The generator's event loop (uvloop when installed), kept for the whole run."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop
        try:
            import uvloop

            self.loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is installed with the endpoint extra
            self.loop = asyncio.new_event_loop()

    def trial(self, host: str, port: int, requests: list[bytes], offsets: np.ndarray, **kw: Any) -> TrialRecord:
        return self.loop.run_until_complete(OpenLoop(host, port, requests, offsets, **kw).run())

    def close(self) -> None:
        self.loop.close()
