"""The local stack's request log: one line per HTTP request the gateway answered, in ``requests.log``::

    2025-05-01T10:00:00.123Z POST /digits/predict 200 3.2ms qid=4648994770124800

(time the request arrived, UTC; method; path without the query string, percent-encoded again where it holds a space,
a control character or a non-ASCII one, so a line is always six fields; status; time until the response was sent;
the frontend's ``X-Clipper-Query-Id`` response header, or ``-``). ``grep ' 5[0-9][0-9] '``, ``awk '$5+0 > 20'``.

It sits on the query path of the benchmarks, so a request costs one tuple appended to a deque: no body is read,
nothing is formatted or written on the event loop. A thread formats and writes what accumulated every
``flush_s`` (and at exit); past ``max_bytes`` the file is moved to ``requests.log.1`` and started again.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

QUERY_ID_HEADER = b"x-clipper-query-id"
# what a path keeps as it is in the log (RFC 3986's path characters, and % itself: ASGI's path is decoded, so a
# literal % stays one); a space, a newline or a non-ASCII letter is percent-encoded
PATH_SAFE = "/:@!$&'()*+,;=-._~%"

Entry = tuple[float, str, str, int, float, str]


class RequestLog:
    def __init__(self, path: Path, flush_s: float = 0.5, max_bytes: int = 64 * 1024 * 1024) -> None:
        self._path, self._flush_s, self._max_bytes = path, flush_s, max_bytes
        self._pending: collections.deque[Entry] = collections.deque()
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, at: float, method: str, path: str, status: int, latency_ms: float, query_id: str) -> None:
        self._pending.append((at, method, path, status, latency_ms, query_id))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _run(self) -> None:
        while not self._halt.wait(self._flush_s):
            self.flush()

    def close(self) -> None:
        self._halt.set()
        self.flush()

    def flush(self) -> int:
        with self._lock:
            lines = []
            while self._pending:
                at, method, path, status, ms, qid = self._pending.popleft()
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"
                lines.append(f"{stamp} {method} {quote(path, safe=PATH_SAFE)} {status} {ms:.1f}ms qid={qid}\n")
            if not lines:
                return 0
            try:
                if self._path.stat().st_size > self._max_bytes:
                    os.replace(self._path, self._path.with_name(self._path.name + ".1"))
            except FileNotFoundError:
                pass
            with open(self._path, "a", encoding="utf-8") as f:
                f.write("".join(lines))
            return len(lines)


def logged(app: Any, log: RequestLog) -> Any:
    """The ASGI ``app`` with each HTTP request recorded in ``log`` once its response is sent."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        at, started = time.time(), time.perf_counter()
        seen = [500, "-"]  # status, query id (a 500 if the app fails before it answers)

        async def watch(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                seen[0] = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == QUERY_ID_HEADER:
                        seen[1] = value.decode("latin-1")
            await send(message)

        try:
            await app(scope, receive, watch)
        finally:
            ms = (time.perf_counter() - started) * 1000
            log.record(at, scope["method"], scope["path"], int(seen[0]), ms, str(seen[1]))

    return wrapped
