"""The load generator: its own process, pinned to its own core; Poisson arrivals, each query encoded as the
frontend encodes it at its arrival time, sent through a pipe."""

from __future__ import annotations

import contextlib
import gc
import os
import queue
import shutil
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from bench.batching.config import GENERATOR_CORE
from clipper.core.domain import InputType
from clipper.core.messages import QueryMessage, encode_rows


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None


def pin_process(core: int) -> None:
    """Pin every thread of this process (and the threads it starts later) to ``core``."""
    tids = [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, {core})


def settle_gc() -> None:
    """Collect, then move every surviving object out of the collector's reach (``gc.freeze``), as long-running
    Python servers do after start-up: otherwise a full collection scanning the benchmark's own heap (imports,
    the previous trial's records) pauses the process for up to ~50 ms in the middle of a trial."""
    gc.collect()
    gc.freeze()


def generator_main(commands: Connection, data: Connection, rows: np.ndarray, model: str, pin: bool) -> None:
    """Serve trial commands ``("run", trial, rate, duration_s, count, slo_ms, seed)``: send the trial's
    queries through ``data`` at their Poisson arrival times as ``("bodies", trial, [str, ...])``, then
    ``("end", trial, arrival times, lateness)``. A sender thread writes the pipe, so a reader that falls
    behind never delays the arrivals (the backlog waits here, as it would in a queue)."""
    if pin:
        pin_process(GENERATOR_CORE)
    sys.setswitchinterval(0.0005)  # hand the GIL to the sender promptly
    outbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()

    def sender() -> None:
        # Send what has piled up in one message (the reader pays per pipe message, as per SQS call).
        while (item := outbox.get()) is not None:
            while item[0] == "bodies" and not outbox.empty():
                more = outbox.get()
                if more is None or more[0] != "bodies":
                    data.send(item)
                    item = more
                    break
                item = ("bodies", item[1], item[2] + more[2])
            if item is None:
                return
            data.send(item)

    thread = threading.Thread(target=sender, name="sender", daemon=True)
    thread.start()
    with contextlib.suppress(KeyboardInterrupt, EOFError, OSError):
        while (command := commands.recv())[0] == "run":
            settle_gc()
            _generate(outbox, rows, model, *command[1:])
    outbox.put(None)
    thread.join(5)


def _generate(
    outbox: queue.SimpleQueue[tuple[Any, ...] | None],
    rows: np.ndarray,
    model: str,
    trial: int,
    rate: float,
    duration_s: float,
    count: int,
    slo_ms: float,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.exponential(1.0 / rate, size=count))
    offsets = offsets[offsets < duration_s]
    n = len(offsets)
    order = rng.integers(0, len(rows), size=n)
    lateness = np.zeros(n)
    t0 = time.monotonic() + 0.02
    wall0 = time.time() + (t0 - time.monotonic())
    i = 0
    while i < n:
        now = time.monotonic() - t0
        if offsets[i] > now:
            time.sleep(max(0.0, offsets[i] - now - 0.0001))
            continue
        j = min(int(np.searchsorted(offsets, now, side="right")), i + 256)
        bodies = []
        for k in range(i, j):
            # Exactly what the frontend sends: the rows of one query as .npy/base64, in a QueryMessage.
            payload, _ = encode_rows(rows[order[k] : order[k] + 1])
            sent = wall0 + offsets[k]
            message = QueryMessage(
                query_id=trial + k,
                app=f"bench-{model}",
                model=model,
                version="1",
                input_type=InputType.FLOATS,
                rows=1,
                payload=payload,
                deadline_ms=int((sent + slo_ms / 1000) * 1000),
                sent_ms=int(sent * 1000),
                reply_to=str(trial + k),
            )
            bodies.append(message.to_json())
        outbox.put(("bodies", trial, bodies))
        lateness[i:j] = (time.monotonic() - t0) - offsets[i:j]
        i = j
    outbox.put(("end", trial, offsets + t0, lateness))
