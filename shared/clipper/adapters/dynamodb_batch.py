"""Conditional writes of many items in few round trips: DynamoDB's BatchWriteItem takes no conditions, so the
items go as ``TransactWriteItems`` of up to 100 puts. A transaction is all or nothing: when one condition fails
it is cancelled with a reason per item, and the items whose own condition held are tried again without the
failed ones (a cancelled transaction wrote nothing), so the result is the same as one conditional put per item,
in one call when every condition holds and two when some fail."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from clipper.adapters.aws_errors import error_code, translate
from clipper.errors import Unavailable

MAX_ITEMS = 100  # DynamoDB's limit of one transaction
MAX_BYTES = 3_500_000  # under DynamoDB's 4 MB of one transaction (a batch of 100 replies of 40 KB each is over)


def conditional_puts(
    client: Any, puts: Sequence[dict[str, Any]], key_of: Callable[[dict[str, Any]], Any], what: str, attempts: int = 4
) -> list[bool]:
    """Apply each ``Put`` (``TableName``, ``Item``, ``ConditionExpression``, ...); for each, whether it was
    written (False: its condition failed). Puts of the same item go in separate transactions, in order."""
    return conditional_writes(client, [("Put", p) for p in puts], lambda a: key_of(a[1]), what, attempts)


def conditional_writes(
    client: Any,
    actions: Sequence[tuple[str, dict[str, Any]]],
    key_of: Callable[[tuple[str, dict[str, Any]]], Any],
    what: str,
    attempts: int = 4,
) -> list[bool]:
    """``conditional_puts`` for ``("Put", spec)`` and ``("Update", spec)`` actions (specs as ``put_item`` /
    ``update_item`` take them)."""
    puts = actions
    results: list[bool | None] = [None] * len(puts)
    rounds: list[list[int]] = []
    seen: dict[Any, int] = {}
    for i, put in enumerate(puts):  # the n-th put of an item goes in round n
        n = seen.get(key_of(put), 0)
        seen[key_of(put)] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(i)
    for round_ in rounds:
        for chunk in _chunks(round_, [_size(puts[i][1]) for i in round_]):
            _transact(client, puts, chunk, results, what, attempts)
    return [bool(r) for r in results]


def _size(spec: dict[str, Any]) -> int:
    """An item's size, roughly as DynamoDB counts it (its strings' lengths, and a little for the rest)."""
    total, todo = 0, [spec.get("Item") or spec.get("ExpressionAttributeValues") or {}]
    while todo:
        value = todo.pop()
        if isinstance(value, dict):
            todo.extend(value.values())
            total += 8 * len(value)
        elif isinstance(value, str):
            total += len(value.encode("utf-8", "surrogatepass"))  # DynamoDB counts UTF-8 bytes
    return total


def _chunks(indices: list[int], sizes: list[int]) -> list[list[int]]:
    """``indices`` in transactions of at most MAX_ITEMS items and MAX_BYTES (an item alone may be larger)."""
    chunks: list[list[int]] = [[]]
    held = 0
    for i, size in zip(indices, sizes, strict=True):
        if chunks[-1] and (len(chunks[-1]) >= MAX_ITEMS or held + size > MAX_BYTES):
            chunks.append([])
            held = 0
        chunks[-1].append(i)
        held += size
    return [c for c in chunks if c]


def _transact(
    client: Any,
    puts: Sequence[tuple[str, dict[str, Any]]],
    pending: list[int],
    results: list[bool | None],
    what: str,
    attempts: int,
) -> None:
    for attempt in range(attempts):
        if not pending:
            return
        try:
            if len(pending) == 1:  # one item: a plain conditional write (half the cost of a transaction)
                kind, spec = puts[pending[0]]
                (client.put_item if kind == "Put" else client.update_item)(**spec)
            else:
                client.transact_write_items(TransactItems=[{puts[i][0]: puts[i][1]} for i in pending])
            for i in pending:
                results[i] = True
            return
        except ClientError as e:
            code = error_code(e)
            if code == "ConditionalCheckFailedException":
                results[pending[0]] = False
                return
            if code == "TransactionConflictException":  # one item, in another caller's transaction: botocore does
                if attempt < attempts - 1:  # not retry it; back off and try again, as for a cancelled one
                    time.sleep(0.005 * 2**attempt)
                continue
            if code != "TransactionCanceledException":
                raise translate(e, what) from e
            reasons = e.response.get("CancellationReasons") or []
            if len(reasons) != len(pending):
                raise translate(e, what) from e
            retry = []
            for i, reason in zip(pending, reasons, strict=True):
                if reason.get("Code") == "ConditionalCheckFailed":
                    results[i] = False
                else:  # "None" (cancelled because of another item), a conflict or throttling: try again
                    retry.append(i)
            if any(r.get("Code") not in ("ConditionalCheckFailed", "None") for r in reasons):
                time.sleep(0.005 * 2**attempt)  # a conflicting transaction or throttling: back off a little
            pending = retry
        except BotoCoreError as e:
            raise translate(e, what) from e
    if pending:
        raise Unavailable(f"{what}: transaction cancelled {attempts} times")
