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
