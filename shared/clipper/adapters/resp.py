"""A lean Redis client for the hot paths: RESP2 over TCP (or TLS), pipelined, with a deadline per call.

Why not redis-py there: its per-command machinery (argument normalisation, connection-pool bookkeeping, retry
wrappers, the response callbacks) cost ~50-60 us of CPU per call on this project's machines, several times the
round trip itself, and it has no timeout per call. Every query makes a few Redis calls, so the frontend's own
CPU per query was mostly the client's. This client sends a whole pipeline with one ``sendall`` and parses the
replies from one buffer; each call is bounded by its ``timeout`` (a query passes its remaining time), after
which the connection is dropped and ``Unavailable`` raised.

    client = RespClient.from_url("redis://127.0.0.1:6379/0")
    client.call("SET", "k", "v")                      # one command; an error reply raises RespError
    client.execute([("GET", "k"), ("INCR", "n")])     # a pipeline; an error reply is a RespError in the list
    hit = client.script(LUA)                          # EVALSHA, loaded on the first NOSCRIPT
    client.execute([hit.command(keys, args)])

Connections are pooled (one per concurrent caller, a few kept idle); a connection whose call failed or timed
out is closed, never reused. ``close`` drops the idle ones (after a SnapStart restore).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from clipper.errors import Unavailable

if TYPE_CHECKING:
    from clipper.adapters.resp_async import AsyncRespClient

Arg = bytes | str | int | float
Command = Sequence[Arg]


class RespError(Exception):
    """An error reply from the server (``-ERR ...``, ``-NOSCRIPT ...``)."""


# What Redis 7 appends to an error raised inside a script (`` script: <sha>, on @user_script:<line>.``): the
# script's hash and line mean nothing to whoever reads a default's cause or a log line, the error before it does.
_SCRIPT_CONTEXT = re.compile(r" script: [0-9a-f]{40}, on @user_script:\d+\.$")


def _error(text: str) -> RespError:
    return RespError(_SCRIPT_CONTEXT.sub("", text) if " script: " in text else text)


class _Incomplete(Exception):
    """``buf`` does not hold the whole reply yet."""


def _encode(arg: Arg) -> bytes:
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, bool):
        raise TypeError("a bool is not a Redis argument")
    if isinstance(arg, int):
        return str(arg).encode()
    return repr(float(arg)).encode()


def pack(commands: Sequence[Command]) -> bytes:
    parts: list[bytes] = []
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        for arg in command:
            data = _encode(arg)
            parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


def parse(buf: bytes | bytearray, pos: int) -> tuple[Any, int]:
    """One reply from ``buf`` at ``pos``: (value, position after it); raises ``_Incomplete`` when ``buf`` does
    not hold all of it yet. Bulk strings are bytes, status replies str, nil None, error replies RespError."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    if kind == 36:  # $ bulk string
        n = int(buf[pos + 1 : end])
        if n < 0:
            return None, end + 2
        start = end + 2
        if len(buf) < start + n + 2:
            raise _Incomplete
        return bytes(buf[start : start + n]), start + n + 2
    if kind == 58:  # : integer
        return int(buf[pos + 1 : end]), end + 2
    if kind == 42:  # * array
        n = int(buf[pos + 1 : end])
        if n < 0:
            return None, end + 2
        items = []
        at = end + 2
        for _ in range(n):
            value, at = parse(buf, at)
            items.append(value)
        return items, at
    if kind == 43:  # + status
        return bytes(buf[pos + 1 : end]).decode(), end + 2
    if kind == 45:  # - error
        return _error(bytes(buf[pos + 1 : end]).decode(errors="replace")), end + 2
    raise ValueError(f"not a RESP reply: {bytes(buf[pos : pos + 20])!r}")


