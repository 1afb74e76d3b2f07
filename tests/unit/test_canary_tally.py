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


def tally_world():
    store = InMemoryCanaryEvidence()
    return CanaryTally(store), store


def test_a_query_without_a_trial_is_not_counted():
    tally, store = tally_world()
    for _ in range(3):
        tally.count([answer("mlp", "1", "error")], {})
        tally.count([answer("mlp", "1", "error")], {"tree": T})  # another model's trial
    tally.flush()
    assert store.counts == {} and tally._counts == {}


def test_queries_errors_and_misses_per_version_in_the_querys_trial():
    tally, store = tally_world()
    trials = {"mlp": T}
    tally.count([answer("mlp", "1"), answer("tree", "7", "error")], trials)
    tally.count([answer("mlp", "2", "error")], trials)
    tally.count([answer("mlp", "2", "timeout")], trials)
    tally.count([answer("mlp", "2")], trials)
    tally.count([answer("mlp", "2", "unavailable")], trials)  # the frontend's own failure: says nothing of the version
    tally.flush()
    assert store.counts == {
        ("mlp", T, "1"): VersionEvidence(queries=1),
        ("mlp", T, "2"): VersionEvidence(queries=3, errors=1, slo_misses=1),
    }
    tally.flush()  # nothing new: nothing added
    assert store.counts[("mlp", T, "2")] == VersionEvidence(queries=3, errors=1, slo_misses=1)


def test_a_failed_flush_keeps_the_counts_for_the_next():
    tally, store = tally_world()
    tally.count([answer("mlp", "2")], {"mlp": T})
    tally.count([answer("mlp", "2", "error")], {"mlp": T})
    store.fail = True
    tally.flush()
    tally.count([answer("mlp", "2")], {"mlp": T})
    store.fail = False
    tally.flush()
    assert store.counts == {("mlp", T, "2"): VersionEvidence(queries=3, errors=1)}


def test_each_query_counts_in_its_own_trial():
    tally, store = tally_world()
    again = Canary("2", 0.1, CANARY.started_at + 60).trial
    tally.count([answer("mlp", "2", "error")], {"mlp": T})
    tally.count([answer("mlp", "2")], {"mlp": again})  # a query of the next trial of the same version
    tally.flush()
    assert store.counts == {
        ("mlp", T, "2"): VersionEvidence(queries=1, errors=1),
        ("mlp", again, "2"): VersionEvidence(queries=1),
    }


def test_the_thread_flushes_each_interval_and_at_stop():
    store = InMemoryCanaryEvidence()
    tally = CanaryTally(store, every_s=0.01)
    tally.start()
    tally.count([answer("mlp", "2")], {"mlp": T})
    deadline = time.monotonic() + 5
    while not store.counts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.counts == {("mlp", T, "2"): VersionEvidence(queries=1)}  # flushed by the thread
    tally.count([answer("mlp", "2", "timeout")], {"mlp": T})
    tally.stop()
    assert store.counts == {("mlp", T, "2"): VersionEvidence(queries=2, slo_misses=1)}


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
    tally = CanaryTally(store)
    ids = iter(range(1000, 10**6, 1000))
    selector = Selector(registry, None, clock, random.Random(1), 0.0)
    processor = QueryProcessor(
        registry, queue, replies, clock, lambda: next(ids), cache=cache, selector=selector, tally=tally
    )
    assert processor.predict("digits", {"input": one_hot(2)}).as_dict()["default"] is False
    canary_endpoint.fail_with = "model crashed"
    assert processor.predict("digits", {"input": one_hot(3)}).as_dict()["default"] is True
    canary_endpoint.fail_with = None
    queue.batcher = None  # nobody answers: a miss
    assert processor.predict("digits", {"input": one_hot(4)}).as_dict()["default"] is True
    tally.flush()
    trial = registry.canaries["mlp"].trial
    assert store.counts == {("mlp", trial, "2"): VersionEvidence(queries=3, errors=1, slo_misses=1)}
    # a single-model application's query is recorded, with its version, while its model has a canary
    records = [e for e in cache.entries.values() if isinstance(e, dict) and "versions" in e]
    assert {"outputs": {"mlp": 2}, "versions": {"mlp": "2"}}.items() <= records[0].items()
