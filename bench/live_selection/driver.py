"""The live side: a stream of queries to one application of the running stack, each followed by its feedback
(``POST /<app>/predict?debug=true``, then ``POST /<app>/update`` with the true label, both with the user's
``uid`` when the stream has users), one at a time on one keep-alive connection to 127.0.0.1; then the query
records the frontend kept for feedback (the selection, with the ``state_version`` it chose from, and each
model's output and version), read from the stack's Redis."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import numpy as np

from bench.live_selection.streams import Stream

TIMEOUT_S = 10.0


@dataclass
class LiveRun:
    app: str
    outputs: list[Any] = field(default_factory=list)
    defaults: list[bool] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # predict's HTTP status (0: no answer)
    feedback_statuses: list[int] = field(default_factory=list)
    query_at: list[float] = field(default_factory=list)  # monotonic seconds, when each query was sent
    feedback_at: list[float] = field(default_factory=list)
    predict_ms: list[float] = field(default_factory=list)
    update_ms: list[float] = field(default_factory=list)
    records: list[dict[str, Any] | None] = field(default_factory=list)
    default_causes: dict[str, int] = field(default_factory=dict)  # the defaults' explanations, counted
    seconds: float = 0.0

    def correct(self, labels: np.ndarray) -> np.ndarray:
        """A default, an error or no answer is a wrong answer."""
        answers = zip(self.outputs, self.defaults, self.statuses, labels.tolist(), strict=True)
        return np.array([s == 200 and not d and o == y for o, d, s, y in answers], bool)

    def visible(self) -> np.ndarray:
        """The ``state_version`` each query was chosen from (-1 where it left no record)."""
        return np.array([int(r["selection"].get("state_version", 0)) if r else -1 for r in self.records])

    def summary(self) -> dict[str, Any]:
        return {
            "queries": len(self.outputs),
            "seconds": round(self.seconds, 1),
            "queries_per_s": round(len(self.outputs) / self.seconds, 1) if self.seconds else None,
            "defaults": int(sum(self.defaults)),
            "non_200": int(sum(s != 200 for s in self.statuses)),
            "feedback_non_200": int(sum(s != 200 for s in self.feedback_statuses)),
            "missing_records": int(sum(r is None for r in self.records)),
            "default_causes": self.default_causes,
            "predict_ms_p50": round(float(np.median(self.predict_ms)), 2) if self.predict_ms else None,
            "update_ms_p50": round(float(np.median(self.update_ms)), 2) if self.update_ms else None,
        }


class Client:
    def __init__(self, url: str) -> None:
        u = urlparse(url)
        if u.hostname not in ("127.0.0.1", "localhost"):
            raise ValueError(f"the benchmark sends traffic to 127.0.0.1 only, not {url}")
        self._host, self._port = u.hostname, u.port or 80
        self._conn = http.client.HTTPConnection(self._host, self._port, timeout=TIMEOUT_S)

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        data = json.dumps(body)
        for attempt in range(2):  # once more on a fresh connection when the kept-alive one was closed
            try:
                self._conn.request("POST", path, data, {"Content-Type": "application/json"})
                r = self._conn.getresponse()
                return r.status, json.loads(r.read() or b"null")
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=TIMEOUT_S)
                if attempt:
                    return 0, None
        return 0, None

    def close(self) -> None:
        self._conn.close()


def drive(
    client: Client,
    app: str,
    stream: Stream,
    rate: float,
    before: Callable[[int], None] | None = None,
    progress: Callable[[int, LiveRun], None] | None = None,
) -> LiveRun:
    """Send the stream: each query, then its feedback, query ``t`` at ``t / rate`` seconds (at once when
    late). ``before(t)`` runs before query ``t`` is sent."""
    run = LiveRun(app)
    started = time.monotonic()
    for t in range(len(stream)):
        if before is not None:
            before(t)
            if t and run.query_at and time.monotonic() - run.query_at[-1] > 1.0:
                started = time.monotonic() - t / rate  # a pause (a version switch) shifts the schedule
        wait = started + t / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        body: dict[str, Any] = {"input": stream.x[t].tolist()}
        uid = stream.uid(t)
        if uid is not None:
            body["uid"] = uid
        run.query_at.append(time.monotonic())
        status, answer = client.post(f"/{app}/predict?debug=true", body)
        got = time.monotonic()
        run.predict_ms.append((got - run.query_at[-1]) * 1000)
        run.statuses.append(status)
        ok = status == 200 and isinstance(answer, dict)
        run.outputs.append(answer.get("output") if ok else None)
        run.defaults.append(bool(answer.get("default")) if ok else False)
        if run.defaults[-1]:
            cause = str(answer.get("default_explanation"))
            run.default_causes[cause] = run.default_causes.get(cause, 0) + 1
        run.feedback_at.append(time.monotonic())
        fb_status, _ = client.post(f"/{app}/update", {**body, "label": int(stream.y[t])})
        run.update_ms.append((time.monotonic() - run.feedback_at[-1]) * 1000)
        run.feedback_statuses.append(fb_status)
        if progress is not None:
            progress(t, run)
    run.seconds = time.monotonic() - run.query_at[0] if run.query_at else 0.0
    return run


def read_records(redis_url: str, run: LiveRun, stream: Stream, chunk: int = 500) -> None:
    """The frontend's query records of the run (``clipper.core.cache_keys.record_keys``), in query order."""
    from clipper.adapters.redis_cache import RedisPredictionCache
    from clipper.adapters.resp import RespClient
    from clipper.core.cache_keys import record_keys

    cache = RedisPredictionCache(RespClient.from_url(redis_url, timeout=10.0))
    keys = []
    for t in range(len(stream)):
        uid = stream.uid(t)
        (key,) = record_keys(run.app, None if uid is None else str(uid), stream.x[t : t + 1])
        keys.append(key)
    found: dict[str, Any] = {}
    for i in range(0, len(keys), chunk):
        found.update(cache.get_many(keys[i : i + chunk]))
    run.records = [found.get(k) for k in keys]
