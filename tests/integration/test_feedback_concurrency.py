"""No feedback update is lost under real concurrency: threads apply feedback to one bandit state through
the DynamoDB store, racing between their reads and their conditional writes.

DynamoDB executes each request atomically; moto, a test double, does not (its transaction checks and
writes interleave across threads). So each request to moto is made atomic with a lock, as DynamoDB's are,
while everything between requests (read, update, conditional write, retry) races for real."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
from clipper.core.cache_keys import record_keys
from clipper.core.messages import encode_rows
from clipper.feedback import FeedbackMessage, FeedbackProcessor
from clipper.selection import Selection, state_key
from tests.fakes import InMemoryCache, InMemoryRegistry, digits_app
from tests.services import AtomicRequests

pytestmark = pytest.mark.integration


class CountingStore(DynamoDBSelectionStore):
    conflicts = 0

    def save(self, *args, **kwargs):
        from clipper.errors import Conflict

        try:
            return super().save(*args, **kwargs)
        except Conflict:
            CountingStore.conflicts += 1
            raise


@pytest.fixture
def setup(aws):
    aws.dynamodb.create_table(
        TableName="selection",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    registry = InMemoryRegistry()
    registry.apps["ens"] = digits_app(name="ens", policy="exp4")
    registry.links["ens"] = ["a", "b"]
    cache = InMemoryCache()
    store = CountingStore(AtomicRequests(aws.dynamodb), "selection")
    rows = np.eye(64, dtype=np.float32)
    selection = Selection("exp4", ("a", "b"), {"a": 1.0, "b": 1.0}, 0)
    for i, key in enumerate(record_keys("ens", None, rows)):
        cache.entries[key] = {"selection": selection.to_dict(), "outputs": {"a": i, "b": 0}}
    return FeedbackProcessor(registry, store, cache, max_attempts=200), store, rows


def message(i, rows, fid=None):
    payload = encode_rows(rows[i : i + 1])[0]
    return FeedbackMessage(feedback_id=fid or f"f{i}", app="ens", payload=payload, label=i)


def test_concurrent_feedback_all_takes_effect(setup):
    processor, store, rows = setup
    n_threads, per_thread = 8, 5
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def work(t):
        barrier.wait()
        try:
            for j in range(per_thread):
                i = 1 + t * per_thread + j
                assert processor.process(message(i, rows)) == "applied"
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    state = store.load(state_key("ens"))
    assert state.updates == n_threads * per_thread  # every update counted: none lost
    assert state.weights["a"] > state.weights["b"]  # "a" was always right
    assert CountingStore.conflicts > 0  # the writers really raced, and the losers reapplied


def test_redelivery_is_idempotent(setup):
    processor, store, rows = setup
    assert processor.process(message(3, rows, "same")) == "applied"
    before = store.load(state_key("ens"))
    assert processor.process(message(3, rows, "same")) == "duplicate"
    assert store.load(state_key("ens")) == before
