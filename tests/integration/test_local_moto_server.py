"""The local stack's moto server (infra/local/moto_server.py): a DynamoDB transaction backs up the items it names,
not the whole table, and a cancelled transaction still leaves every item as it was."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.dynamodb import models

from infra.local import moto_server

pytestmark = pytest.mark.integration


@pytest.fixture
def ddb() -> Iterator[Any]:
    assert moto_server.install()
    try:
        with mock_aws():
            client = boto3.client("dynamodb", region_name="us-east-1")
            client.create_table(
                TableName="t",
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                AttributeDefinitions=[
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                ],
                BillingMode="PAY_PER_REQUEST",
            )
            yield client
    finally:
        moto_server.uninstall()


def _key(pk: str, sk: str = "x") -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _get(client: Any, pk: str) -> dict[str, Any] | None:
    item: dict[str, Any] | None = client.get_item(TableName="t", Key=_key(pk)).get("Item")
    return item


def test_a_transaction_does_not_copy_the_table(ddb: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(50):
        ddb.put_item(TableName="t", Item={**_key(f"filler{i}"), "v": {"N": "1"}})

    def refuse(self: Any, memo: Any) -> Any:
        raise AssertionError("the whole table was copied")

    monkeypatch.setattr(models.Table, "__deepcopy__", refuse, raising=False)  # type: ignore[attr-defined]
    ddb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": "t", "Item": {**_key("a"), "v": {"N": "1"}}}},
            {
                "Update": {
                    "TableName": "t",
                    "Key": _key("b"),
                    "UpdateExpression": "ADD n :one",
                    "ExpressionAttributeValues": {":one": {"N": "1"}},
                }
            },
        ]
    )
    assert _get(ddb, "a") == {**_key("a"), "v": {"N": "1"}}
    assert _get(ddb, "b") == {**_key("b"), "n": {"N": "1"}}


def test_a_cancelled_transaction_leaves_every_item_as_it_was(ddb: Any) -> None:
    ddb.put_item(TableName="t", Item={**_key("kept"), "v": {"N": "1"}, "tags": {"SS": ["x"]}})
    ddb.put_item(TableName="t", Item={**_key("gone"), "v": {"N": "7"}})
    with pytest.raises(ClientError) as raised:
        ddb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": "t", "Item": {**_key("new"), "v": {"N": "2"}}}},
                {
                    "Update": {
                        "TableName": "t",
                        "Key": _key("kept"),
                        "UpdateExpression": "SET v = :v",
                        "ExpressionAttributeValues": {":v": {"N": "99"}},
                    }
                },
                {"Delete": {"TableName": "t", "Key": _key("gone")}},
                {
                    "Put": {
                        "TableName": "t",
                        "Item": {**_key("marker"), "v": {"N": "3"}},
                        "ConditionExpression": "attribute_exists(pk)",
                    }
                },
            ]
        )
    assert raised.value.response["Error"]["Code"] == "TransactionCanceledException"
    reasons = [r["Code"] for r in raised.value.response["CancellationReasons"]]
    assert reasons == ["None", "None", "None", "ConditionalCheckFailed"]
    assert _get(ddb, "new") is None
    assert _get(ddb, "marker") is None
    assert _get(ddb, "kept") == {**_key("kept"), "v": {"N": "1"}, "tags": {"SS": ["x"]}}
    assert _get(ddb, "gone") == {**_key("gone"), "v": {"N": "7"}}


def test_a_refused_transaction_writes_nothing(ddb: Any) -> None:
    """Two operations on one item: moto refuses the transaction after writing the first one."""
    with pytest.raises(ClientError):
        ddb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": "t", "Item": {**_key("twice"), "v": {"N": "1"}}}},
                {"Delete": {"TableName": "t", "Key": _key("twice")}},
            ]
        )
    assert _get(ddb, "twice") is None


def test_install_is_idempotent_and_uninstall_restores_moto() -> None:
    original = models.DynamoDBBackend.transact_write_items
    try:
        assert moto_server.install() and moto_server.install()
        assert models.DynamoDBBackend.transact_write_items._clipper_original is original  # type: ignore[attr-defined]
    finally:
        moto_server.uninstall()
    assert models.DynamoDBBackend.transact_write_items is original
    assert models.copy is __import__("copy")  # type: ignore[attr-defined]


def test_main_passes_the_arguments_to_moto_server() -> None:
    seen: list[list[str]] = []
    try:
        moto_server.main(["-H", "127.0.0.1", "-p", "1"], run=seen.append)
    finally:
        moto_server.uninstall()
    assert seen == [["-H", "127.0.0.1", "-p", "1"]]
