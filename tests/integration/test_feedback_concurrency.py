"""No feedback update is lost under real concurrency: threads apply feedback to one bandit state through
the DynamoDB store, racing between their reads and their conditional writes.

DynamoDB executes each request atomically; moto, a test double, does not (its transaction checks and
writes interleave across threads). So each request to moto is made atomic with a lock, as DynamoDB's are,
while everything between requests (read, update, conditional write, retry) races for real.

DynamoDB also cancels a transaction that overlaps another request on the same item, with the reason
``TransactionConflict``; moto never does. :class:`ConflictingTransactions` adds that behaviour: it wraps the
client, keeps the items of every transaction in flight (from the call until moto answers), and cancels a
transaction that reaches an item another thread's transaction holds, with the error DynamoDB sends (a
botocore ``ClientError``, ``TransactionCanceledException`` with one ``CancellationReasons`` entry per item).
No conflict is scripted: whether two transactions overlap is up to the threads' timing."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
from botocore.exceptions import ClientError

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


class ConflictingTransactions:
    """A DynamoDB client whose TransactWriteItems calls are cancelled with ``TransactionConflict`` when they
    overlap another in-flight transaction on one of their items, as DynamoDB's are; every request is atomic
    (``AtomicRequests``), and a transaction is in flight from its call until moto has answered it."""

    def __init__(self, client):
        self._atomic = AtomicRequests(client)
        self._lock = threading.Lock()
        self._in_flight: Counter[tuple[str, str, str]] = Counter()
        self.conflicts = 0

    def __getattr__(self, name):
        return getattr(self._atomic, name)

    def transact_write_items(self, TransactItems, **kwargs):
        items = [next(iter(op.values())) for op in TransactItems]
        keys = [(i["TableName"], i["Item"]["pk"]["S"], i["Item"]["sk"]["S"]) for i in items]
        with self._lock:
            clashes = [k in self._in_flight for k in keys]
            if any(clashes):
                self.conflicts += 1
                reasons = [
                    {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
                    if c
                    else {"Code": "None"}
                    for c in clashes
                ]
                codes = ", ".join(r["Code"] for r in reasons)
                raise ClientError(
                    {
                        "Error": {
                            "Code": "TransactionCanceledException",
                            "Message": f"Transaction cancelled, please refer cancellation reasons for specific "
                            f"reasons [{codes}]",
                        },
                        "CancellationReasons": reasons,
                    },
                    "TransactWriteItems",
                )
            self._in_flight.update(keys)
        try:
            return self._atomic.transact_write_items(TransactItems=TransactItems, **kwargs)
        finally:
            with self._lock:
                self._in_flight.subtract(keys)
                self._in_flight += Counter()  # drop the keys no transaction holds any more


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
    client = ConflictingTransactions(aws.dynamodb)
    store = CountingStore(client, "selection")
    rows = np.eye(64, dtype=np.float32)
    selection = Selection("exp4", ("a", "b"), {"a": 1.0, "b": 1.0}, 0)
    for i, key in enumerate(record_keys("ens", None, rows)):
        cache.entries[key] = {"selection": selection.to_dict(), "outputs": {"a": i, "b": 0}}
    return FeedbackProcessor(registry, store, cache, max_attempts=200), store, rows, client


def message(i, rows, fid=None):
    payload = encode_rows(rows[i : i + 1])[0]
    return FeedbackMessage(feedback_id=fid or f"f{i}", app="ens", payload=payload, label=i)


def test_concurrent_feedback_all_takes_effect(setup):
    """Overlapping transactions (``TransactionConflict``) are retried inside the update, version conflicts
    are read again: every feedback is applied, none is lost and none fails."""
    processor, store, rows, client = setup
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
    assert client.conflicts > 0  # and their transactions overlapped: DynamoDB would have cancelled some


def test_redelivery_is_idempotent(setup):
    processor, store, rows, _ = setup
    assert processor.process(message(3, rows, "same")) == "applied"
    before = store.load(state_key("ens"))
    assert processor.process(message(3, rows, "same")) == "duplicate"
    assert store.load(state_key("ens")) == before
