from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clipper.canary import CanaryEvidence, VersionEvidence

pytestmark = pytest.mark.unit

counts = st.integers(min_value=0, max_value=10**9)


@st.composite
def versions(draw: st.DrawFn) -> VersionEvidence:
    feedback = draw(counts)
    loss_sum = draw(st.floats(min_value=0.0, max_value=float(feedback), allow_nan=False))
    return VersionEvidence(feedback, loss_sum, draw(counts), draw(counts), draw(counts))


pairs = st.builds(CanaryEvidence, versions(), versions())


def as_dynamodb(value):
    """What a DynamoDB round trip gives back: every number a Decimal of its text (boto3 wants Decimals)."""
    if isinstance(value, dict):
        return {k: as_dynamodb(v) for k, v in value.items()}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Decimal(str(value))
    return value


def test_evidence_adds_up_field_by_field():
    a = VersionEvidence(feedback=3, loss_sum=1.0, queries=10, errors=1, slo_misses=2)
    b = VersionEvidence.of_feedback(0.0, 1.0, 0.5) + VersionEvidence.of_query(error=True, slo_miss=True)

    assert a + b == VersionEvidence(feedback=6, loss_sum=2.5, queries=11, errors=2, slo_misses=3)
    assert (a + b).loss_rate == pytest.approx(2.5 / 6)
    assert VersionEvidence().loss_rate is None
    assert VersionEvidence().error_rate is None
    assert (a + b).error_rate == pytest.approx(2 / 11)
    assert (a + b).slo_miss_rate == pytest.approx(3 / 11)


def test_canary_evidence_adds_each_side_to_its_own():
    one = CanaryEvidence(current=VersionEvidence.of_query(), canary=VersionEvidence.of_feedback(1.0))
    two = CanaryEvidence(current=VersionEvidence.of_feedback(0.0), canary=VersionEvidence.of_query(error=True))

    merged = one + two

    assert merged.current == VersionEvidence(feedback=1, loss_sum=0.0, queries=1)
    assert merged.canary == VersionEvidence(feedback=1, loss_sum=1.0, queries=1, errors=1)


@given(versions(), versions(), versions())
def test_merging_is_commutative_and_associative(a, b, c):
    assert a + b == b + a
    left, right = (a + b) + c, a + (b + c)
    assert (left.feedback, left.queries, left.errors, left.slo_misses) == (
        right.feedback,
        right.queries,
        right.errors,
        right.slo_misses,
    )
    assert left.loss_sum == pytest.approx(right.loss_sum)


@given(pairs)
def test_round_trip_through_json_and_dynamodb_numbers(evidence):
    stored = evidence.to_dict()

    assert CanaryEvidence.from_dict(json.loads(json.dumps(stored))) == evidence
    assert CanaryEvidence.from_dict(as_dynamodb(stored)) == evidence
    for side in ("current", "canary"):
        assert {type(v) for k, v in stored[side].items() if k != "loss_sum"} == {int}
        assert type(stored[side]["loss_sum"]) is float


def test_a_fractional_loss_sum_round_trips_exactly():
    evidence = VersionEvidence.of_feedback(*([0.1] * 7), 1 / 3)

    back = VersionEvidence.from_dict(as_dynamodb(evidence.to_dict()))

    assert back.loss_sum == evidence.loss_sum
    assert back == evidence


def test_missing_fields_read_as_zero_and_strings_as_numbers():
    assert VersionEvidence.from_dict({}) == VersionEvidence()
    assert VersionEvidence.from_dict({"feedback": "4", "loss_sum": "1.5"}) == VersionEvidence(4, 1.5)


@pytest.mark.parametrize(
    "fields",
    [
        {"feedback": -1},
        {"queries": 1.0},
        {"errors": True},
        {"feedback": 2, "loss_sum": 2.5},
        {"feedback": 2, "loss_sum": -0.1},
        {"feedback": 2, "loss_sum": float("nan")},
        {"feedback": 2, "loss_sum": float("inf")},
    ],
)
def test_impossible_evidence_is_refused(fields):
    with pytest.raises(ValueError):
        VersionEvidence(**fields)


@pytest.mark.parametrize(
    "data",
    [
        {"schema": 2, "current": {}, "canary": {}},
        {"current": {}},
        {"current": {"feedback": 1.5}, "canary": {}},
        {"current": {"feedback": "many"}, "canary": {}},
        {"current": {"errors": [1]}, "canary": {}},
        {"current": {"feedback": 1, "loss_sum": Decimal("NaN")}, "canary": {}},
        {"current": {"feedback": Decimal("Infinity")}, "canary": {}},
    ],
)
def test_corrupt_records_raise_value_error(data):
    with pytest.raises(ValueError):
        CanaryEvidence.from_dict(data)


def test_a_loss_outside_zero_one_is_refused():
    with pytest.raises(ValueError):
        VersionEvidence.of_feedback(0.5, 1.5)
