from __future__ import annotations

import base64

import numpy as np
import pytest

from clipper.core.domain import InputType
from clipper.core.validation import validate_query
from clipper.errors import InvalidInput
from tests.fakes import digits_app

pytestmark = pytest.mark.unit


def test_single_float_input_is_reshaped_and_cast():
    q = validate_query(digits_app(), {"input": list(range(64))})
    assert not q.batch and q.count == 1
    assert q.rows.dtype == np.float32 and q.rows.shape == (1, 64)


def test_batch_keeps_order():
    batch = [[float(i)] * 64 for i in range(5)]
    q = validate_query(digits_app(), {"input_batch": batch})
    assert q.batch and q.count == 5
    assert q.rows[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_nested_input_matching_shape_is_accepted():
    app = digits_app(input_shape=(2, 3))
    q = validate_query(app, {"input": [[1, 2, 3], [4, 5, 6]]})
    assert q.rows.shape == (1, 2, 3)


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"input": [1.0] * 63}, "input", "shape [64]"),
        ({"input": [1.0] * 65}, "input", "shape [64]"),
        ({"input": "abc"}, "input", "list of finite floats"),
        ({"input": [1.0] * 63 + ["x"]}, "input", "non-numeric"),
        ({"input": [1.0] * 63 + [True]}, "input", "non-numeric"),
        ({"input": [1.0] * 63 + [float("nan")]}, "input", "NaN"),
        ({"input": [1.0] * 63 + [float("inf")]}, "input", "NaN"),
        ({"input": [1.0] * 63 + [1e300]}, "input", "within +-3.403e+38 (float32), got a value out of that range"),
        ({"input": [1.0] * 63 + [-1e39]}, "input", "within +-3.403e+38 (float32), got a value out of that range"),
        # an integer past float64 (a 400-digit one) was "non-numeric values"
        ({"input": [1.0] * 63 + [10**400]}, "input", "within +-3.403e+38 (float32), got a value out of that range"),
        ({"input": [1.0] * 63 + [-(10**400)]}, "input", "within +-3.403e+38 (float32), got a value out of that range"),
        ({"input": [1] * 63 + [10**39]}, "input", "within +-3.403e+38 (float32), got a value out of that range"),
        ({"input": [[1.0], [1.0, 2.0]]}, "input", "regular shape"),
        ({"input_batch": []}, "input_batch", "at least one input"),
        ({"input_batch": "x"}, "input_batch", "a list of inputs"),
        ({"input_batch": [[1.0] * 64, [1.0] * 3]}, "input_batch[1]", "shape [64]"),
        ({}, "body", "exactly one of"),
        ({"input": [1.0] * 64, "input_batch": [[1.0] * 64]}, "body", "exactly one of"),
        ([1, 2], "body", "JSON object"),
    ],
)
def test_bad_input_names_field_and_expectation(body, field, words):
    with pytest.raises(InvalidInput) as e:
        validate_query(digits_app(), body)
    assert e.value.field == field
    assert words in str(e.value)


def test_batch_limit():
    with pytest.raises(InvalidInput, match="at most 3 inputs"):
        validate_query(digits_app(), {"input_batch": [[0.0] * 64] * 4}, max_batch=3)


def test_integers_reject_fractions_and_overflow():
    app = digits_app(input_type=InputType.INTEGERS, input_shape=None)
    assert validate_query(app, {"input": [1, 2, 3]}).rows.dtype == np.int32
    with pytest.raises(InvalidInput, match="non-integer"):
        validate_query(app, {"input": [1.5, 2]})
    with pytest.raises(InvalidInput, match="32-bit"):
        validate_query(app, {"input": [2**40]})
    # past int64 (alone: numpy objects; beside others: floats) is out of range too, not "non-integer"
    for huge in ([10**23, 2], [2**63, 1]):
        with pytest.raises(InvalidInput, match="32-bit"):
            validate_query(app, {"input": huge})
    import orjson

    parsed = orjson.loads(b'{"input": [18446744073709551616, 2]}')  # the query API's parser: past 64 bits, a float
    with pytest.raises(InvalidInput, match="32-bit"):
        validate_query(app, parsed)
    with pytest.raises(InvalidInput, match="non-empty list of values, got an empty list"):  # as the floats say
        validate_query(app, {"input": []})


def test_unshaped_numeric_requires_flat_non_empty_and_equal_lengths_in_a_batch():
    app = digits_app(input_type=InputType.DOUBLES, input_shape=None)
    assert validate_query(app, {"input": [1.0, 2.0]}).rows.dtype == np.float64
    with pytest.raises(InvalidInput, match="non-empty"):
        validate_query(app, {"input": []})
    with pytest.raises(InvalidInput, match="flat list"):
        validate_query(app, {"input": [[1.0]]})
    with pytest.raises(InvalidInput) as e:
        validate_query(app, {"input_batch": [[1.0, 2.0], [1.0]]})
    assert e.value.field == "input_batch[1]"


def test_strings_and_bytes():
    s_app = digits_app(input_type=InputType.STRINGS, input_shape=None)
    assert validate_query(s_app, {"input_batch": ["a", "bc"]}).rows == ["a", "bc"]
    with pytest.raises(InvalidInput, match="a string"):
        validate_query(s_app, {"input": [1]})
    b_app = digits_app(input_type=InputType.BYTES, input_shape=None)
    data = base64.b64encode(b"\x00\x01").decode()
    assert validate_query(b_app, {"input": data}).rows == [b"\x00\x01"]
    with pytest.raises(InvalidInput, match="base64"):
        validate_query(b_app, {"input": "not base64!"})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"input": [1.0, 2.5e-06, -3]}', False),
        (b'{"input": [[1, 2], [3, 4]], "user_id": "ann"}', False),  # the letters before the first "[" do not count
        (b'{"input": [1.0, true]}', True),
        (b'{"input_batch": [[1.0], [false]]}', True),
        (b'{"input": [1.0], "user_id": "fred"}', True),  # a false alarm only costs the search of the parsed lists
        (b'{"input": [1.0, Infinity]}', True),
        (b'{"input": 3}', False),  # no array: validation rejects the value itself
    ],
)
def test_the_raw_text_says_whether_an_array_can_hold_a_boolean(raw, expected):
    from clipper.core.validation import may_hold_booleans

    assert may_hold_booleans(raw) is expected


def test_a_body_seen_without_booleans_is_not_searched_for_them(monkeypatch):
    """The search of the parsed lists is skipped when the caller saw none in the raw text, and only then."""
    from clipper.core import validation

    searched = []
    monkeypatch.setattr(validation, "_has_bool", lambda value: searched.append(1) or False)
    body = {"input": [0.5] * 64}
    validate_query(digits_app(), body, booleans=False)
    assert searched == []
    validate_query(digits_app(), body)
    assert searched == [1]


def test_a_float_input_takes_an_integer_past_64_bits_within_its_range():
    """numpy holds an integer past 64 bits as an object: a float input with 2**70 in it was "non-numeric"."""
    q = validate_query(digits_app(), {"input": [1.5] * 63 + [2**70]})
    assert q.rows.dtype == np.float32 and q.rows[0, -1] == np.float32(2**70)
