"""The query path on the event loop, over a real Redis: the frontend's route (lean async client: cache lookup,
the Streams send, the reply listener on the loop) and a long-poll batcher thread on the same Redis answering
from a fake endpoint. The same queries through the worker-thread path answer alike."""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

import clipper.batching.core as batching_core
from clipper.adapters.clock import SystemClock
from clipper.adapters.redis_cache import RedisPredictionCache
from clipper.adapters.redis_fused import RedisLookupOrSend
from clipper.adapters.redis_replies import RedisReplyChannel
from clipper.adapters.redis_streams import RedisStreamQueueReader, RedisStreamRequestQueue
from clipper.adapters.resp import RespClient
from clipper.batching.controller import FixedController
from clipper.batching.core import Batcher
from clipper.batching.longpoll import LongPollDriver
from clipper.core.registry_cache import CachedRegistry
from clipper.errors import Unavailable
from clipper.frontend.api import create_app
from clipper.frontend.query import QueryProcessor
from tests.fakes import FakeEndpoint, FakeResolver, InMemoryRegistry, digits_app, model_version
from tests.services import redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def _cached(stack, row: list[float]) -> bool:
    """Whether model a's output for ``row`` is in the prediction cache."""
    import numpy as np

    from clipper.core.cache_keys import row_keys

    (key,) = row_keys("a", "1", np.asarray([row], dtype=np.float32))
    return bool(stack[3].get_many([key]))


def one_hot(i: int) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(64)]


@pytest.fixture
def stack(redis_url):  # noqa: F811
    client = RespClient.from_url(redis_url)
    prefix = uuid.uuid4().hex[:8]
    registry = InMemoryRegistry()
    registry.apps["digits"] = digits_app(latency_slo_micros=2_000_000)
    registry.apps["ens"] = digits_app(name="ens", latency_slo_micros=2_000_000, policy="exp4")
    registry.links["digits"] = ["a"]
    registry.links["ens"] = ["a", "b"]
    registry.apps["shapeless"] = digits_app(name="shapeless", latency_slo_micros=2_000_000, input_shape=None)
    registry.links["shapeless"] = ["a"]  # a has rows of [64]
    registry.apps["slow"] = digits_app(name="slow", latency_slo_micros=150_000)
    registry.links["slow"] = ["c"]  # no batcher reads c's queue: its queries time out
    registry.apps["short"] = digits_app(name="short", latency_slo_micros=100_000)
    registry.links["short"] = ["a"]
    for m in ("a", "b", "c"):
        registry.versions[(m, "1")] = model_version(m, queue_url=f"https://sqs.local/123/{prefix}-{m}")
        registry.active[m] = "1"
    replies = RedisReplyChannel(client, ttl_s=60, prefix=prefix)
    cache = RedisPredictionCache(client, ttl_s=60, prefix=prefix)
    endpoint = FakeEndpoint()
    batcher = Batcher(FakeResolver(endpoint), replies, SystemClock(), cache=cache)
    stop = threading.Event()
    drivers = []
    for m in ("a", "b"):
        reader = RedisStreamQueueReader(client, f"https://sqs.local/123/{prefix}-{m}", prefix=prefix)
        driver = LongPollDriver(reader, batcher, FixedController(8), idle_wait_s=1)
        drivers.append(threading.Thread(target=driver.run, args=(stop,), daemon=True))
    for t in drivers:
        t.start()

    def make(inline: bool, fused: bool = False, copy: Any = None) -> TestClient:
        """``copy``: the registry copy, made of the registry (default: a 60 s one)."""
        queue = RedisStreamRequestQueue(client, prefix=prefix)
        processor = QueryProcessor(
            CachedRegistry(registry, SystemClock(), ttl_s=60) if copy is None else copy(registry),
            queue,
            replies,
            SystemClock(),
            lambda: 1 << 16,
            cache=cache,
            inline=inline,
            fused=RedisLookupOrSend(cache, queue) if fused else None,
        )
        http = TestClient(create_app(processor, max_body_bytes=1 << 20))
        http.processor = processor  # type: ignore[attr-defined]  # for the tests of the common query's lane
        return http

    yield make, endpoint, client, cache
    stop.set()
    for t in drivers:
        t.join(timeout=5)
    replies.close()


@pytest.fixture
def blocking_calls_on_a_loop(monkeypatch):
    """The thread client's calls made on a thread that runs an event loop (each would stall the loop)."""
    calls: list[object] = []
    original = RespClient.execute

    def execute(self, commands, timeout=None):
        try:
            asyncio.get_running_loop()
            calls.append(commands[0][0] if commands else None)
        except RuntimeError:
            pass
        return original(self, commands, timeout)

    monkeypatch.setattr(RespClient, "execute", execute)
    return calls