class ReplyScan:
    """Where the reply starting at ``at`` ends, found as its bytes arrive, without building it: each ``need``
    goes on from where the last one stopped (the elements already passed are not scanned again), keeping the
    elements still to pass at each level of nesting open so far.

    A reply is parsed once it is whole: parsed as it arrived, a large one (a receive of hundreds of 100 KB
    messages) was parsed again from its start after every read, its finished elements copied each time (51 MB
    took 0.76 s, 102 MB 6.4 s: past the client's timeout, so such a receive never completed); and its end looked
    for again from its start after every read cost a reply of many small elements time quadratic in their count
    (50,000 in 16 KB parts: 6.8 s)."""

    __slots__ = ("at", "left")

    def __init__(self, at: int) -> None:
        self.at = at
        self.left = [1]  # elements still to pass at each open level: the reply itself, then its open arrays

    def shift(self, by: int) -> None:
        """The buffer lost its first ``by`` bytes (replies before this one, answered)."""
        self.at -= by

    def need(self, buf: bytes | bytearray) -> int:
        """0 once the reply is whole in ``buf`` (it ends at ``at``); else a length ``buf`` needs at least before
        it may be (a bulk string's end, when its header says it; else one more byte). ``ValueError``: not RESP."""
        left, at = self.left, self.at
        try:
            while left:
                if not left[-1]:
                    left.pop()
                    continue
                end = buf.find(b"\r\n", at)
                if end < 0:
                    return len(buf) + 1
                kind = buf[at]
                if kind == 36:  # $ bulk string
                    n = int(buf[at + 1 : end])
                    stop = end + 2 if n < 0 else end + n + 4
                    if len(buf) < stop:
                        return stop
                    at = stop
                    left[-1] -= 1
                elif kind == 42:  # * array: its elements are passed before the rest of the level above
                    n = int(buf[at + 1 : end])
                    at = end + 2
                    left[-1] -= 1
                    if n > 0:
                        left.append(n)
                elif kind in (58, 43, 45):  # : integer, + status, - error
                    at = end + 2
                    left[-1] -= 1
                else:
                    raise ValueError(f"not a RESP reply: {bytes(buf[at : at + 20])!r}")
            return 0
        finally:
            self.at = at


