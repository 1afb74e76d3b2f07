"""The frontend's tally of queries, endpoint errors and SLO misses per version of a model with a canary: counted
in memory, flushed to the evidence store off the query path, kept when a flush fails."""

from __future__ import annotations

import random
import time

import pytest

from clipper.batching.core import Batcher
from clipper.canary.evidence import VersionEvidence
from clipper.core.domain import Canary
from clipper.frontend.canary_tally import CanaryTally
from clipper.frontend.query import QueryProcessor
from clipper.frontend.results import ModelAnswer
from clipper.frontend.selection import Selector
from tests.fakes import (
    FakeClock,
    FakeEndpoint,
    InMemoryCache,
    InMemoryCanaryEvidence,
    InMemoryRegistry,
    InMemoryReplies,
    digits_app,
    model_version,
)
from tests.unit.test_query_processor import InlineQueue, one_hot

pytestmark = pytest.mark.unit

CANARY = Canary("2", 0.1, 1_700_000_000.0)
T = CANARY.trial


def answer(model: str, version: str, failure: str | None = None) -> ModelAnswer:
    return ModelAnswer(model_version(model, version), [None], problem=failure, failure=failure)


def tally_world(*canaried: str):
    registry = InMemoryRegistry()
    for m in canaried:
        registry.canaries[m] = CANARY
    store = InMemoryCanaryEvidence()
    return CanaryTally(registry, store), registry, store


def test_a_model_without_a_canary_is_looked_up_once_then_costs_one_lookup():
    tally, _, store = tally_world()
    tally.count([answer("mlp", "1")])
    tally.refresh()
    assert tally.running == {"mlp": None}
    for _ in range(3):
        tally.count([answer("mlp", "1", "error")])
    tally.flush()
    assert store.counts == {} and tally._counts == {} and tally._seen == set()


def test_queries_errors_and_misses_per_version():
    tally, _, store = tally_world("mlp")
    tally.count([answer("mlp", "1")])  # first sight: not counted yet
    tally.refresh()
    tally.count([answer("mlp", "1"), answer("tree", "7", "error")])
    tally.count([answer("mlp", "2", "error")])
    tally.count([answer("mlp", "2", "timeout")])
    tally.count([answer("mlp", "2")])
    tally.count([answer("mlp", "2", "unavailable")])  # the frontend's own failure: says nothing of the version
    tally.flush()
    assert store.counts == {
        ("mlp", T, "1"): VersionEvidence(queries=1),
        ("mlp", T, "2"): VersionEvidence(queries=3, errors=1, slo_misses=1),
    }
    tally.flush()  # nothing new: nothing added
    assert store.counts[("mlp", T, "2")] == VersionEvidence(queries=3, errors=1, slo_misses=1)


def test_a_failed_flush_keeps_the_counts_for_the_next():
    tally, _, store = tally_world("mlp")
    tally.count([answer("mlp", "2")])
    tally.refresh()
    tally.count([answer("mlp", "2", "error")])
    store.fail = True
    tally.flush()
    tally.count([answer("mlp", "2")])
    store.fail = False
    tally.flush()
    assert store.counts == {("mlp", T, "2"): VersionEvidence(queries=2, errors=1)}


def test_a_trial_that_ends_stops_counting_and_a_new_one_counts_apart():
    tally, registry, store = tally_world("mlp")
    tally.count([answer("mlp", "2")])
    tally.refresh()
    assert tally.any_running([answer("mlp", "2")])
    del registry.canaries["mlp"]
    tally.refresh()
    tally.count([answer("mlp", "2", "error")])
    assert not tally.any_running([answer("mlp", "2")])
    again = Canary("2", 0.1, CANARY.started_at + 60)
    registry.canaries["mlp"] = again
    tally.refresh()
    tally.count([answer("mlp", "2", "error")])
    tally.flush()
    assert store.counts == {("mlp", again.trial, "2"): VersionEvidence(queries=1, errors=1)}


def test_an_unreadable_registry_keeps_what_was_known():
    tally, registry, _store = tally_world("mlp")
    tally.count([answer("mlp", "2")])
    tally.refresh()

    def down(model):
        raise RuntimeError("registry down")

    registry.canary = down  # type: ignore[method-assign]
    tally.refresh()
    assert tally.running == {"mlp": T}


def test_the_thread_flushes_each_interval_and_at_stop():
    registry = InMemoryRegistry(canaries={"mlp": CANARY})
    store = InMemoryCanaryEvidence()
    tally = CanaryTally(registry, store, every_s=0.01)
    tally.start()
    tally.count([answer("mlp", "2")])
    deadline = time.monotonic() + 5
    while tally.running.get("mlp") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    tally.count([answer("mlp", "2", "timeout")])
    tally.stop()
    assert store.counts == {("mlp", T, "2"): VersionEvidence(queries=1, slo_misses=1)}


# -- the query path -----------------------------------------------------------------------------------------------
class ByVersion:
    def __init__(self, endpoints):
        self.endpoints = endpoints

    def endpoint_for(self, model, version):
        return self.endpoints[version]


def test_the_query_path_counts_a_canarys_error_and_miss_and_records_a_single_models_queries():
    clock, registry, replies = FakeClock(), InMemoryRegistry(), InMemoryReplies()
    registry.apps["digits"] = digits_app()
    registry.links["digits"] = ["mlp"]
    for v in ("1", "2"):
        registry.versions[("mlp", v)] = model_version("mlp", v)
    registry.active["mlp"] = "1"
    registry.canaries["mlp"] = Canary("2", 1.0, CANARY.started_at)  # every query to the canary
    canary_endpoint = FakeEndpoint()
    resolver = ByVersion({"1": FakeEndpoint(), "2": canary_endpoint})
    queue = InlineQueue(batcher=Batcher(resolver, replies, clock), clock=clock)
    cache, store = InMemoryCache(), InMemoryCanaryEvidence()
    tally = CanaryTally(registry, store)
    ids = iter(range(1000, 10**6, 1000))
    selector = Selector(registry, None, clock, random.Random(1), 0.0)
    processor = QueryProcessor(
        registry, queue, replies, clock, lambda: next(ids), cache=cache, selector=selector, tally=tally
    )
    processor.predict("digits", {"input": one_hot(1)})  # the model's first query: the tally learns of its canary
    tally.tick()
    assert store.counts == {}
    assert processor.predict("digits", {"input": one_hot(2)}).as_dict()["default"] is False
    canary_endpoint.fail_with = "model crashed"
    assert processor.predict("digits", {"input": one_hot(3)}).as_dict()["default"] is True
    canary_endpoint.fail_with = None
    queue.batcher = None  # nobody answers: a miss
    assert processor.predict("digits", {"input": one_hot(4)}).as_dict()["default"] is True
    tally.tick()
    trial = registry.canaries["mlp"].trial
    assert store.counts == {("mlp", trial, "2"): VersionEvidence(queries=3, errors=1, slo_misses=1)}
    # a single-model application's query is recorded, with its version, while its model has a canary
    records = [e for e in cache.entries.values() if isinstance(e, dict) and "versions" in e]
    assert {"outputs": {"mlp": 2}, "versions": {"mlp": "2"}}.items() <= records[0].items()
