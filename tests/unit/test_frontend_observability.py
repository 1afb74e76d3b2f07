"""The frontend's logs, traces and SnapStart restore hook, over fakes."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import random
import sys
import types
import uuid

import pytest
from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

from clipper.core.registry_cache import CachedRegistry
from clipper.frontend.handling import QueryHandling
from clipper.frontend.metrics import InProcessMetrics
from clipper.frontend.observability import QueryCorrelation, tracing_enabled
from clipper.frontend.query import QueryProcessor
from clipper.frontend.restore import after_restore, register_after_restore
from clipper.frontend.selection import Selector
from tests.fakes import FakeClock, InMemoryRegistry, InMemoryReplies, ListQueue, digits_app, model_version

pytestmark = pytest.mark.unit


class FakeTracer:
    def __init__(self) -> None:
        self.annotations: dict[str, object] = {}

    def put_annotation(self, key: str, value: object) -> None:
        self.annotations[key] = value


def registry() -> InMemoryRegistry:
    reg = InMemoryRegistry()
    reg.apps["digits"] = digits_app()
    reg.links["digits"] = ["mlp"]
    reg.versions[("mlp", "1")] = model_version()
    reg.active["mlp"] = "1"
    return reg


@pytest.fixture
def clipper_logger():
    """The package logger as the frontend configures it, put back afterwards."""
    lg = logging.getLogger("clipper")
    saved = (lg.handlers[:], lg.propagate, lg.level)
    yield lg
    lg.handlers, lg.propagate, lg.level = saved


def test_every_log_line_of_a_query_carries_its_query_id_as_correlation_id(clipper_logger):
    out = io.StringIO()
    # a service name of its own: Powertools configures a logger name once per process, and the frontend's
    # composition root (imported by the e2e tests) may already have taken "clipper-frontend"
    service = f"clipper-frontend-{uuid.uuid4().hex[:8]}"
    logger = Logger(service=service, logger_handler=logging.StreamHandler(out), level="INFO")
    copy_config_to_registered_loggers(source_logger=logger, include={"clipper"})
    logger.set_correlation_id("api-gateway-request-id")  # what the handler's inject_lambda_context sets
    tracer = FakeTracer()
    clock = FakeClock()
    # no reply ever comes: the query answers the default output and the core logs why
    processor = QueryProcessor(
        registry(), ListQueue(), InMemoryReplies(), clock, lambda: 4242 << 16, listener=QueryCorrelation(logger, tracer)
    )
    result = processor.predict("digits", {"input": [0.0] * 64})
    logger.info("query answered")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    core = next(line for line in lines if line["message"] == "default output")
    assert core["correlation_id"] == str(4242 << 16) and core["app"] == "digits" and core["models"] == "mlp:1"
    assert core["name"] == "clipper.frontend.query"
    own = next(line for line in lines if line["message"] == "query answered")
    assert own["correlation_id"] == str(result.predictions[0].query_id)
    assert tracer.annotations == {"app": "digits", "query_id": str(4242 << 16), "model": "mlp:1"}
    logger.thread_safe_clear_keys()  # this thread's keys (a query under Mangum or uvicorn has its own context)


def test_tracing_follows_powertools_rule():
    assert tracing_enabled({"LAMBDA_TASK_ROOT": "/var/task"})
    assert not tracing_enabled({})  # outside Lambda
    assert not tracing_enabled({"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "true"})
    assert not tracing_enabled({"LAMBDA_TASK_ROOT": "/var/task", "AWS_SAM_LOCAL": "true"})


class FakePool:
    def __init__(self) -> None:
        self.disconnects = 0

    def disconnect(self) -> None:
        self.disconnects += 1


def restored_world(seed_state: object) -> tuple[QueryProcessor, random.Random, CachedRegistry, InMemoryRegistry]:
    inner = registry()
    clock = FakeClock()
    cached = CachedRegistry(inner, clock, ttl_s=60)
    rng = random.Random()
    rng.setstate(seed_state)  # type: ignore[arg-type]
    selector = Selector(cached, None, clock, rng, 60)
    return (
        QueryProcessor(cached, ListQueue(), InMemoryReplies(), clock, lambda: 1 << 16, selector=selector),
        rng,
        cached,
        inner,
    )


class FakeRedisClient:
    closed = 0

    def close(self) -> None:
        self.closed += 1


def test_after_restore_reseeds_reconnects_and_forgets():
    snapshot = random.Random(7).getstate()  # two containers restored from one snapshot share this state
    (p1, rng1, cached, inner), (p2, rng2, *_) = restored_world(snapshot), restored_world(snapshot)
    cached.get_app("digits")
    reads = inner.reads
    redis = FakeRedisClient()
    metrics = InProcessMetrics()
    metrics.counters["app:digits:num_predictions"] = 3
    random.seed(11)
    expected_ids = [random.getrandbits(53) for _ in range(3)]
    random.seed(11)  # the module generator as the snapshot left it

    after_restore(p1, [redis], metrics)
    after_restore(p2)

    assert rng1.getstate() != snapshot and rng1.getstate() != rng2.getstate()
    assert [random.getrandbits(53) for _ in range(3)] != expected_ids
    assert redis.closed == 1
    assert metrics.report()["counters"] == []
    cached.get_app("digits")
    assert inner.reads == reads + 1  # the registry copy was dropped


def test_register_after_restore_uses_the_runtime_hook_when_there_is_one(monkeypatch):
    hooks: list[object] = []
    assert register_after_restore(lambda: None, register=hooks.append) and len(hooks) == 1
    runtime = types.ModuleType("snapshot_restore_py")
    runtime.register_after_restore = hooks.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", runtime)
    ran: list[str] = []
    assert register_after_restore(lambda: ran.append("hook"))
    hooks[-1]()  # type: ignore[operator]
    assert ran == ["hook"]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)  # not Lambda's runtime: import fails
    assert not register_after_restore(lambda: None)


def test_a_request_on_a_worker_thread_carries_no_earlier_querys_log_keys(clipper_logger):
    # a query run on a worker thread added its keys to that thread's context, and the next request the thread
    # ran (here a feedback) logged the earlier query's correlation id, application and models
    out = io.StringIO()
    logger = Logger(service=f"clipper-frontend-{uuid.uuid4().hex[:8]}", logger_handler=logging.StreamHandler(out))
    logger.setLevel("INFO")
    copy_config_to_registered_loggers(source_logger=logger, include={"clipper"})  # the query's "default output"
    processor = QueryProcessor(
        registry(), ListQueue(), InMemoryReplies(), FakeClock(), lambda: 4242 << 16, listener=QueryCorrelation(logger)
    )

    class Receiver:
        def accept(self, app: str, body: object) -> dict[str, object]:
            logger.info("feedback accepted")
            return {"accepted": True}

    handling = QueryHandling(processor, 1 << 20, feedback=Receiver(), query_threads=1)  # type: ignore[arg-type]

    async def query_then_feedback() -> None:
        await asyncio.wrap_future(handling.submit(processor.predict, "digits", {"input": [0.0] * 64}))
        body = json.dumps({"input": [0.0] * 64, "label": 1}).encode()
        assert (await handling.update("digits", body, "application/json")).status == 200

    asyncio.run(query_then_feedback())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert any(line.get("correlation_id") == str(4242 << 16) for line in lines)  # the query's own lines have it
    feedback = next(line for line in lines if line["message"] == "feedback accepted")
    assert "correlation_id" not in feedback and "app" not in feedback and "models" not in feedback
