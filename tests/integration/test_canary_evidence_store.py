"""The canary evidence store on DynamoDB (moto): atomic counters per (model, trial, version), feedback counted
once per feedback id, and concurrent writers losing nothing.

moto, a test double, interleaves concurrent requests (its ``ADD`` is a read and a write in Python); DynamoDB runs
each request atomically. So the concurrent tests make each request to moto atomic (``AtomicRequests``), as
DynamoDB's are, while the writers race for real between their requests: the store must never read and write
back (a read-modify-write would lose counts even so)."""

from __future__ import annotations

import threading

import pytest
from botocore.exceptions import ClientError

from clipper.adapters.dynamodb_canary import DynamoDBCanaryEvidence
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.canary.evidence import VersionEvidence
from clipper.core.domain import InputType, ModelVersion
from clipper.errors import ClipperError, Conflict
from tests.services import AtomicRequests

pytestmark = pytest.mark.integration

TRIAL = "v2@1700000000000"


@pytest.fixture
def store(aws):
    return DynamoDBCanaryEvidence(aws.dynamodb, aws.registry_table)


def test_adds_sum_per_version_and_trial(store):
    store.add("mlp", TRIAL, "v1", VersionEvidence.of_query())
    store.add("mlp", TRIAL, "v1", VersionEvidence.of_query(error=True))
    store.add("mlp", TRIAL, "v2", VersionEvidence.of_query(slo_miss=True))
    store.add("mlp", TRIAL, "v2", VersionEvidence.of_feedback(0.25, 1.0))
    store.add("mlp", "v2@1", "v2", VersionEvidence.of_feedback(1.0))  # another trial of the same version
    store.add("other", TRIAL, "v2", VersionEvidence.of_query())  # another model
    got = store.load("mlp", TRIAL)
    assert got == {
        "v1": VersionEvidence(queries=2, errors=1),
        "v2": VersionEvidence(feedback=2, loss_sum=1.25, queries=1, slo_misses=1),
    }
    assert store.load("mlp", "v2@1") == {"v2": VersionEvidence(feedback=1, loss_sum=1.0)}
    assert store.load("mlp", "v9@5") == {}


def test_small_losses_keep_their_value(store):
    store.add("mlp", TRIAL, "v1", VersionEvidence.of_feedback(1e-5))
    store.add("mlp", TRIAL, "v1", VersionEvidence.of_feedback(0.1))
    assert store.load("mlp", TRIAL)["v1"].loss_sum == pytest.approx(0.10001, abs=1e-12)


def test_a_trial_whose_prefix_is_another_trial_is_kept_apart(store):
    store.add("mlp", "v2@1", "v1", VersionEvidence.of_query())
    store.add("mlp", "v2@12", "v1", VersionEvidence.of_query(error=True))
    store.add("mlp", "v2@12", "v9", VersionEvidence.of_query(error=True))
    assert store.load("mlp", "v2@1") == {"v1": VersionEvidence(queries=1)}


def test_evidence_items_do_not_disturb_the_model_record(aws, store):
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    mv = ModelVersion("mlp", "v1", InputType.DOUBLES, "q", "e")
    registry.put_version(mv, activate=True)
    store.add("mlp", TRIAL, "v1", VersionEvidence.of_query())
    assert store.add_once("mlp", TRIAL, "v1", VersionEvidence.of_feedback(0.0), "f1")
    record = registry.model_record("mlp")
    assert list(record.versions) == ["v1"] and record.head.active_version == "v1"


def test_add_once_counts_a_feedback_id_once_per_trial(store):
    loss = VersionEvidence.of_feedback(1.0)
    assert store.add_once("mlp", TRIAL, "v2", loss, "fb-1") is True
    assert store.add_once("mlp", TRIAL, "v2", loss, "fb-1") is False  # redelivered
    assert store.add_once("mlp", TRIAL, "v2", loss, "fb-2") is True
    assert store.add_once("mlp", "v3@9", "v2", loss, "fb-1") is True  # another trial counts it
    assert store.load("mlp", TRIAL) == {"v2": VersionEvidence(feedback=2, loss_sum=2.0)}


def test_add_once_with_a_zero_loss_counts_the_label(store):
    assert store.add_once("mlp", TRIAL, "v1", VersionEvidence.of_feedback(0.0), "fb-1")
    assert store.load("mlp", TRIAL) == {"v1": VersionEvidence(feedback=1)}


