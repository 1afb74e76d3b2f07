"""The faults, each injected into the running stack while steady load runs (``Plan``: seconds of baseline, of
fault where the fault has a length, and after). Each returns when and how long the fault was, and what else it
measured; ``run_scenario`` wraps it with the load and the counts."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.faults.load import Load
from bench.faults.world import FAULTY_APP, World, pings

MLP_QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/clipper-model-mlp"  # the demo MLP's (moto's URL)


@dataclass(frozen=True)
class Plan:
    rate: float  # queries per second of steady load
    before_s: float
    fault_s: float
    after_s: float
    unknown_apps: int


FULL = Plan(rate=40.0, before_s=4.0, fault_s=5.0, after_s=12.0, unknown_apps=10_000)
QUICK = Plan(rate=20.0, before_s=2.0, fault_s=2.0, after_s=6.0, unknown_apps=1_000)


def _restart(name: str) -> Callable[[World, Load, Plan], dict[str, Any]]:
    def inject(world: World, load: Load, plan: Plan) -> dict[str, Any]:
        before = world.kill(name)
        start = load.now()
        took = world.wait_restarted(name, before)
        if name.startswith("endpoint-"):
            port = _port(world, name)
            while not pings(f"http://127.0.0.1:{port}/ping"):
                time.sleep(0.1)
        return {"fault_start": start, "fault_end": load.now(), "restarted_after_s": round(took, 2)}

    return inject


def _port(world: World, name: str) -> int:
    import json

    return int(json.loads((world.state / "ports.json").read_text())[name])


def _proxy(mode: str) -> Callable[[World, Load, Plan], dict[str, Any]]:
    def inject(world: World, load: Load, plan: Plan) -> dict[str, Any]:
        assert world.proxy is not None
        start = load.now()
        world.proxy.mode = mode
        time.sleep(plan.fault_s)
        world.proxy.mode = "pass"
        return {"fault_start": start, "fault_end": load.now(), "proxy": mode}

    return inject


def aws_emulator_unreachable(world: World, load: Load, plan: Plan) -> dict[str, Any]:
    world.kill("moto", signal.SIGSTOP)
    start = load.now()
    try:
        time.sleep(plan.fault_s)
    finally:
        world.kill("moto", signal.SIGCONT)
    return {"fault_start": start, "fault_end": load.now(), "how": "moto's server stopped (SIGSTOP), then resumed"}


def _mlp_stream() -> str:
    from clipper.adapters.redis_streams import stream_keys

    return stream_keys(MLP_QUEUE).stream


def duplicate_delivery(world: World, load: Load, plan: Plan) -> dict[str, Any]:
    """Through the fault window, each message seen on the MLP's stream (it is there from the frontend's send until
    the batcher acknowledges it) is added again, the same body: what an at-least-once queue does."""
    r, key = world.redis(), _mlp_stream()
    start, copies, seen = load.now(), 0, set()
    end = time.monotonic() + plan.fault_s
    while time.monotonic() < end:
        for entry_id, fields in r.xrevrange(key, count=5):
            if entry_id not in seen and b"body" in fields:
                seen.add(entry_id)
                seen.add(r.xadd(key, fields))  # its copy is not copied again
                copies += 1
        time.sleep(0.001)
    return {"fault_start": start, "fault_end": load.now(), "duplicates_added": copies}


def poison_message(world: World, load: Load, plan: Plan) -> dict[str, Any]:
    """Malformed messages on the MLP's stream: they must go to its dead-letter stream (after their deliveries:
    the batcher releases each with a back-off) while the batcher answers the rest, not block it."""
    from clipper.adapters.redis_streams import stream_keys

    r, key = world.redis(), _mlp_stream()
    dlq = stream_keys(MLP_QUEUE).dead_letter
    before = r.xlen(dlq) if r.exists(dlq) else 0
    start = load.now()
    poison = ("not json", '{"v": 1}', '{"v": 1, "query_id": "x", "rows": -1}', "\x00\xff")
    for body in poison:
        r.xadd(key, {"body": body})
    time.sleep(plan.fault_s)
    fault_end = load.now()
    waited = time.monotonic()
    while (r.xlen(dlq) if r.exists(dlq) else 0) - before < len(poison) and time.monotonic() - waited < 60:
        time.sleep(0.2)
    return {
        "fault_start": start,
        "fault_end": fault_end,
        "poison_sent": len(poison),
        "dead_lettered": (r.xlen(dlq) if r.exists(dlq) else 0) - before,
        "dead_lettered_within_s": round(load.now() - start, 1),
    }


def unknown_apps(world: World, load: Load, plan: Plan) -> dict[str, Any]:
    """Distinct unknown application names (404 each), in two rounds of new names, while the steady load goes on:
    the frontend's memory before, after the first round and after the second (bounded caches: the second round
    adds about nothing to what the first, warming up, did)."""
    rss = [world.frontend_rss_kb()]
    start = load.now()
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    for round_ in range(2):
        names = iter(range(round_ * plan.unknown_apps, (round_ + 1) * plan.unknown_apps))

        def worker(names: Any = names) -> None:
            for n in names:
                outcome = load.one(b'{"input": [1.0]}', app=f"no-such-app-{n}")
                with lock:
                    statuses[outcome.kind] = statuses.get(outcome.kind, 0) + 1

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rss.append(world.frontend_rss_kb())
    return {
        "fault_start": start,
        "fault_end": load.now(),
        "unknown_names": 2 * plan.unknown_apps,
        "unknown_name_answers": statuses,
        "frontend_rss_mb": [round(kb / 1024, 1) for kb in rss],  # before, after each round
    }


def identical_queries_failing_model(world: World, load: Load, plan: Plan) -> dict[str, Any]:
    """30 identical queries at once while the model answers 500: one computes, the others wait on its claim
    and must get its cause at once, not time out."""
    assert world.proxy is not None
    world.proxy.mode = "error"
    start = load.now()
    body = b'{"input": [' + b", ".join([b"0.5"] * 64) + b"]}"
    results: list[Any] = []
    lock = threading.Lock()

    def one() -> None:
        outcome = load.one(body, app=FAULTY_APP)
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=one) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    world.proxy.mode = "pass"
    kinds: dict[str, int] = {}
    for o in results:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    latencies = sorted(o.latency_ms for o in results)
    return {
        "fault_start": start,
        "fault_end": load.now(),
        "identical": {
            "sent": len(results),
            "answers": kinds,
            "causes": sorted({o.cause for o in results}),
            "max_latency_ms": round(latencies[-1], 1),
            "median_latency_ms": round(latencies[len(latencies) // 2], 1),
        },
    }


# name -> (the app the steady load queries, the injection)
SCENARIOS: dict[str, tuple[str, Callable[[World, Load, Plan], dict[str, Any]]]] = {
    "model-server-killed": ("digits", _restart("endpoint-mlp")),
    "model-server-500": (FAULTY_APP, _proxy("error")),
    "model-server-slow": (FAULTY_APP, _proxy("slow")),
    "batcher-killed-mid-batch": ("digits", _restart("batcher-mlp")),
    "redis-killed": ("digits", _restart("redis")),
    "aws-emulator-unreachable": ("digits", aws_emulator_unreachable),
    "duplicate-delivery": ("digits", duplicate_delivery),
    "poison-message": ("digits", poison_message),
    "unknown-apps": ("digits", unknown_apps),
    "identical-queries-failing-model": (FAULTY_APP, identical_queries_failing_model),
}
