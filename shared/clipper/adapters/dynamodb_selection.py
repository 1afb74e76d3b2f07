"""Bandit state in DynamoDB, one item per state key, with optimistic concurrency.

    pk = <state key>   sk = STATE             the state (JSON) and its version
    pk = <state key>   sk = FEEDBACK#<id>     marks a feedback applied to that state (expires after a day)

With ``user_state_ttl_s`` (``CLIPPER_USER_STATE_RETENTION_DAYS``), a user's state (``state_key(app, user)``)
carries ``expires_at`` that many seconds after its last save, so DynamoDB's TTL removes the states of users who
gave no feedback for that long, and those of deleted applications (each user's query then starts again from a
copy of the application's state, as a new user's does). An application's own state never expires.

A save is one transaction: the state, conditional on the version read, and the feedback marker,
conditional on its absence. A lost race raises ``Conflict`` (the caller reads again and reapplies); a
redelivered feedback finds its marker and changes nothing.

DynamoDB also cancels a transaction that overlaps another request on the same item, with the reason
``TransactionConflict``: nothing was decided about its conditions, so the same transaction is sent again,
after a jittered exponential back-off (full jitter: a random wait up to ``backoff_s * 2**attempt``, capped at
``max_backoff_s``), at most ``conflict_retries`` times; the retry then commits, or finds the version changed
(``Conflict``: read again). Only a state that stays contended through every retry raises ``Conflict`` from
them, and the caller's bounded read-and-retry loop goes on from there.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from clipper.adapters.aws_errors import aws_call, cancellation_codes, translate
from clipper.errors import Conflict
from clipper.selection.state import SelectionState, is_user_key

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
else:
    DynamoDBClient = Any

# A marker (this feedback id was counted) outlives the feedback message: a message lives at most 14 days (the
# dead-letter queue keeps it that long from its first enqueue; template.yaml), so a message redriven from there
# is still recognised (with 24 h it was applied again)
MARKER_TTL_S = 15 * 24 * 3600


class DynamoDBSelectionStore:
    def __init__(
        self,
        client: DynamoDBClient,
        table: str,
        conflict_retries: int = 8,
        backoff_s: float = 0.01,
        max_backoff_s: float = 0.25,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        user_state_ttl_s: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``user_state_ttl_s``: how long a user's state is kept after its last save (0: for ever)."""
        self._client = client
        self._user_ttl = user_state_ttl_s
        self._now = clock
        self._table = table
        self._conflict_retries = conflict_retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._rng = rng or random.Random()

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
        if self._user_ttl > 0 and is_user_key(key):
            put_state["Item"]["expires_at"] = {"N": str(int(self._now()) + self._user_ttl)}
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
                            "expires_at": {"N": str(int(self._now()) + MARKER_TTL_S)},
                        },
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                }
            )
        for attempt in range(self._conflict_retries + 1):
            if attempt:
                self._sleep(self._rng.uniform(0.0, min(self._max_backoff_s, self._backoff_s * 2 ** (attempt - 1))))
            try:
                self._client.transact_write_items(TransactItems=items)
                return True
            except ClientError as e:
                codes = cancellation_codes(e)
                if len(codes) > 1 and codes[1] == "ConditionalCheckFailed":
                    return False  # this feedback was applied before
                if codes and codes[0] == "ConditionalCheckFailed":
                    raise Conflict(f"selection state {key} changed since version {expected_version}") from e
                if "TransactionConflict" not in codes:
                    raise translate(e, "dynamodb.TransactWriteItems(selection)") from e
                last = e
            except BotoCoreError as e:
                raise translate(e, "dynamodb.TransactWriteItems(selection)") from e
        raise Conflict(
            f"selection state {key}: {self._conflict_retries + 1} transactions cancelled by concurrent ones"
        ) from last
