"""Reply channel over DynamoDB, for stacks without Redis: the batcher writes one item per
(query, model) with a TTL, the frontend polls with consistent reads until the deadline.

A reply address is a UUID (122 random bits), so two queries never share one; DynamoDB deletes expired items
lazily (up to days late), so the wait also skips items past their ``expires_at``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from clipper.adapters.aws_errors import aws_call
from clipper.adapters.dynamodb_batch import conditional_puts
from clipper.core.messages import Reply
from clipper.core.polling import poll_gap

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
else:
    DynamoDBClient = Any


# DynamoDB's item limit is 400 KB (names and values); a reply over this is answered as an error instead, so the
# other replies of its batch (one transaction) are written: one too large made the whole transaction fail, and
# every redelivery of the batch again, until the messages were dead-lettered and every query timed out.
MAX_REPLY_BYTES = 380 * 1024


class DynamoDBReplyChannel:
    def __init__(self, client: DynamoDBClient, table: str, ttl_s: int = 300, poll_interval_s: float = 0.01) -> None:
        self._client = client
        self._table = table
        self._ttl = ttl_s
        self._poll = poll_interval_s

    def _put(self, reply_to: str, reply: Reply) -> dict[str, Any]:
        """The conditional put of one reply: a success replaces an earlier error reply but never another
        success; an error never replaces anything."""
        text = reply.to_json()
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_REPLY_BYTES:
            reply = Reply(
                query_id=reply.query_id,
                model=reply.model,
                version=reply.version,
                error=f"a reply of {size:,} bytes: over DynamoDB's item limit (400 KB); send fewer inputs a query",
                error_kind="endpoint",
            )
            text = reply.to_json()
        put: dict[str, Any] = {
            "TableName": self._table,
            "Item": {
                "query_id": {"S": reply_to},
                "model": {"S": reply.model},
                "ok": {"BOOL": reply.ok},
                "reply": {"S": text},
                "expires_at": {"N": str(int(time.time()) + self._ttl)},
            },
            "ConditionExpression": "attribute_not_exists(query_id)",
        }
        if reply.ok:
            put["ConditionExpression"] += " OR ok = :false"
            put["ExpressionAttributeValues"] = {":false": {"BOOL": False}}
        return put

    def publish(self, reply_to: str, reply: Reply) -> bool:
        return self.publish_many([(reply_to, reply)])[0]

    def publish_many(self, replies: Sequence[tuple[str, Reply]]) -> list[bool]:
        """The replies of a batch as transactions of up to 100 conditional puts (``dynamodb_batch``): one call
        for a batch whose replies are all new."""
        puts = [self._put(reply_to, reply) for reply_to, reply in replies]
        return conditional_puts(
            self._client, puts, lambda p: (p["Item"]["query_id"]["S"], p["Item"]["model"]["S"]), "dynamodb(replies)"
        )

    def answered_many(self, keys: Sequence[tuple[str, str]]) -> list[bool]:
        """Consistent BatchGetItem reads, 100 keys a call."""
        found: set[tuple[str, str]] = set()
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 100):
            request: dict[str, Any] = {
                self._table: {
                    "Keys": [{"query_id": {"S": q}, "model": {"S": m}} for q, m in unique[start : start + 100]],
                    "ConsistentRead": True,
                    "ProjectionExpression": "query_id, #m, ok",
                    "ExpressionAttributeNames": {"#m": "model"},
                }
            }
            while request:
                with aws_call("dynamodb.BatchGetItem(replies)"):
                    resp = self._client.batch_get_item(RequestItems=request)
                for item in resp.get("Responses", {}).get(self._table, []):
                    if item.get("ok", {}).get("BOOL", False):
                        found.add((item["query_id"]["S"], item["model"]["S"]))
                request = resp.get("UnprocessedKeys") or {}
        return [key in found for key in keys]

    def answered(self, reply_to: str, model: str) -> bool:
        with aws_call("dynamodb.GetItem(replies)"):
            resp = self._client.get_item(
                TableName=self._table,
                Key={"query_id": {"S": reply_to}, "model": {"S": model}},
                ConsistentRead=True,
                ProjectionExpression="ok",
            )
        return bool(resp.get("Item", {}).get("ok", {}).get("BOOL", False))

    def new_address(self) -> str:
        return uuid.uuid4().hex

    def expect(self, reply_to: str) -> None:
        """Nothing to prepare: the replies wait in the table."""

    def forget(self, reply_to: str) -> None:
        """Nothing held: the replies expire in the table."""

    async def wait_async(self, reply_to: str, models: Collection[str], timeout_s: float) -> list[Reply]:
        """``wait`` on a worker thread (each poll is a blocking DynamoDB read)."""
        import asyncio

        return await asyncio.to_thread(self.wait, reply_to, models, timeout_s)

    def wait(self, reply_to: str, models: Collection[str], timeout_s: float) -> list[Reply]:
        """Polls until every model replied or the timeout, at ``clipper.core.polling``'s pace; a poll that could not
        end before the timeout (as long as the last one took) is not started."""
        begun = time.monotonic()
        end = begun + timeout_s
        wanted = set(models)
        took = 0.0
        while True:
            started = time.monotonic()
            with aws_call("dynamodb.Query(replies)"):
                resp = self._client.query(
                    TableName=self._table,
                    KeyConditionExpression="query_id = :q",
                    ExpressionAttributeValues={":q": {"S": reply_to}},
                    ConsistentRead=True,
                )
            now = time.monotonic()
            took = now - started
            epoch = int(time.time())
            replies = [
                Reply.from_json(i["reply"]["S"])
                for i in resp.get("Items", [])
                if int(i.get("expires_at", {}).get("N", "0")) >= epoch
            ]
            remaining = end - now
            if wanted <= {r.model for r in replies} or remaining <= took:
                return replies
            time.sleep(min(poll_gap(self._poll, now - begun), max(0.0, remaining - took)))
