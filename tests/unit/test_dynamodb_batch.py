"""The conditional puts shared by the cache claims and the canary evidence: DynamoDB's answers as botocore
``ClientError``s, from a stub client (moto does not simulate transaction conflicts)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from clipper.adapters.dynamodb_batch import conditional_puts
from clipper.errors import Unavailable

pytestmark = pytest.mark.unit


def put(key: str) -> dict:
    return {"TableName": "cache", "Item": {"key": {"S": key}}}


class OneItem:
    """put_item answers each error given once, in order, then succeeds."""

    def __init__(self, *codes: str) -> None:
        self.codes = list(codes)
        self.calls = 0

    def put_item(self, **spec: object) -> dict:
        self.calls += 1
        if self.codes:
            code = self.codes.pop(0)
            raise ClientError({"Error": {"Code": code, "Message": code}}, "PutItem")
        return {}


def test_a_single_claim_in_another_callers_transaction_is_tried_again_not_a_500():
    """A one-item claim on a key another query's claim transaction held failed with TransactionConflictException,
    which botocore does not retry: it became a Conflict the query path did not catch, an HTTP 500."""
    client = OneItem("TransactionConflictException", "TransactionConflictException")
    assert conditional_puts(client, [put("k")], lambda p: p["Item"]["key"]["S"], "cache claims") == [True]
    assert client.calls == 3
    taken = OneItem("TransactionConflictException", "ConditionalCheckFailedException")
    assert conditional_puts(taken, [put("k")], lambda p: p["Item"]["key"]["S"], "cache claims") == [False]


def test_a_conflict_that_does_not_end_is_unavailable():
    client = OneItem(*["TransactionConflictException"] * 50)
    with pytest.raises(Unavailable, match="cache claims"):
        conditional_puts(client, [put("k")], lambda p: p["Item"]["key"]["S"], "cache claims")


class Recording:
    def __init__(self) -> None:
        self.transactions: list[int] = []

    def transact_write_items(self, TransactItems: list) -> dict:
        self.transactions.append(len(TransactItems))
        return {}


def test_a_batch_over_a_transactions_4_mb_goes_in_several():
    """100 replies of 40 KB each were one transaction over DynamoDB's 4 MB: refused whole."""
    from clipper.adapters.dynamodb_batch import MAX_BYTES

    client = Recording()
    puts = [{"TableName": "r", "Item": {"key": {"S": f"k{i}"}, "reply": {"S": "x" * 40_000}}} for i in range(100)]
    assert conditional_puts(client, puts, lambda p: p["Item"]["key"]["S"], "replies") == [True] * 100
    assert sum(client.transactions) == 100 and len(client.transactions) >= 2
    assert max(client.transactions) * 40_000 <= MAX_BYTES
    small = Recording()
    tiny = [{"TableName": "r", "Item": {"key": {"S": f"k{i}"}}} for i in range(100)]
    conditional_puts(small, tiny, lambda p: p["Item"]["key"]["S"], "r")
    assert small.transactions == [100]  # small items: one transaction of 100, as before


def test_the_4_mb_is_counted_in_utf8_bytes():
    """The size counted characters: 100 items of 40,000 three-byte characters went 29 a transaction, 10 MB."""
    from clipper.adapters.dynamodb_batch import MAX_BYTES

    client = Recording()
    puts = [{"TableName": "r", "Item": {"key": {"S": f"k{i}"}, "reply": {"S": "猫" * 40_000}}} for i in range(100)]
    conditional_puts(client, puts, lambda p: p["Item"]["key"]["S"], "replies")
    assert max(client.transactions) * 120_000 <= MAX_BYTES and sum(client.transactions) == 100