def test_concurrent_adds_lose_nothing(aws):
    store = DynamoDBCanaryEvidence(AtomicRequests(aws.dynamodb), aws.registry_table)
    threads, per_thread = 8, 25

    def work(t: int) -> None:
        for i in range(per_thread):
            store.add("mlp", TRIAL, "v1", VersionEvidence.of_query(error=i % 5 == 0))
            store.add_once("mlp", TRIAL, "v2", VersionEvidence.of_feedback(0.5), f"fb-{t}-{i}")
            store.add_once("mlp", TRIAL, "v2", VersionEvidence.of_feedback(0.5), f"fb-{t}-{i}")  # a duplicate

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    n = threads * per_thread
    assert store.load("mlp", TRIAL) == {
        "v1": VersionEvidence(queries=n, errors=threads * 5),
        "v2": VersionEvidence(feedback=n, loss_sum=n * 0.5),
    }


class _Conflicting:
    """A client whose first ``conflicts`` transactions are cancelled by a concurrent one, as DynamoDB's can be."""

    def __init__(self, client, conflicts: int) -> None:
        self._client, self.left = client, conflicts

    def __getattr__(self, name):
        return getattr(self._client, name)

    def transact_write_items(self, **kwargs):
        if self.left:
            self.left -= 1
            reasons = [{"Code": "None"}, {"Code": "TransactionConflict"}]
            raise ClientError(
                {"Error": {"Code": "TransactionCanceledException"}, "CancellationReasons": reasons},
                "TransactWriteItems",
            )
        return self._client.transact_write_items(**kwargs)


def test_add_once_sends_a_conflicting_transaction_again(aws):
    client = _Conflicting(aws.dynamodb, conflicts=2)
    store = DynamoDBCanaryEvidence(client, aws.registry_table, sleep=lambda s: None)
    assert store.add_once("mlp", TRIAL, "v2", VersionEvidence.of_feedback(1.0), "fb-1")
    assert store.load("mlp", TRIAL) == {"v2": VersionEvidence(feedback=1, loss_sum=1.0)}
    stuck = DynamoDBCanaryEvidence(_Conflicting(aws.dynamodb, 100), aws.registry_table, sleep=lambda s: None)
    with pytest.raises(Conflict):
        stuck.add_once("mlp", TRIAL, "v2", VersionEvidence.of_feedback(1.0), "fb-2")


def test_a_missing_table_is_a_clipper_error(aws):
    store = DynamoDBCanaryEvidence(aws.dynamodb, "no-such-table")
    with pytest.raises(ClipperError):
        store.add("mlp", TRIAL, "v1", VersionEvidence.of_query())
    with pytest.raises(ClipperError):
        store.load("mlp", TRIAL)
    with pytest.raises(ClipperError):
        store.add_once("mlp", TRIAL, "v1", VersionEvidence.of_feedback(1.0), "fb-1")


def _create_pk_sk_table(dynamodb, name):
    keys = [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]
    attributes = [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}]
    dynamodb.create_table(
        TableName=name, KeySchema=keys, AttributeDefinitions=attributes, BillingMode="PAY_PER_REQUEST"
    )


def _pks(dynamodb, table):
    return sorted(i["pk"]["S"] for i in dynamodb.scan(TableName=table)["Items"])


def test_the_feedback_functions_keep_the_markers_out_of_the_registry(aws, monkeypatch):
    """Each feedback to a model with a canary leaves a marker for 15 days. In the registry, the canary reviewer's
    scan each minute (and get_all_models, get_state) read every one of them; the feedback processor the functions
    build puts them in the selection table, and the counters stay in the registry, where the reviewer reads them."""
    from clipper.settings import CommonSettings
    from clipper.wiring import build_feedback_processor

    for name in ("selection", "cache"):
        _create_pk_sk_table(aws.dynamodb, name)
    monkeypatch.setenv("CLIPPER_REGISTRY_TABLE", aws.registry_table)
    monkeypatch.setenv("CLIPPER_REPLIES_TABLE", aws.replies_table)
    monkeypatch.setenv("CLIPPER_SELECTION_TABLE", "selection")
    monkeypatch.setenv("CLIPPER_CACHE_TABLE", "cache")
    evidence = build_feedback_processor(CommonSettings(), aws.dynamodb).evidence  # type: ignore[call-arg]
    assert evidence is not None

    assert evidence.add_once("mlp", TRIAL, "v2", VersionEvidence.of_feedback(1.0), "fb-1") is True
    assert evidence.add_once("mlp", TRIAL, "v2", VersionEvidence.of_feedback(1.0), "fb-1") is False  # redelivered

    assert _pks(aws.dynamodb, aws.registry_table) == ["MODEL#mlp"]  # the counters only
    assert _pks(aws.dynamodb, "selection") == [f"CANARY#mlp#{TRIAL}"]
    assert DynamoDBCanaryEvidence(aws.dynamodb, aws.registry_table).load("mlp", TRIAL) == {
        "v2": VersionEvidence(feedback=1, loss_sum=1.0)
    }
