"""The query client's request bodies: numbers as one input or a batch by the application's declared shape."""

from __future__ import annotations

import numpy as np

from clipper.client_query import batch, query_body, shaped


def test_without_a_declared_shape_a_flat_list_is_one_input_and_rows_are_a_batch():
    assert query_body(shaped([1.0, 2.0], None)) == {"input": [1.0, 2.0]}
    assert query_body(shaped([[1.0], [2.0]], None)) == {"input_batch": [[1.0], [2.0]]}
    assert query_body(shaped(np.zeros((3, 4)), None))["input_batch"] == [[0.0] * 4] * 3


def test_an_input_of_the_declared_shape_or_its_flat_values_is_one_input():
    grid = [[0, 1, 2], [3, 4, 5]]
    assert query_body(shaped(grid, [2, 3])) == {"input": grid}
    assert query_body(shaped(np.arange(6).reshape(2, 3), [2, 3])) == {"input": grid}
    assert query_body(shaped(list(range(6)), [2, 3])) == {"input": list(range(6))}


def test_one_more_leading_dimension_is_a_batch():
    grids = np.arange(12).reshape(2, 2, 3)
    assert query_body(shaped(grids, [2, 3])) == {"input_batch": grids.tolist()}
    flat_rows = np.arange(12).reshape(2, 6)
    assert query_body(shaped(flat_rows, [2, 3])) == {"input_batch": flat_rows.tolist()}
    assert shaped([[1.0] * 64, [2.0] * 64], [64]) == batch([[1.0] * 64, [2.0] * 64])


def test_what_is_not_numbers_or_matches_no_reading_is_sent_as_given():
    assert shaped([[1, 2], [3]], [2, 3]) == [[1, 2], [3]]  # ragged: the API names the field
    assert shaped(["a", "b"], None) == ["a", "b"]
    assert shaped([[1, 2]], [5]) == [[1, 2]]


def test_numpy_numbers_are_sent_as_json_numbers(monkeypatch):
    """``conn.update(app, X[i], y[i])``: a numpy label, uid or list items were a TypeError before any request."""
    import json

    import clipper.client_query as cq
    from clipper.client import ClipperConnection

    sent: list[dict] = []
    monkeypatch.setattr(cq, "json_answer", lambda req, *a: sent.append(json.loads(req.data)) or {"ok": True})
    x = np.array([0.5, 1.5], dtype=np.float32)
    cq.predict("http://h", "a", list(x), np.int64(7), False, 1.0)
    cq.update("http://h", "a", x, np.int64(3), np.int32(7), 1.0, feedback_id="f")
    assert sent == [
        {"input": [0.5, 1.5], "uid": 7},
        {"input": [0.5, 1.5], "uid": 7, "label": 3, "feedback_id": "f"},
    ]
    assert isinstance(sent[0]["input"][0], float) and isinstance(sent[1]["label"], int)
    conn = ClipperConnection("http://h", token="t")
    assert json.loads(conn._request("/admin/op", {"slo": np.int64(20000), "v": np.float64(0.25)}).data) == {
        "slo": 20000,
        "v": 0.25,
    }
    try:
        cq.predict("http://h", "a", {"not": object()}, None, False, 1.0)
    except TypeError as e:
        assert "object is not JSON serializable" in str(e)
    else:
        raise AssertionError("an object that is not JSON was sent")
