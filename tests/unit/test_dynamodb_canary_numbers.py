"""A canary's loss_sum is kept with DynamoDB ``ADD``, which adds exactly in decimal and refuses (a
ValidationException) a number, or a sum, of more than 38 significant digits or under 1e-130 in magnitude. The
store sends each loss's full repr, so a small score loss added to a sum >= 1 cannot be stored: add_once raises
(Unavailable), the feedback message is retried until its dead-letter queue, and the canary never counts it."""

from __future__ import annotations

from decimal import Decimal, localcontext
from typing import Any

import pytest
from botocore.exceptions import ClientError

from clipper.adapters.dynamodb_canary import DynamoDBCanaryEvidence
from clipper.canary.decision import CanaryParams
from clipper.canary.evidence import VersionEvidence
from clipper.errors import InvalidInput

pytestmark = pytest.mark.unit


def _dynamodb_number(text: str) -> Decimal:
    """DynamoDB's rules for a number (HowItWorks.NamingRulesDataTypes): 38 significant digits, 1e-130..1e126."""
    d = Decimal(text).normalize()
    if d != 0:
        digits = len(d.as_tuple().digits)
        if digits > 38 or abs(d) < Decimal("1e-130") or abs(d) >= Decimal("1e126"):
            raise ClientError(
                {"Error": {"Code": "ValidationException", "Message": f"bad number {text}"}}, "TransactWriteItems"
            )
    return d


class ExactDynamo:
    """Just enough of DynamoDB for add_once: the marker Put and the counters' exact decimal ADD."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Decimal]] = {}

    def transact_write_items(self, TransactItems: list[dict[str, Any]]) -> None:
        update = TransactItems[1]["Update"]
        key = (update["Key"]["pk"]["S"], update["Key"]["sk"]["S"])
        item = dict(self.items.get(key, {}))
        adds = update["UpdateExpression"].split(" ADD ", 1)[1].split(", ")
        with localcontext() as ctx:
            ctx.prec = 400
            for clause in adds:
                name, value = clause.split(" ")
                delta = _dynamodb_number(update["ExpressionAttributeValues"][value]["N"])
                item[name] = _dynamodb_number(str(item.get(name, Decimal(0)) + delta))
        self.items[key] = item


@pytest.mark.parametrize("small_loss", [1.2345678901234567e-25, 1.0e-135])
def test_a_small_score_loss_can_be_added_to_a_trial(small_loss):
    store = DynamoDBCanaryEvidence(ExactDynamo(), "registry")
    assert store.add_once("m", "2@1", "2", VersionEvidence.of_feedback(0.7309812345678901), "f1")
    assert store.add_once("m", "2@1", "2", VersionEvidence.of_feedback(1.0), "f2")
    # a regression output within 1e-24 of its label (or a tiny-valued target without loss_scale)
    assert store.add_once("m", "2@1", "2", VersionEvidence.of_feedback(small_loss), "f3")
    (item,) = store._client.items.values()
    assert item["feedback"] == 3 and abs(float(item["loss_sum"]) - 1.7309812346) < 1e-9


def test_a_canary_parameter_the_registry_cannot_store_is_a_400_naming_it():
    """A margin of 1e-200 was accepted, then refused by DynamoDB when the canary was written: a 503."""
    for name in ("alpha", "beta", "guard_alpha", "margin"):
        with pytest.raises(InvalidInput) as e:
            CanaryParams(**{name: 1e-200})
        assert e.value.field == name
    assert CanaryParams(margin=1e-9, alpha=1e-9).margin == 1e-9
