from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from clipper.frontend.api import create_app
from tests.unit.test_query_processor import one_hot, world  # noqa: F401  (fixture)

pytestmark = pytest.mark.unit


@pytest.fixture
def client(world):  # noqa: F811
    processor = world[0]
    return TestClient(create_app(processor, max_body_bytes=64 * 1024))


def test_predict_and_health(client):
    assert client.get("/health").json() == {"status": "ok"}
    r = client.post("/digits/predict", json={"input": one_hot(5)})
    assert r.status_code == 200 and r.json()["output"] == 5 and r.json()["default"] is False
    r = client.post("/digits/predict?debug=true", json={"input_batch": [one_hot(1), one_hot(2)]})
    assert [p["output"] for p in r.json()["batch_predictions"]] == [1, 2] and "debug" in r.json()


@pytest.mark.parametrize(
    ("path", "body", "status", "cause"),
    [
        ("/nope/predict", {"input": one_hot(1)}, 404, "application 'nope' does not exist"),
        ("/digits/predict", {"input": [1.0] * 3}, 400, "input: expected shape [64]"),
        ("/digits/predict", {"input_batch": []}, 400, "input_batch: expected at least one input"),
        ("/digits/predict", {"input": [float("nan")] * 64}, 400, "no NaN"),
        ("/digits/predict", {"input": [0.0] * 64, "extra": 1, "input_batch": []}, 400, "exactly one of"),
    ],
)
def test_errors_use_clippers_body_and_name_the_field(client, path, body, status, cause):
    import json

    r = client.post(path, content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"})
    assert r.status_code == status
    assert set(r.json()) == {"error", "cause"} and cause in r.json()["cause"]


def test_invalid_json_and_oversized_body(client):
    r = client.post("/digits/predict", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["cause"].startswith("body:")
    big = b'{"input": [' + b"0.0," * 20000 + b"0.0]}"
    r = client.post("/digits/predict", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "at most 65536 bytes" in r.json()["cause"]


def test_openapi_documents_request_and_responses(client):
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/{app_name}/predict"]["post"]
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    assert {"input", "input_batch"} <= set(schema["properties"])
    assert {"200", "400", "404", "413"} <= set(op["responses"])
    assert "/health" in spec["paths"]
