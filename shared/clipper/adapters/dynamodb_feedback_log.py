"""The feedback log (``clipper.ports.FeedbackLog``) in the selection table, beside the bandit states it explains:

    pk = LOG#<app>#<YYYY-MM-DD>   sk = <epoch ms, 15 digits>#<feedback id>   entry (S: JSON), expires_at (N)

One partition per application and UTC day, so the report reads an application's recent days with one Query each
(newest first) and no partition grows without bound; entries expire after ``ttl_s`` (30 days by default) through
the table's TTL. Feedback that was not learned is counted, not logged, in one item of the day's partition (its sort
key sorts after every entry's, so a range of entries never reads it):

    pk = LOG#<app>#<YYYY-MM-DD>   sk = skipped                  <outcome> (N), ..., expires_at (N)
    pk = LOG#<app>#<YYYY-MM-DD>   sk = skipped#<feedback id>    expires_at (N): that feedback was counted

A feedback is counted once: its marker and the count are one transaction, the marker conditional on its absence
(a message delivered again, after a failed delete or its visibility timeout, was counted again).

The application name is percent-encoded, so ``#`` in a name cannot reach another's partition.
State keys start with ``app/`` (``clipper.selection.state_key``), so the two never share a partition.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from botocore.exceptions import ClientError

from clipper.adapters.aws_errors import aws_call, cancellation_codes
from clipper.report.entry import FeedbackEntry

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
else:
    DynamoDBClient = Any

LOG_TTL_S = 30 * 24 * 3600
SKIPPED_SK = "skipped"  # after every entry's "<15 digits>#<id>": outside any range of entries


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def _pk(app: str, day: str) -> str:
    return f"LOG#{quote(app, safe='')}#{day}"


def _days_newest_first(since: float, until: float) -> Iterator[str]:
    """The UTC days (``YYYY-MM-DD``) that [since, until] touches, the newest first: the partitions to read."""
    day = datetime.fromtimestamp(until, UTC).date()
    first = datetime.fromtimestamp(max(since, 0.0), UTC).date()
    while day >= first:
        yield day.strftime("%Y-%m-%d")
        day -= timedelta(days=1)


def _sk(t: float) -> str:
    return f"{max(0, int(t * 1000)):015d}"


class DynamoDBFeedbackLog:
    def __init__(self, client: DynamoDBClient, table: str, ttl_s: int = LOG_TTL_S) -> None:
        self._client = client
        self._table = table
        self._ttl_s = ttl_s

    def append(self, entry: FeedbackEntry) -> None:
        item = {
            "pk": {"S": _pk(entry.app, _day(entry.time))},
            "sk": {"S": f"{_sk(entry.time)}#{entry.feedback_id}"},
            "entry": {"S": json.dumps(entry.to_dict(), separators=(",", ":"))},
            "expires_at": {"N": str(math.ceil(entry.time) + self._ttl_s)},
        }
        with aws_call("dynamodb.PutItem(feedback log)"):
            self._client.put_item(TableName=self._table, Item=item)

    def count_skipped(self, app: str, outcome: str, at: float, feedback_id: str | None = None) -> bool:
        """Count one feedback not learned; with its ``feedback_id``, once (False: counted before, nothing done)."""
        pk, expires = _pk(app, _day(at)), str(math.ceil(at) + self._ttl_s)
        update = {
            "TableName": self._table,
            "Key": {"pk": {"S": pk}, "sk": {"S": SKIPPED_SK}},
            "UpdateExpression": "ADD #o :one SET expires_at = if_not_exists(expires_at, :e)",
            "ExpressionAttributeNames": {"#o": outcome},
            "ExpressionAttributeValues": {":one": {"N": "1"}, ":e": {"N": expires}},
        }
        if feedback_id is None:
            with aws_call("dynamodb.UpdateItem(feedback log)"):
                self._client.update_item(**update)
            return True
        marker = {
            "TableName": self._table,
            "Item": {"pk": {"S": pk}, "sk": {"S": f"{SKIPPED_SK}#{feedback_id}"}, "expires_at": {"N": expires}},
            "ConditionExpression": "attribute_not_exists(pk)",
        }
        with aws_call("dynamodb.TransactWriteItems(feedback log)"):
            try:
                self._client.transact_write_items(TransactItems=[{"Put": marker}, {"Update": update}])
            except ClientError as e:
                if cancellation_codes(e)[:1] == ["ConditionalCheckFailed"]:
                    return False  # its marker is there: counted by an earlier delivery
                raise
        return True

    def skipped(self, app: str, since: float, until: float) -> dict[str, int]:
        """The feedback of ``app`` not learned, by outcome, on the UTC days [since, until] touches (whole days: the
        counts are kept per day)."""
        out: dict[str, int] = {}
        for day in _days_newest_first(since, until):
            key = {"pk": {"S": _pk(app, day)}, "sk": {"S": SKIPPED_SK}}
            with aws_call("dynamodb.GetItem(feedback log)"):
                item = self._client.get_item(TableName=self._table, Key=key).get("Item") or {}
            for name, value in item.items():
                if name not in ("pk", "sk", "expires_at") and "N" in value:
                    out[name] = out.get(name, 0) + int(value["N"])
        return dict(sorted(out.items()))

    def entries(self, app: str, since: float, until: float, limit: int) -> tuple[list[FeedbackEntry], bool]:
        """The entries of ``app`` applied in [since, until], oldest first: the newest ``limit`` of them, and
        whether older ones in the range were left out."""
        newest_first: list[FeedbackEntry] = []
        for day in _days_newest_first(since, until):
            for item in self._day_items(app, day, since, until):
                if len(newest_first) == limit:
                    return newest_first[::-1], True
                newest_first.append(FeedbackEntry.from_dict(json.loads(item["entry"]["S"])))
        return newest_first[::-1], False

    def _day_items(self, app: str, day: str, since: float, until: float) -> Any:
        request: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :lo AND :hi",
            "ExpressionAttributeValues": {
                ":pk": {"S": _pk(app, day)},
                ":lo": {"S": _sk(since)},
                ":hi": {"S": _sk(until) + "~"},  # "~" sorts after "#<id>": the last millisecond is included
            },
            "ScanIndexForward": False,
        }
        while True:
            with aws_call("dynamodb.Query(feedback log)"):
                resp = self._client.query(**request)
            yield from resp.get("Items", [])
            if "LastEvaluatedKey" not in resp:
                return
            request["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
