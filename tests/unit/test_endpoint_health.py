"""The model endpoint's health: ``/ping`` answers 503 once every batch has failed in the model for a while (a fault
that persists in the process, such as a CUDA error that leaves the session unusable), so that SageMaker replaces
the instance; a batch answered again makes it 200. The ASGI app is driven in process."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipper_endpoint import npy
from clipper_endpoint.app import Health, create_app
from clipper_endpoint.model import OnnxModel

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class BrokenSession:
    """The session after a sticky CUDA error: every run fails; the rest of it answers as before."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.broken = True

    def run(self, outputs: Any, feeds: Any) -> Any:
        if self.broken:
            raise RuntimeError("CUDA failure 700: an illegal memory access was encountered")
        return self.real.run(outputs, feeds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def call(
    app: Any, method: str, path: str, body: bytes = b"", content_type: str = "application/x-npy"
) -> tuple[int, bytes]:
    return asyncio.run(acall(app, method, path, body, content_type))


async def acall(
    app: Any, method: str, path: str, body: bytes = b"", content_type: str = "application/x-npy"
) -> tuple[int, bytes]:
    """One request to the ASGI app, on the running event loop (so requests can overlap)."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "server": ("127.0.0.1", 8080),
        "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.fixture
def rows(demo_models: dict[str, Any]) -> bytes:
    data = np.load(Path(demo_models["out_dir"]) / demo_models["dataset"]["holdout"])
    return npy.encode(data["X"][:4].astype(np.float32))


@pytest.fixture
def broken(demo_models: dict[str, Any]) -> tuple[Any, BrokenSession, Clock]:
    model = OnnxModel.load(Path(demo_models["out_dir"]) / "mlp" / "1")
    clock = Clock()
    app = create_app(model, unhealthy_after_s=60, clock=clock)
    session = BrokenSession(model.session)
    model.session = session  # type: ignore[assignment]
    return app, session, clock


def test_ping_fails_once_every_batch_failed_for_the_while_and_mends_with_an_answer(
    broken: tuple[Any, BrokenSession, Clock], rows: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    app, session, clock = broken
    assert call(app, "GET", "/ping")[0] == 200
    for _ in range(5):
        assert call(app, "POST", "/invocations", rows)[0] == 500
        clock.now += 10
    assert call(app, "GET", "/ping")[0] == 200  # failing for 50 s: not yet
    clock.now += 25
    assert call(app, "POST", "/invocations", rows)[0] == 500
    status, body = call(app, "GET", "/ping")
    assert status == 503
    assert (
        "every batch for 75 s (6 batches) failed in the model, and a batch of zeros fails too; the last: model "
        "failed on a batch" in json.loads(body)["error"]
    )
    assert "CUDA failure 700" in json.loads(body)["error"]
    assert "unhealthy, /ping answers 503" in caplog.text

    session.broken = False  # e.g. the fault was passing
    assert call(app, "POST", "/invocations", rows)[0] == 200
    assert call(app, "GET", "/ping")[0] == 200


def test_a_batch_answered_in_between_starts_the_count_again(
    broken: tuple[Any, BrokenSession, Clock], rows: bytes
) -> None:
    app, session, clock = broken
    for _ in range(3):
        call(app, "POST", "/invocations", rows)
        clock.now += 30
    session.broken = False
    assert call(app, "POST", "/invocations", rows)[0] == 200
    session.broken = True
    for _ in range(3):
        call(app, "POST", "/invocations", rows)
        clock.now += 15
    assert call(app, "GET", "/ping")[0] == 200  # 45 s of failures since the last answer


def test_batches_refused_as_not_fitting_say_nothing_of_the_model(
    broken: tuple[Any, BrokenSession, Clock],
) -> None:
    app, session, clock = broken
    session.broken = False
    wrong = npy.encode(np.zeros((2, 3), np.float32))
    for _ in range(10):
        assert call(app, "POST", "/invocations", wrong)[0] == 400
        clock.now += 30
    assert call(app, "GET", "/ping")[0] == 200


def test_inputs_the_model_fails_on_leave_it_healthy(
    broken: tuple[Any, BrokenSession, Clock], rows: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """The batches fail on their inputs (say, a token id past an embedding's table, retried by the queue): a batch
    of zeros still runs, so the process is fine and SageMaker must not replace it."""
    app, session, clock = broken

    class OnInputs(BrokenSession):
        def run(self, outputs: Any, feeds: Any) -> Any:
            if any(np.any(v) for v in feeds.values()):
                raise RuntimeError("Gather: indices out of range")
            return self.real.run(outputs, feeds)

    app.model.session = OnInputs(session.real)
    for _ in range(6):
        assert call(app, "POST", "/invocations", rows)[0] == 500
        clock.now += 15
    assert call(app, "GET", "/ping")[0] == 200
    assert "but a batch of zeros runs: the inputs', not the process's" in caplog.text
    assert call(app, "GET", "/ping")[0] == 200  # and the count starts again


def test_failures_long_past_or_few_never_make_it_unhealthy(
    broken: tuple[Any, BrokenSession, Clock], rows: bytes
) -> None:
    app, _, clock = broken
    for _ in range(4):
        call(app, "POST", "/invocations", rows)
        clock.now += 20
    clock.now += 60  # then no batch for a minute: nothing says the model is failing now
    assert call(app, "GET", "/ping")[0] == 200
    health = Health(60, clock)
    health.failed("one")
    health.failed("two")
    clock.now += 61
    assert not health.due() and health.problem(False) is None  # two batches: not enough to say
    never = Health(0, clock)
    for _ in range(100):
        never.failed("x")
        clock.now += 1
    assert never.problem(False) is None


def test_auto_runs_a_light_models_batches_on_the_loop_and_the_rest_on_the_thread(
    demo_models: dict[str, Any],
) -> None:
    """A batch on the event loop holds ``/ping`` (SageMaker gives it 2 s): ``auto`` keeps the loop for models whose
    warmed-up row takes under a millisecond on the CPU (the digits MLP: tens of microseconds)."""
    mlp = OnnxModel.load(Path(demo_models["out_dir"]) / "mlp" / "1")
    assert mlp.row_seconds is not None and mlp.row_seconds < 0.001
    assert create_app(mlp).executor is None
    assert create_app(mlp, inference="thread").executor is not None

    heavy = OnnxModel.load(Path(demo_models["out_dir"]) / "mlp" / "1")
    heavy.row_seconds = 0.004  # a CNN's row on a CPU core
    assert create_app(heavy).executor is not None
    assert create_app(heavy, inference="inline").executor is None
    unknown = OnnxModel.load(Path(demo_models["out_dir"]) / "mlp" / "1", warmup=False)  # e.g. a free dimension
    assert unknown.row_seconds is None and create_app(unknown).executor is not None
    on_gpu = OnnxModel.load(Path(demo_models["out_dir"]) / "mlp" / "1")
    on_gpu.providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert create_app(on_gpu).executor is not None


class HangingSession:
    """A session whose run never returns until released (a hung GPU kernel)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.release = threading.Event()
        self.entered = threading.Event()

    def run(self, outputs: Any, feeds: Any) -> Any:
        self.entered.set()
        self.release.wait(30)
        return self.real.run(outputs, feeds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_ping_fails_while_the_batch_on_the_worker_thread_hangs_and_mends_when_it_returns(
    demo_models: dict[str, Any], rows: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch that never returns holds the one worker thread: no batch is answered again, yet nothing failed, so
    /ping answered 200 and SageMaker kept the instance. Now a batch running for ``unhealthy_after_s`` (no
    SageMaker invocation waits as long) makes /ping a 503, answered at once (not behind the hung batch)."""
    model = OnnxModel.load(Path(demo_models["out_dir"]) / "mlp" / "1")
    clock = Clock()
    app = create_app(model, unhealthy_after_s=60, clock=clock, inference="thread")
    session = HangingSession(model.session)
    model.session = session  # type: ignore[assignment]

    async def scenario() -> tuple[list[int], bytes]:
        invocation = asyncio.ensure_future(acall(app, "POST", "/invocations", rows))
        await asyncio.get_running_loop().run_in_executor(None, session.entered.wait, 10)
        statuses = [(await acall(app, "GET", "/ping"))[0]]  # just started: healthy
        clock.now += 59
        statuses.append((await acall(app, "GET", "/ping"))[0])
        clock.now += 2
        status, body = await asyncio.wait_for(acall(app, "GET", "/ping"), 5)
        statuses.append(status)
        session.release.set()
        statuses.append((await invocation)[0])
        statuses.append((await acall(app, "GET", "/ping"))[0])
        return statuses, body

    statuses, body = asyncio.run(scenario())
    assert statuses == [200, 200, 503, 200, 200]
    assert "has run for 61 s" in json.loads(body)["error"] and "hung" in caplog.text


def test_a_batch_waiting_behind_a_slow_one_is_not_counted_as_running(demo_models: dict[str, Any]) -> None:
    health = Health(60, Clock())
    assert health.running_since is None
    seen = []
    health.run(lambda body, answer: (seen.append(health.running_since), (b"", ""))[1], b"", "")
    assert seen == [1000.0] and health.running_since is None and health.hung() is None
    assert Health(0, Clock()).hung() is None


def test_a_probe_that_hangs_is_seen_as_hung_too(rows: bytes, demo_models: dict[str, Any]) -> None:
    """The probe's batch of zeros runs on the worker thread too: when it hangs, later pings say so at once (they
    waited behind it, each adding another probe to the thread's queue)."""
    model = OnnxModel.load(Path(demo_models["out_dir"]) / "mlp" / "1")
    clock = Clock()
    app = create_app(model, unhealthy_after_s=60, clock=clock, inference="thread")
    failing = BrokenSession(model.session)
    model.session = failing  # type: ignore[assignment]
    for _ in range(4):
        assert call(app, "POST", "/invocations", rows)[0] == 500
        clock.now += 25  # failing for 75 s, the last 25 s ago
    clock.now -= 25
    hanging = HangingSession(model.session)
    model.session = hanging  # type: ignore[assignment]

    async def scenario() -> list[int]:
        first = asyncio.ensure_future(acall(app, "GET", "/ping"))  # due: probes, and the probe hangs
        await asyncio.get_running_loop().run_in_executor(None, hanging.entered.wait, 10)
        clock.now += 61
        status = (await asyncio.wait_for(acall(app, "GET", "/ping"), 5))[0]
        hanging.release.set()
        await first
        return [status]

    assert asyncio.run(scenario()) == [503]