class _Connection:
    def __init__(self, client: RespClient, deadline: float) -> None:
        self.buf = bytearray()
        remaining = max(0.001, deadline - time.monotonic())
        sock = socket.create_connection((client.host, client.port), timeout=min(remaining, client.connect_timeout))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if client.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=client.host)
        self.sock = sock
        setup: list[Command] = []
        if client.password is not None:
            setup.append(("AUTH", client.username, client.password) if client.username else ("AUTH", client.password))
        if client.db:
            setup.append(("SELECT", client.db))
        if setup:
            for reply in self.roundtrip(setup, deadline):
                if isinstance(reply, RespError):
                    raise reply

    def roundtrip(self, commands: Sequence[Command], deadline: float) -> list[Any]:
        self.sock.settimeout(max(0.0005, deadline - time.monotonic()))
        self.sock.sendall(pack(commands))
        out: list[Any] = []
        buf, pos = self.buf, 0
        while len(out) < len(commands):
            try:
                value, pos = parse(buf, pos)
            except _Incomplete:
                self._fill_reply(pos, deadline)  # then parsed once, whole
                continue
            out.append(value)
        del buf[:pos]
        return out

    def _fill_reply(self, pos: int, deadline: float) -> None:
        """Read until the reply at ``pos`` is whole in the buffer (checked without building it: ``ReplyScan``)."""
        scan = ReplyScan(pos)
        need = len(self.buf) + 1
        while need:
            while len(self.buf) < need:
                self._fill(deadline)
            need = scan.need(self.buf)

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.sock.settimeout(remaining)
        chunk = self.sock.recv(262144)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self.buf += chunk

    def usable(self) -> bool:
        """An idle connection has nothing to read: one that is readable was closed by the server (a restart, a
        failover, its idle timeout: the FIN is there) or holds stray bytes, and is not to be used again."""
        if self.buf:
            return False
        try:  # poll, not select: select refuses a descriptor of 1024 or more, and every call then connected again
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            readable = poller.poll(0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Script:
    """A Lua script run with EVALSHA (its SHA1 computed here); the client loads it on a NOSCRIPT reply."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def command(self, keys: Sequence[Arg], args: Sequence[Arg] = ()) -> tuple[Arg, ...]:
        return ("EVALSHA", self.sha, len(keys), *keys, *args)


class RespClient:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 6379,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        tls: bool = False,
        connect_timeout: float = 1.0,
        timeout: float = 1.0,
        max_idle: int = 16,
    ) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password, self.tls = username, password, tls
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._scripts: dict[str, str] = {}
        self._aio: AsyncRespClient | None = None

    @property
    def scripts(self) -> dict[str, str]:
        """The sources of the scripts made with ``script``, by SHA1."""
        return self._scripts

    @property
    def aio(self) -> AsyncRespClient:
        """The same server on the running event loop (``clipper.adapters.resp_async``)."""
        if self._aio is None:
            from clipper.adapters.resp_async import AsyncRespClient

            self._aio = AsyncRespClient(self)
        return self._aio

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RespClient:
        """``redis://[[user]:password@]host[:port][/db]``; ``rediss://`` for TLS."""
        u = urlparse(url)
        if u.scheme not in ("redis", "rediss"):
            raise ValueError(f"not a Redis URL: {url!r} (redis://host:port/db or rediss://...)")
        db = int(u.path.lstrip("/") or 0)
        return cls(
            u.hostname or "127.0.0.1",
            u.port or 6379,
            db=db,
            username=unquote(u.username) if u.username else None,
            password=unquote(u.password) if u.password else None,
            tls=u.scheme == "rediss",
            **options,
        )

    def script(self, source: str) -> Script:
        s = Script(source)
        self._scripts[s.sha] = source
        return s

    def execute(self, commands: Sequence[Command], timeout: float | None = None) -> list[Any]:
        """Send the commands as one pipeline and return their replies in order (an error reply as a RespError
        value). Raises ``Unavailable`` when the server cannot be reached or does not answer within ``timeout``
        (the client's default when None)."""
        if not commands:
            return []
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        replies = self._roundtrip(commands, deadline)
        missing = [i for i, r in enumerate(replies) if isinstance(r, RespError) and str(r).startswith("NOSCRIPT")]
        if missing:  # the server lost its scripts (a restart, a failover): load them and run those again
            shas = {str(commands[i][1]) for i in missing}
            loads: list[Command] = [("SCRIPT", "LOAD", self._scripts[sha]) for sha in shas if sha in self._scripts]
            again = self._roundtrip([*loads, *(commands[i] for i in missing)], deadline)[len(loads) :]
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    def call(self, *args: Arg, timeout: float | None = None) -> Any:
        (reply,) = self.execute([args], timeout)
        if isinstance(reply, RespError):
            raise reply
        return reply

    def _roundtrip(self, commands: Sequence[Command], deadline: float) -> list[Any]:
        conn: _Connection | None = None
        try:
            conn = self._take_idle()
            if conn is None:
                conn = _Connection(self, deadline)
            replies = conn.roundtrip(commands, deadline)
        except RespError as e:  # refused at connection set-up (AUTH, SELECT)
            if conn is not None:
                conn.close()
            raise Unavailable(f"redis {self.host}:{self.port}: {e}") from e
        except (OSError, ValueError) as e:  # refused, reset, timed out (TimeoutError is an OSError), garbage
            if conn is not None:
                conn.close()
            what = "no answer in time" if isinstance(e, TimeoutError) else type(e).__name__
            raise Unavailable(f"redis {self.host}:{self.port}: {what}") from e
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(conn)
                conn = None
        if conn is not None:
            conn.close()
        return replies

    def _take_idle(self) -> _Connection | None:
        """The most recently used idle connection the server has not closed; closed ones are dropped."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None or conn.usable():
                return conn
            conn.close()

    def close(self) -> None:
        """Drop the idle connections and the event loops' ones (the next call connects again)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        if self._aio is not None:
            self._aio.close()
