"""Bandit state in DynamoDB, one item per state key, with optimistic concurrency.

    pk = <state key>   sk = STATE             the state (JSON) and its version
    pk = <state key>   sk = FEEDBACK#<id>     marks a feedback applied to that state (expires after a day)

A save is one transaction: the state, conditional on the version read, and the feedback marker,
conditional on its absence. A lost race raises ``Conflict`` (the caller reads again and reapplies); a
redelivered feedback finds its marker and changes nothing.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from clipper.adapters.aws_errors import aws_call, error_code, translate
from clipper.errors import Conflict
from clipper.selection.state import SelectionState

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
else:
    DynamoDBClient = Any

MARKER_TTL_S = 24 * 3600


class DynamoDBSelectionStore:
    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table

    def load(self, key: str) -> SelectionState | None:
        with aws_call("dynamodb.GetItem(selection)"):
            resp = self._client.get_item(
                TableName=self._table, Key={"pk": {"S": key}, "sk": {"S": "STATE"}}, ConsistentRead=True
            )
        item = resp.get("Item")
        return SelectionState.from_dict(json.loads(item["state"]["S"])) if item else None

    def save(self, key: str, state: SelectionState, expected_version: int, feedback_id: str | None = None) -> bool:
        put_state: dict[str, Any] = {
            "TableName": self._table,
            "Item": {
                "pk": {"S": key},
                "sk": {"S": "STATE"},
                "state": {"S": json.dumps(state.to_dict())},
                "version": {"N": str(state.version)},
            },
        }
        if expected_version == 0:
            put_state["ConditionExpression"] = "attribute_not_exists(pk) OR version = :v"
        else:
            put_state["ConditionExpression"] = "version = :v"
        put_state["ExpressionAttributeValues"] = {":v": {"N": str(expected_version)}}
        items: list[dict[str, Any]] = [{"Put": put_state}]
        if feedback_id is not None:
            items.append(
                {
                    "Put": {
                        "TableName": self._table,
                        "Item": {
                            "pk": {"S": key},
                            "sk": {"S": f"FEEDBACK#{feedback_id}"},
                            "expires_at": {"N": str(int(time.time()) + MARKER_TTL_S)},
                        },
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                }
            )
        try:
            self._client.transact_write_items(TransactItems=items)
        except ClientError as e:
            if error_code(e) != "TransactionCanceledException":
                raise translate(e, "dynamodb.TransactWriteItems(selection)") from e
            codes = [r.get("Code", "None") for r in e.response.get("CancellationReasons", [])]
            if len(codes) > 1 and codes[1] == "ConditionalCheckFailed":
                return False  # this feedback was applied before
            if codes and codes[0] == "ConditionalCheckFailed":
                raise Conflict(f"selection state {key} changed since version {expected_version}") from e
            raise translate(e, "dynamodb.TransactWriteItems(selection)") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.TransactWriteItems(selection)") from e
        return True