@pytest.mark.parametrize(
    ("inline", "fused"),
    [(True, False), (False, False), (True, True), (False, True)],
    ids=["event-loop", "worker-thread", "event-loop-one-round-trip", "worker-thread-one-round-trip"],
)
def test_queries_are_answered_cached_and_ensembled(stack, inline, fused, blocking_calls_on_a_loop, monkeypatch):
    make, endpoint, _, _ = stack
    hashed_by_the_batcher: list[object] = []
    original_row_keys = batching_core.row_keys

    def row_keys_counted(*args):  # type: ignore[no-untyped-def]
        hashed_by_the_batcher.append(args[:2])
        return original_row_keys(*args)

    monkeypatch.setattr(batching_core, "row_keys", row_keys_counted)
    with make(inline, fused) as http:
        http.post("/digits/predict", json={"input": one_hot(0)})  # the registry copy knows the app now
        r = http.post("/digits/predict?debug=1", json={"input_batch": [one_hot(3), one_hot(9), one_hot(3)]})
        body = r.json()
        assert [p["output"] for p in body["batch_predictions"]] == [3, 9, 3]
        assert ("worker" not in body["debug"]["timings_ms"]) is inline  # the path taken
        # the batcher publishes replies first and fills the cache just after (replies are on the query's path):
        # wait for the fill, as a later identical query would find it
        deadline = time.monotonic() + 5
        while len(endpoint.calls) and not _cached(stack, one_hot(9)) and time.monotonic() < deadline:
            time.sleep(0.01)
        calls = len(endpoint.calls)
        again = http.post("/digits/predict?debug=1", json={"input": one_hot(9)}).json()
        assert again["output"] == 9 and again["debug"]["cache"] == {"hits": 1, "misses": 0}
        assert len(endpoint.calls) == calls  # a hit never reaches the model
        ens = http.post("/ens/predict?debug=1", json={"input": one_hot(5)}).json()
        assert ens["output"] == 5 and sorted(ens["debug"]["models"]) == ["a", "b"] and ens["default"] is False
    assert blocking_calls_on_a_loop == []  # every Redis call on the loop was awaited
    assert hashed_by_the_batcher == []  # the messages carried the keys the frontend looked up


@pytest.mark.parametrize("fused", [False, True])
def test_concurrent_queries_on_one_loop_share_its_connection_and_each_get_their_own_answer(stack, fused):
    make, _, _, _ = stack
    with make(True, fused) as http:
        http.post("/digits/predict", json={"input": one_hot(0)})
        results: list[tuple[int, int]] = []

        def ask(i: int) -> None:
            row = [float(i)] + [0.0] * 63 if i else one_hot(0)
            row[1 + i % 60] = 100.0  # argmax at 1 + i % 60, and every row distinct
            out = http.post("/digits/predict", json={"input": row}).json()
            results.append((1 + i % 60, out["output"]))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(1, 41)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(results) == 40 and all(expected == got for expected, got in results)


def test_the_async_client_bounds_each_call_and_drops_a_hung_connection(redis_url):  # noqa: F811
    import signal
    import subprocess

    from tests.services import free_port, wait_for_port

    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", ""], stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        client = RespClient.from_url(f"redis://127.0.0.1:{port}", timeout=0.2)

        async def scenario() -> list[object]:
            aio = client.aio
            assert await aio.execute([("SET", "k", "v"), ("GET", "k")]) == ["OK", b"v"]
            proc.send_signal(signal.SIGSTOP)
            outcomes: list[object] = []
            start = time.monotonic()
            for timeout in (0.05, 0.3):  # the second outlives the client's 0.2 s: the connection is dropped
                try:
                    await aio.execute([("GET", "k")], timeout=timeout)
                except Unavailable as e:
                    outcomes.append(str(e))
            outcomes.append(time.monotonic() - start)
            proc.send_signal(signal.SIGCONT)
            outcomes.append(await aio.execute([("GET", "k")]))  # a new connection
            return outcomes

        first, second, elapsed, after = asyncio.run(scenario())
        assert "no answer in time" in str(first) and "no answer in time" in str(second)
        assert elapsed < 1.0 and after == [b"v"]
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)


def _answer(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "query_id"}


def _ask(http, lane_on: bool, app: str, row: list[float]) -> dict:
    processor = http.processor
    lane, processor.lane = processor.lane, (processor.lane if lane_on else None)
    try:
        return http.post(f"/{app}/predict", json={"input": row}).json()
    finally:
        processor.lane = lane


