"""Steady load at the stack's front door and what each query got: open-loop arrivals at a fixed rate (one thread
pool, urllib, keep no connection), distinct inputs (no cache can answer), each outcome classified:

- ``real``: 200 with ``"default": false``;
- ``default``: 200 with ``"default": true`` (its ``default_explanation`` kept as the cause; none is a defect);
- ``4xx`` / ``5xx``: the status;
- ``lost``: no HTTP answer at all within ``timeout_s`` (a refused or broken connection, or silence).

Each steady-load query keeps its serial number and, when a model answered, the output: ``bench.faults.truth``
checks it against the model's own answer for that input (a reply of another query would be a wrong answer).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Outcome:
    sent_s: float  # since the run's start
    latency_ms: float
    kind: str  # real | default | 4xx | 5xx | lost
    cause: str = ""
    serial: int = -1  # the steady load's query number (its input is ``Load.row(serial)``); -1: another query
    output: Any = None  # what a model answered (``real`` only)


@dataclass
class Load:
    url: str
    app: str
    rows: np.ndarray
    rate: float
    timeout_s: float = 5.0
    first_serial: int = 1  # a run's scenarios continue one numbering: no input comes back (the cache keeps answers)
    outcomes: list[Outcome] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._serial = self.first_serial - 1
        # A thread for every query that can be in flight (each waits at most timeout_s): arrivals stay on time
        # however long the stack holds its answers (max_lag_ms says how late a send was).
        workers = int(self.rate * self.timeout_s) + 32
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="faults-load")
        self.max_lag_ms = 0.0
        self._thread = threading.Thread(target=self._run, name="faults-pacer", daemon=True)

    def now(self) -> float:
        return time.monotonic() - self.started

    def row(self, serial: int) -> np.ndarray:
        row: np.ndarray = self.rows[serial % len(self.rows)].copy()
        row[0] = serial * 2.0**-20  # pixel 0 is blank in every digit: distinct inputs, same label
        return row

    @property
    def last_serial(self) -> int:
        return self._serial

    def next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def body(self, serial: int) -> bytes:
        return json.dumps({"input": self.row(serial).tolist()}).encode()

    def one(self, body: bytes, app: str | None = None, serial: int = -1) -> Outcome:
        sent = self.now()
        request = urllib.request.Request(
            f"{self.url}/{app or self.app}/predict", body, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as r:
                answer = json.loads(r.read())
            kind = "default" if answer.get("default") else "real"
            cause = answer.get("default_explanation") or ""
            output = answer.get("output") if kind == "real" else None
            outcome = Outcome(sent, (self.now() - sent) * 1000, kind, cause, serial, output)
        except urllib.error.HTTPError as e:
            kind = "5xx" if e.code >= 500 else "4xx"
            cause = f"{e.code} {e.read()[:200].decode(errors='replace')}"
            outcome = Outcome(sent, (self.now() - sent) * 1000, kind, cause, serial)
        except (OSError, ValueError) as e:
            outcome = Outcome(sent, (self.now() - sent) * 1000, "lost", f"{type(e).__name__}: {e}", serial)
        return outcome

    def _record(self, serial: int, due: float) -> None:
        lag_ms = (time.monotonic() - due) * 1000
        outcome = self.one(self.body(serial), serial=serial)
        with self._lock:
            self.outcomes.append(outcome)
            self.max_lag_ms = max(self.max_lag_ms, lag_ms)

    def _run(self) -> None:
        n = 0
        begin = time.monotonic()
        while not self._stop.is_set():
            n += 1
            due = begin + n / self.rate
            self._stop.wait(max(0.0, due - time.monotonic()))
            self._pool.submit(self._record, self.next_serial(), due)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[Outcome]:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)
        with self._lock:
            return sorted(self.outcomes, key=lambda o: o.sent_s)
