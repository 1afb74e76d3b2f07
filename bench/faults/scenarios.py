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
from bench.faults.plan import Plan
from bench.faults.streams import batcher_killed_mid_batch, duplicate_delivery, poison_message
from bench.faults.world import FAULTY_APP, FAULTY_SLO_MS, World, pings
from bench.frontdoor.config import DEMO_SLO_MS

# Memory bounded: the second round of unknown names may add at most this much to the frontend's RSS (a cache
# of every name, as on main before issue 11, held ~3.4 KB a name: 34 MB for 10,000).
MAX_GROWTH_KB_PER_NAME = 0.8
MIN_GROWTH_LIMIT_KB = 8 * 1024


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
    limit_kb = max(MIN_GROWTH_LIMIT_KB, MAX_GROWTH_KB_PER_NAME * plan.unknown_apps)
    return {
        "fault_start": start,
        "fault_end": load.now(),
        "unknown_names": 2 * plan.unknown_apps,
        "unknown_name_answers": statuses,
        "frontend_rss_mb": [round(kb / 1024, 1) for kb in rss],  # before, after each round
        "second_round_growth_limit_mb": round(limit_kb / 1024, 1),
        "checks": {
            "every unknown name answered 4xx": statuses == {"4xx": 2 * plan.unknown_apps},
            "memory bounded (the second round's growth under the limit)": rss[2] - rss[1] <= limit_kb,
        },
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
    owner_cause = all(o.kind == "default" and "endpoint answered 500" in o.cause for o in results)
    return {
        "fault_start": start,
        "fault_end": load.now(),
        "identical": {
            "sent": len(results),
            "answers": kinds,
            "causes": sorted({o.cause for o in results}),
            "max_latency_ms": round(latencies[-1], 1),
            "median_latency_ms": round(latencies[len(latencies) // 2], 1),
            "latencies_ms": [round(x, 1) for x in latencies],
        },
        "checks": {"every identical query got the failing endpoint's cause (none timed out)": owner_cause},
    }


Inject = Callable[[World, Load, Plan], dict[str, Any]]


@dataclass(frozen=True)
class Scenario:
    app: str  # the application the steady load queries
    inject: Inject
    all_real: bool = False  # the fault must not cost the steady load a single model answer

    @property
    def slo_ms(self) -> float:
        return FAULTY_SLO_MS if self.app == FAULTY_APP else DEMO_SLO_MS


SCENARIOS: dict[str, Scenario] = {
    "model-server-killed": Scenario("digits", _restart("endpoint-mlp")),
    "model-server-500": Scenario(FAULTY_APP, _proxy("error")),
    "model-server-slow": Scenario(FAULTY_APP, _proxy("slow")),
    "batcher-killed-mid-batch": Scenario("digits", batcher_killed_mid_batch),
    "redis-killed": Scenario("digits", _restart("redis")),
    "aws-emulator-unreachable": Scenario("digits", aws_emulator_unreachable),
    # killed, not stopped: every read is refused at once (a stopped one holds reads, which the copy waits out),
    # until the supervisor has started it again and it has its tables back
    "aws-emulator-killed": Scenario("digits", _restart("moto"), all_real=True),
    "duplicate-delivery": Scenario("digits", duplicate_delivery, all_real=True),
    "poison-message": Scenario("digits", poison_message, all_real=True),
    "unknown-apps": Scenario("digits", unknown_apps, all_real=True),
    "identical-queries-failing-model": Scenario(FAULTY_APP, identical_queries_failing_model),
}