def test_the_common_query_takes_the_lane_and_answers_as_the_general_path_does(stack):
    make, endpoint, _, _ = stack
    rows = [one_hot(i) for i in (2, 7, 11, 40)]
    with make(True, True) as http:
        lane = http.processor.lane
        assert lane is not None  # on the loop, with the fused lookup-and-send
        http.post("/digits/predict", json={"input": one_hot(0)})  # the registry copy knows the app now
        taken = lane.taken
        misses = [http.post("/digits/predict", json={"input": r}).json() for r in rows]
        assert lane.taken == taken + len(rows)
        assert [b["output"] for b in misses] == [2, 7, 11, 40] and not any(b["default"] for b in misses)
        deadline = time.monotonic() + 5
        while not all(_cached(stack, r) for r in rows) and time.monotonic() < deadline:
            time.sleep(0.01)
        calls = len(endpoint.calls)
        hits = [http.post("/digits/predict", json={"input": r}).json() for r in rows]
        assert len(endpoint.calls) == calls and lane.taken == taken + 2 * len(rows)  # hits, in the lane
        general = [_ask(http, False, "digits", r) for r in rows]  # the same queries the general way (hits too)
        assert lane.taken == taken + 2 * len(rows)
        assert [_answer(b) for b in misses] == [_answer(b) for b in hits] == [_answer(g) for g in general]
        assert {b["query_id"] for b in misses + hits} == {1 << 16}  # the processor's query ids (fixed here)


def test_the_lane_leaves_every_other_query_to_the_general_path(stack):
    make, _, _, _ = stack
    with make(True, True) as http:
        lane = http.processor.lane
        http.post("/digits/predict", json={"input": one_hot(0)})
        http.post("/ens/predict", json={"input": one_hot(0)})
        taken = lane.taken
        assert http.post("/ens/predict", json={"input": one_hot(5)}).json()["output"] == 5  # two models, exp4
        batch = http.post("/digits/predict", json={"input_batch": [one_hot(3), one_hot(4)]}).json()
        assert [p["output"] for p in batch["batch_predictions"]] == [3, 4]
        assert http.post("/digits/predict", json={"input": one_hot(6), "uid": "u1"}).json()["output"] == 6
        assert http.post("/digits/predict?debug=true", json={"input": one_hot(8)}).json()["output"] == 8
        bad = http.post("/digits/predict", json={"input": [1.0, 2.0]})
        assert bad.status_code == 400 and "input" in bad.json()["cause"]
        assert http.post("/nope/predict", json={"input": one_hot(1)}).status_code == 404
        assert lane.taken == taken


def test_an_input_the_model_cannot_take_is_a_400_on_the_lane_too(stack):
    """An application without an input shape (Clipper's kind) linked to a model of rows [64]: the lane leaves an
    input of another size to the general path, which answers 400 naming the model's shape; nothing is sent."""
    make, endpoint, _, _ = stack
    with make(True, True) as http:
        lane = http.processor.lane
        http.post("/shapeless/predict", json={"input": one_hot(0)})
        taken, calls = lane.taken, len(endpoint.calls)
        bad = http.post("/shapeless/predict", json={"input": [0.5] * 60})
        assert bad.status_code == 400
        assert (
            bad.json()["cause"] == "input: expected shape [64] (or 64 flat values): the rows of model a, got shape [60]"
        )
        assert lane.taken == taken and len(endpoint.calls) == calls
        assert http.post("/shapeless/predict", json={"input": one_hot(9)}).json()["output"] == 9
        assert lane.taken == taken + 1


def test_a_query_of_the_lane_without_an_answer_gets_the_general_paths_default_and_releases_its_claim(stack):
    make, endpoint, _, cache = stack
    from clipper.core.cache_keys import row_keys

    with make(True, True) as http:
        lane = http.processor.lane
        http.post("/slow/predict", json={"input": one_hot(0)})  # the registry copy knows the apps now
        http.post("/digits/predict", json={"input": one_hot(0)})
        taken = lane.taken
        mine = _ask(http, True, "slow", one_hot(20))
        # out of time, the claim ended as the general path ends it: no failure left for followers, the key free for
        # one with time left
        (key,) = row_keys("c", "1", __import__("numpy").asarray([one_hot(20)], dtype="float32"))
        assert cache.poll([key]) == ({}, {})
        assert cache.claim([key], 1.0, owner="another query") == {key}
        general = _ask(http, False, "slow", one_hot(21))
        assert lane.taken == taken + 1
        assert mine["default"] is True and mine["output"] == -1
        assert mine["default_explanation"] == general["default_explanation"]
        assert "timeout, no reply within the SLO of 150 ms" in mine["default_explanation"]
        endpoint.fail_with = "boom"
        mine, general = _ask(http, True, "digits", one_hot(30)), _ask(http, False, "digits", one_hot(31))
        assert lane.taken == taken + 2
        assert mine["default"] is True and mine["default_explanation"] == general["default_explanation"]
        assert "endpoint error: boom" in mine["default_explanation"]


