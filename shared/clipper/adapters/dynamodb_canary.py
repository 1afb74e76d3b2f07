"""A canary trial's evidence (``clipper.canary.evidence``) in the registry table, as atomic counters.

Items (``pk``, ``sk``):
    MODEL#<model>          EVIDENCE#<trial>#<version>   the counters of one version in one trial: feedback,
                                                        loss_sum, queries, errors, slo_misses (N, added with
                                                        ``ADD``), version (S)
    CANARY#<model>#<trial> FEEDBACK#<token>             marks a feedback counted in the trial (``add_once``);
                                                        ``expires_at`` 15 days later (the table's TTL attribute);
                                                        in ``marker_table`` when given (the feedback functions
                                                        give the selection table)

The markers, one per feedback to a model with a canary, go to the selection table beside the bandit states'
own markers: in the registry, every scan of it (the canary reviewer's each minute, ``get_all_models``,
``get_state``) read and was billed for all of them, over a million at one feedback a second.

Every writer adds with one ``UpdateItem ... ADD``: many frontends and feedback workers add at once and no count
is lost, in any order. ``add_once`` adds a feedback's loss and its marker in one transaction, the marker
conditional on its absence: a redelivered feedback message finds its marker and counts nothing. The markers
live in their own partition, not under ``MODEL#<model>``, so reading a model's record never reads them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from decimal import Decimal, localcontext
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from clipper.adapters.aws_errors import aws_call, cancellation_codes, translate
from clipper.adapters.dynamodb_selection import MARKER_TTL_S as SELECTION_MARKER_TTL_S
from clipper.canary.evidence import VersionEvidence
from clipper.errors import Conflict

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
else:
    DynamoDBClient = Any

# A marker (this feedback id was counted) outlives the feedback message: a message lives at most 14 days (the
# dead-letter queue keeps it that long from its first enqueue; template.yaml), so a message redriven from there
# is still recognised (with 24 h it was applied again)
MARKER_TTL_S = SELECTION_MARKER_TTL_S  # the bandit states' markers', beside which these live (15 days)
_FIELDS = ("feedback", "loss_sum", "queries", "errors", "slo_misses")


# DynamoDB keeps a number in 38 significant digits and refuses one under 1e-130 in magnitude, and ADD sums exactly:
# a loss's full repr (1.2345678901234567e-25) added to a sum of 0.73 needs 42 digits and was refused, so the
# feedback was retried until its dead-letter queue and never counted (found by a review). Losses are sent in steps
# of 1e-9 (a smaller one counts as 0), so sums below 1e29 always fit.
LOSS_STEP = Decimal("1e-9")


def _number(value: float, step: Decimal | None = None) -> str:
    """A DynamoDB number: the float's shortest decimal, in plain notation (no exponent), rounded to ``step`` when
    given (values of 1e20 and more are whole numbers already, to a float's precision)."""
    d = Decimal(repr(value))
    if step is not None and d.adjusted() < 20:
        with localcontext() as ctx:
            ctx.prec = 60
            d = d.quantize(step)
    return format(d, "f")


def _numbers(values: dict[str, Any]) -> dict[str, str]:
    """The counters to add, as DynamoDB numbers: the loss sum in ``LOSS_STEP``s, those that come to 0 left out."""
    out = {f: _number(values[f], LOSS_STEP if f == "loss_sum" else None) for f in _FIELDS if values[f]}
    return {f: n for f, n in out.items() if Decimal(n) != 0}


def _prefix(trial: str) -> str:
    return f"EVIDENCE#{trial}#"


class DynamoDBCanaryEvidence:
    def __init__(
        self,
        client: DynamoDBClient,
        table: str,
        marker_ttl_s: int = MARKER_TTL_S,
        marker_table: str | None = None,
        conflict_retries: int = 8,
        backoff_s: float = 0.01,
        max_backoff_s: float = 0.25,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._table = table
        self._marker_table = marker_table or table
        self._marker_ttl_s = marker_ttl_s
        self._conflict_retries = conflict_retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._rng = rng or random.Random()

    def _update(self, model: str, trial: str, version: str, delta: VersionEvidence) -> dict[str, Any]:
        numbers = _numbers(delta.to_dict())
        adds = ", ".join(f"{f} :{f}" for f in numbers)
        expression = "SET version = :version" + (f" ADD {adds}" if adds else "")
        return {
            "TableName": self._table,
            "Key": {"pk": {"S": f"MODEL#{model}"}, "sk": {"S": _prefix(trial) + version}},
            "UpdateExpression": expression,
            "ExpressionAttributeValues": {":version": {"S": version}} | {f":{f}": {"N": n} for f, n in numbers.items()},
        }

    def add(self, model: str, trial: str, version: str, delta: VersionEvidence) -> None:
        if delta == VersionEvidence():
            return
        with aws_call("dynamodb.UpdateItem(canary evidence)"):
            self._client.update_item(**self._update(model, trial, version, delta))

    def add_once(self, model: str, trial: str, version: str, delta: VersionEvidence, token: str) -> bool:
        """Add ``delta`` unless ``token`` (a feedback id) was counted in this trial of this model before: True
        when this call added it. The counters and the marker are one transaction."""
        marker = {
            "TableName": self._marker_table,
            "Item": {
                "pk": {"S": f"CANARY#{model}#{trial}"},
                "sk": {"S": f"FEEDBACK#{token}"},
                "expires_at": {"N": str(int(time.time()) + self._marker_ttl_s)},
            },
            "ConditionExpression": "attribute_not_exists(pk)",
        }
        items: list[Any] = [{"Put": marker}, {"Update": self._update(model, trial, version, delta)}]
        last: Exception | None = None
        for attempt in range(self._conflict_retries + 1):
            if attempt:
                self._sleep(self._rng.uniform(0.0, min(self._max_backoff_s, self._backoff_s * 2 ** (attempt - 1))))
            try:
                self._client.transact_write_items(TransactItems=items)
                return True
            except ClientError as e:
                codes = cancellation_codes(e)
                if codes and codes[0] == "ConditionalCheckFailed":
                    return False  # counted before: a redelivered message
                if "TransactionConflict" not in codes:
                    raise translate(e, "dynamodb.TransactWriteItems(canary evidence)") from e
                last = e  # another writer on the same counters at that instant: nothing was written, send again
            except BotoCoreError as e:
                raise translate(e, "dynamodb.TransactWriteItems(canary evidence)") from e
        raise Conflict(f"canary evidence {model} {trial}: transactions kept conflicting") from last

    def load(self, model: str, trial: str) -> dict[str, VersionEvidence]:
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": {":pk": {"S": f"MODEL#{model}"}, ":prefix": {"S": _prefix(trial)}},
            "ConsistentRead": True,
        }
        evidence: dict[str, VersionEvidence] = {}
        while True:
            with aws_call("dynamodb.Query(canary evidence)"):
                resp = self._client.query(**kwargs)
            for item in resp.get("Items", []):
                version = item["version"]["S"]
                evidence[version] = VersionEvidence.from_dict({f: item[f]["N"] for f in _FIELDS if f in item})
            if "LastEvaluatedKey" not in resp:
                return evidence
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
