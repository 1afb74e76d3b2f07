"""How the DynamoDB selection store answers each way DynamoDB cancels its transaction, over a client that
answers with the errors DynamoDB sends (botocore ``ClientError``s): ``TransactionConflict`` is retried with
a jittered, bounded back-off; a false version condition is a ``Conflict`` at once; a found feedback marker
is a redelivery."""

from __future__ import annotations

import random

import pytest
from botocore.exceptions import ClientError

from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
from clipper.errors import Conflict, Unavailable
from clipper.selection import initial_state

pytestmark = pytest.mark.unit


def cancelled(*codes: str) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": "TransactionCanceledException", "Message": f"Transaction cancelled [{', '.join(codes)}]"},
            "CancellationReasons": [{"Code": c} for c in codes],
        },
        "TransactWriteItems",
    )


class AnsweringClient:
    """Answers each TransactWriteItems with the next scripted error, then succeeds."""

    def __init__(self, *errors: ClientError) -> None:
        self.errors = list(errors)
        self.calls: list[list[dict]] = []

    def transact_write_items(self, TransactItems):
        self.calls.append(TransactItems)
        if self.errors:
            raise self.errors.pop(0)
        return {}


def store(client: AnsweringClient, waits: list[float], retries: int = 4) -> DynamoDBSelectionStore:
    return DynamoDBSelectionStore(
        client,
        "t",
        conflict_retries=retries,
        backoff_s=0.01,
        max_backoff_s=0.05,
        sleep=waits.append,
        rng=random.Random(7),
    )


STATE = initial_state("exp4", ["a", "b"])


def test_transaction_conflicts_are_retried_with_jittered_growing_back_off():
    client, waits = (
        AnsweringClient(cancelled("TransactionConflict", "None"), cancelled("None", "TransactionConflict")),
        [],
    )
    assert store(client, waits).save("k", STATE, 0, "f1") is True
    assert len(client.calls) == 3 and client.calls[0] == client.calls[2]  # the same transaction, sent again
    assert len(waits) == 2 and 0 <= waits[0] <= 0.01 and 0 <= waits[1] <= 0.02


def test_conflicts_that_never_end_become_a_conflict_after_the_bounded_retries():
    client, waits = AnsweringClient(*[cancelled("TransactionConflict", "None")] * 50), []
    with pytest.raises(Conflict, match="cancelled by concurrent"):
        store(client, waits, retries=6).save("k", STATE, 3, "f1")
    assert len(client.calls) == 7 and len(waits) == 6
    assert all(0 <= w <= 0.05 for w in waits) and len(set(waits)) == 6  # capped, and jittered


def test_a_false_version_condition_is_a_conflict_at_once():
    client, waits = AnsweringClient(cancelled("ConditionalCheckFailed", "None")), []
    with pytest.raises(Conflict, match="changed since version 3"):
        store(client, waits).save("k", STATE, 3, "f1")
    assert len(client.calls) == 1 and waits == []


@pytest.mark.parametrize(
    "codes", [("None", "ConditionalCheckFailed"), ("TransactionConflict", "ConditionalCheckFailed")]
)
def test_a_found_feedback_marker_is_a_redelivery(codes):
    client, waits = AnsweringClient(cancelled(*codes)), []
    assert store(client, waits).save("k", STATE, 3, "f1") is False
    assert len(client.calls) == 1


def test_other_errors_are_translated_not_retried():
    error = ClientError({"Error": {"Code": "ValidationException", "Message": "bad"}}, "TransactWriteItems")
    client, waits = AnsweringClient(error), []
    with pytest.raises(Unavailable, match="ValidationException"):
        store(client, waits).save("k", STATE, 3, "f1")
    assert len(client.calls) == 1 and waits == []