def test_a_model_output_that_is_no_answer_gets_the_default_on_both_paths_and_is_not_cached(stack):
    """A NaN score travels as JSON null: the lane and the general path both answer the default, saying the model
    gave no answer; the batcher does not cache it, so a later query asks the model again and a query waiting on
    the first one's claim hears that it failed instead of waiting out its SLO."""
    make, endpoint, _, cache = stack
    from clipper.core.cache_keys import row_keys

    real = endpoint.predict

    def nan_for_13(rows):
        return [math.nan if o == 13 else o for o in real(rows)]

    endpoint.predict = nan_for_13
    with make(True, True) as http:
        lane = http.processor.lane
        http.post("/digits/predict", json={"input": one_hot(0)})
        taken = lane.taken
        first, second = one_hot(13), one_hot(13)
        first[1], second[1] = 0.5, 0.25  # distinct inputs, both answered NaN
        mine, general = _ask(http, True, "digits", first), _ask(http, False, "digits", second)
        assert lane.taken == taken + 1
        for body in (mine, general):
            assert body["default"] is True and body["output"] == -1, body
            assert "no answer for 1 of 1 inputs (null or not a finite number)" in body["default_explanation"]
        assert _answer(mine) == _answer(general)
        for row in (first, second):
            (key,) = row_keys("a", "1", __import__("numpy").asarray([row], dtype="float32"))
            hits, failed = cache.poll([key])
            assert key not in hits and "no answer" in failed[key]  # not cached; the claim released with the cause
        time.sleep(0.3)  # past the failed claims' short memory (FAILED_CLAIM_TTL_S)
        calls = len(endpoint.calls)
        again = _ask(http, True, "digits", first)
        assert again["default"] is True and len(endpoint.calls) == calls + 1  # asked again, not a cached null

        # a second query for the same input while the first one's model call is in flight waits on its claim,
        # and hears of the failure when the first query releases it (not at its own deadline)
        def slow_nan(rows):
            time.sleep(0.3)
            return [math.nan for _ in real(rows)]

        endpoint.predict = slow_nan
        row, took = one_hot(17), {}
        row[3] = 0.3

        def ask(i: int) -> None:
            took[i] = (i, http.post("/digits/predict", json={"input": row}).json())

        calls = len(endpoint.calls)
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        threads[0].start()
        time.sleep(0.05)
        threads[1].start()
        for t in threads:
            t.join()
        assert len(endpoint.calls) == calls + 1  # one computed, the other waited on its claim
        for _, body in took.values():  # both with the model's failure, not "no answer within the SLO" (2 s later)
            assert body["default"] is True, body
            assert "no answer for 1 of 1 inputs (null or not a finite number)" in body["default_explanation"], body


@pytest.mark.parametrize("fused", [True, False], ids=["one-round-trip", "lookup-then-send"])
def test_a_follower_with_a_longer_slo_computes_the_input_when_its_owner_runs_out_of_time(stack, fused):
    """Two identical queries on one model: the first (100 ms SLO) claims the input and times out while the model is
    slow; the second (2 s), waiting on its claim, claims the input itself and answers (it took the first one's
    timeout as its own default, at once)."""
    make, endpoint, _, _ = stack
    real = endpoint.predict
    row = one_hot(40)

    def slow_once(rows):
        if endpoint.calls == []:  # the owner's batch
            time.sleep(0.3)
        return real(rows)

    endpoint.predict = slow_once
    with make(True, fused) as http:
        http.post("/short/predict", json={"input": one_hot(1)})  # the registry copy knows the apps now
        http.post("/digits/predict", json={"input": one_hot(2)})
        gatherer, lane = http.processor._gatherer, http.processor.lane
        gatherer._answer_s.clear()
        taken = lane.taken if fused else 0
        http.post("/digits/predict", json={"input": one_hot(3)})
        assert 0 < gatherer.usual_answer_s(model_version("a")) < 0.3  # either path's answers tell the model's pace
        assert not fused or lane.taken == taken + 1  # the lane's (one input, one model: the common query)
        endpoint.calls.clear()
        answers: dict[str, dict] = {}

        def ask(app: str) -> None:
            answers[app] = http.post(f"/{app}/predict", json={"input": row}).json()

        owner = threading.Thread(target=ask, args=("short",))
        owner.start()
        time.sleep(0.03)  # the owner's claim is in
        started = time.monotonic()
        ask("digits")
        took = time.monotonic() - started
        owner.join()
    assert answers["short"]["default"] is True and "timeout" in answers["short"]["default_explanation"]
    assert answers["digits"]["default"] is False and answers["digits"]["output"] == 40
    assert 0.2 < took < 1.5  # it waited for its own send's answer, after the slow batch
    assert len(endpoint.calls) == 2  # the owner's batch, then the follower's own
    assert _cached(stack, row)


