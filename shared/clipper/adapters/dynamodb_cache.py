"""The prediction cache in DynamoDB, for stacks without Redis: one item per key with a TTL attribute
(DynamoDB deletes expired items lazily, so reads also check ``expires_at``). A claim is an item without an
output whose ``claimed_until`` is ahead and whose ``owner`` is its query's token; a failure adds ``failed``
(the cause); a release sets ``claimed_until`` to 0. Only the owner's conditional writes end its claim."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from clipper.adapters.aws_errors import aws_call
from clipper.adapters.dynamodb_batch import conditional_puts, conditional_writes

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
else:
    DynamoDBClient = Any


logger = logging.getLogger(__name__)

MAX_OUTPUT_BYTES = 380 * 1024  # under DynamoDB's 400 KB item limit (the key and attributes take the rest)


class DynamoDBPredictionCache:
    def __init__(self, client: DynamoDBClient, table: str, ttl_s: int = 3600) -> None:
        self._client = client
        self._table = table
        self._ttl = ttl_s

    def get_many(self, keys: list[str], timeout: float | None = None) -> dict[str, Any]:
        return self.poll(keys)[0]

    def lookup(
        self, keys: list[str], claim_ttl_s: float, timeout: float | None = None, owner: str = "1"
    ) -> tuple[dict[str, Any], set[str]]:
        """A BatchGetItem, then one transaction of claims for the misses (two calls: DynamoDB has no read-then-
        conditional-write in one). ``timeout`` is the client's own (its read timeout and retries)."""
        hits = self.get_many(keys)
        misses = [k for k in dict.fromkeys(keys) if k not in hits]
        return hits, self.claim(misses, claim_ttl_s, owner=owner) if misses else set()

    def poll(self, keys: list[str], timeout: float | None = None) -> tuple[dict[str, Any], dict[str, str]]:
        out, failed, _ = self._read(keys)
        return out, failed

    def poll_or_claim(
        self, keys: list[str], claim_ttl_s: float, owner: str, timeout: float | None = None
    ) -> tuple[dict[str, Any], dict[str, str], set[str]]:
        """``poll``, then the claims of the keys no live claim holds (conditional puts: a concurrent claimer
        wins or loses as in ``claim``)."""
        out, failed, held = self._read(keys)
        free = [k for k in dict.fromkeys(keys) if k not in out and k not in failed and k not in held]
        return out, failed, self.claim(free, claim_ttl_s, owner=owner) if free else set()

    def _read(self, keys: list[str]) -> tuple[dict[str, Any], dict[str, str], set[str]]:
        """Outputs, failures, and the keys under a live claim."""
        out: dict[str, Any] = {}
        failed: dict[str, str] = {}
        held: set[str] = set()
        now = time.time()
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 100):
            request: dict[str, Any] = {self._table: {"Keys": [{"key": {"S": k}} for k in unique[start : start + 100]]}}
            while request:
                with aws_call("dynamodb.BatchGetItem(cache)"):
                    resp = self._client.batch_get_item(RequestItems=request)
                for item in resp.get("Responses", {}).get(self._table, []):
                    if int(item.get("expires_at", {}).get("N", "0")) <= int(now):
                        continue
                    key = item["key"]["S"]
                    if "output" in item:
                        out[key] = json.loads(item["output"]["S"])
                    elif float(item.get("claimed_until", {}).get("N", "0")) > now:
                        if "failed" in item:
                            failed[key] = item["failed"]["S"]
                        else:
                            held.add(key)
                request = resp.get("UnprocessedKeys") or {}
        return out, failed, held

    def fail_many(self, failures: dict[str, str], ttl_s: float, timeout: float | None = None, *, owner: str) -> None:
        """Each failed claim ``owner`` still holds keeps its cause until ``ttl_s`` from now (an entry already filled
        is kept); up to 100 a transaction."""
        now = time.time()
        values = {":u": {"N": f"{now + ttl_s:.3f}"}, ":e": {"N": str(int(now + ttl_s) + 1)}}
        update = "SET failed = :c, claimed_until = :u, expires_at = :e"
        updates = [self._end_claim(k, update, {**values, ":c": {"S": c}}, owner) for k, c in failures.items()]
        conditional_writes(self._client, updates, lambda a: a[1]["Key"]["key"]["S"], "dynamodb(cache claims)")

    def release(self, keys: list[str], owner: str, timeout: float | None = None) -> None:
        """The claims ``owner`` still holds pass (``claimed_until`` 0): a claimer takes the key at once."""
        updates = [self._end_claim(k, "SET claimed_until = :z", {":z": {"N": "0"}}, owner) for k in dict.fromkeys(keys)]
        if updates:
            conditional_writes(self._client, updates, lambda a: a[1]["Key"]["key"]["S"], "dynamodb(cache claims)")

    def _end_claim(self, key: str, update: str, values: dict[str, Any], owner: str) -> tuple[str, dict[str, Any]]:
        """An update of a claim the owner still holds: never of a filled entry, nor of an expired claim (the key is
        free then, as Redis's expired key is gone)."""
        spec = {
            "TableName": self._table,
            "Key": {"key": {"S": key}},
            "UpdateExpression": update,
            "ConditionExpression": "attribute_not_exists(#o) AND #w = :w AND claimed_until > :now",
            "ExpressionAttributeNames": {"#o": "output", "#w": "owner"},
            "ExpressionAttributeValues": {**values, ":w": {"S": owner}, ":now": {"N": f"{time.time():.3f}"}},
        }
        return ("Update", spec)

    def put_many(self, entries: dict[str, Any], timeout: float | None = None) -> None:
        """Cache the outputs; one whose JSON is over DynamoDB's item limit is not cached (it failed the whole
        BatchWriteItem, so none of the batch's outputs were)."""
        expires = str(int(time.time()) + self._ttl)
        items = [
            {"PutRequest": {"Item": {"key": {"S": k}, "output": {"S": t}, "expires_at": {"N": expires}}}}
            for k, t in _storable(entries).items()
        ]
        for start in range(0, len(items), 25):
            request: dict[str, Any] = {self._table: items[start : start + 25]}
            while request:
                with aws_call("dynamodb.BatchWriteItem(cache)"):
                    resp = self._client.batch_write_item(RequestItems=request)
                request = resp.get("UnprocessedItems") or {}

    def put_new(self, entries: dict[str, Any], timeout: float | None = None) -> None:
        """Conditional puts (an item absent or expired as a read sees it); none over the item limit."""
        now = int(time.time())
        expires = str(now + self._ttl)
        puts = [
            {
                "TableName": self._table,
                "Item": {"key": {"S": k}, "output": {"S": t}, "expires_at": {"N": expires}},
                "ConditionExpression": "attribute_not_exists(#k) OR expires_at <= :sec",
                "ExpressionAttributeNames": {"#k": "key"},
                "ExpressionAttributeValues": {":sec": {"N": str(now)}},
            }
            for k, t in _storable(entries).items()
        ]
        if puts:
            conditional_puts(self._client, puts, lambda p: p["Item"]["key"]["S"], "dynamodb(cache records)")

    def claim(self, keys: list[str], ttl_s: float, timeout: float | None = None, owner: str = "1") -> set[str]:
        """Conditional puts of up to 100 claims a transaction (``dynamodb_batch``): one call when no key is
        claimed already, two when some are."""
        now = time.time()
        unique = list(dict.fromkeys(keys))
        puts = [
            {
                "TableName": self._table,
                "Item": {
                    "key": {"S": k},
                    "owner": {"S": owner},
                    "claimed_until": {"N": f"{now + ttl_s:.3f}"},
                    "expires_at": {"N": str(int(now + ttl_s) + 1)},
                },
                # free, or an expired entry (as a read sees it: expires_at <= now), or a claim whose owner gave up
                "ConditionExpression": "attribute_not_exists(#k) OR expires_at <= :sec"
                " OR (attribute_not_exists(#o) AND claimed_until < :now)",
                "ExpressionAttributeNames": {"#k": "key", "#o": "output"},
                "ExpressionAttributeValues": {":now": {"N": f"{now:.3f}"}, ":sec": {"N": str(int(now))}},
            }
            for k in unique
        ]
        written = conditional_puts(self._client, puts, lambda p: p["Item"]["key"]["S"], "dynamodb(cache claims)")
        return {k for k, ok in zip(unique, written, strict=True) if ok}


def _storable(entries: dict[str, Any]) -> dict[str, str]:
    """The entries' JSON texts that fit one item; those over DynamoDB's item limit are left out, and logged."""
    texts = {k: json.dumps(v) for k, v in entries.items()}
    fitting = {k: t for k, t in texts.items() if len(t.encode()) <= MAX_OUTPUT_BYTES}
    if len(fitting) < len(texts):
        logger.warning("%d output(s) over DynamoDB's item limit not cached", len(texts) - len(fitting))
    return fitting