def test_a_follower_waiting_out_its_slo_polls_the_cache_at_a_slowing_pace(stack):
    """An identical query's computation that never ends (its owner holds the claim): the follower polled Redis every
    2 ms for its whole 2 s SLO (~1,000 round trips on the core the queries share); now ten at 2 ms, then a tenth
    of the time waited, at most 50 ms."""
    import numpy as np

    from clipper.core.cache_keys import row_keys

    make, _, _, cache = stack
    row = one_hot(50)
    (key,) = row_keys("a", "1", np.asarray([row], dtype=np.float32))
    polls = {"n": 0}
    with make(True, True) as http:
        http.post("/digits/predict", json={"input": one_hot(0)})  # the registry copy knows the app now
        assert cache.claim([key], 10.0, owner="a query that never answers") == {key}
        for name in ("poll", "poll_or_claim"):  # the latter while the follower could still take over
            original = getattr(cache, name)

            def counted(*args, _original=original, **kwargs):
                polls["n"] += 1
                return _original(*args, **kwargs)

            setattr(cache, name, counted)
        answer = http.post("/digits/predict", json={"input": row}).json()
    assert answer["default"] is True and "gave no answer within the SLO" in answer["default_explanation"]
    assert 20 <= polls["n"] <= 80  # ~55 at this pace


def test_the_first_query_after_a_quiet_while_is_not_answered_for_an_application_deleted_meanwhile(stack):
    """The lane looks at the application first and, finding it past its staleness bound, starts its reload and
    leaves the query to the general path, which looks again: it took that reload in flight for a slow registry's
    and answered from the copy (a review helper: a model's answer 10 s after delete_app, and one change behind
    for unlinks, links and policy changes, whenever the copy was 4 to 34 s old)."""
    from tests.fakes import FakeClock

    make, _, _, _ = stack
    clock, reloads = FakeClock(), []
    copy = lambda inner: CachedRegistry(inner, clock, ttl_s=2, refresh=reloads.append, max_stale_s=2)  # noqa: E731
    with make(True, True, copy) as http:
        assert http.processor.lane is not None
        assert http.post("/short/predict", json={"input": one_hot(3)}).json()["output"] == 3
        while reloads:
            reloads.pop()()
        del http.processor.registry.uncached.apps["short"]  # deleted
        clock.advance(10.0)  # past ttl + max_stale, well within the patience for a slow registry
        gone = http.post("/short/predict", json={"input": one_hot(4)})
        assert gone.status_code == 404 and "short" in gone.json()["cause"], gone.text


def test_a_query_for_a_name_the_copy_does_not_hold_is_charged_one_read_lane_and_admission_together(stack):
    """Through the HTTP app (the lane's look, then the general path's admission and read): a budget of 3 reads of
    unknown names reads 3 of them, a 4th before the list comes, and the list answers the next without a read."""
    from tests.fakes import FakeClock

    make, _, _, _ = stack
    clock, reloads, reads = FakeClock(), [], []

    def copy(inner: Any) -> CachedRegistry:
        inner.app_names = lambda: sorted(inner.apps)
        get_app = inner.get_app
        inner.get_app = lambda name: (reads.append(name), get_app(name))[1]
        return CachedRegistry(inner, clock, ttl_s=2, refresh=reloads.append, unknown_reads_per_s=3)

    with make(True, True, copy) as http:
        assert http.processor.lane is not None
        for i in range(4):
            assert http.post(f"/nope-{i}/predict", json={"input": one_hot(1)}).status_code == 404
        assert reads == ["nope-0", "nope-1", "nope-2", "nope-3"]  # 3 within the budget, 1 before the list came
        assert len(reloads) == 1
        reloads.pop()()
        gone = http.post("/nope-4/predict", json={"input": one_hot(1)})
        assert gone.status_code == 404 and "nope-4" in gone.json()["cause"]
        assert len(reads) == 4  # answered from the list
        assert http.post("/digits/predict", json={"input": one_hot(2)}).json()["output"] == 2  # on the list: read
