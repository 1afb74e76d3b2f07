"""The local stack's request log (``infra/local/requestlog.py``): one line per request, the query id of the
frontend's response header, nothing formatted on the request path, rotation past its size."""

from __future__ import annotations

import asyncio
import re

import pytest

from infra.local.requestlog import RequestLog, logged

pytestmark = pytest.mark.unit


def call(app, method: str, path: str) -> None:
    scope = {"type": "http", "method": method, "path": path, "query_string": b"debug=true", "headers": []}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start"  # what the app sends reaches the client unchanged


def app_answering(status: int, query_id: bytes | None):
    async def app(scope, receive, send):
        headers = [(b"content-type", b"application/json")]
        if query_id is not None:
            headers.append((b"x-clipper-query-id", query_id))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def test_each_request_is_one_line_with_status_latency_and_query_id(tmp_path):
    log = RequestLog(tmp_path / "requests.log")
    call(logged(app_answering(200, b"4648994770124800"), log), "POST", "/digits/predict")
    call(logged(app_answering(404, None), log), "GET", "/nope")
    assert log.flush() == 2
    lines = (tmp_path / "requests.log").read_text().splitlines()
    pattern = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (\S+) (\S+) (\d{3}) (\d+\.\d)ms qid=(\S+)"
    fields = [re.fullmatch(pattern, line).groups() for line in lines]
    assert [(m, p, s, q) for m, p, s, _, q in fields] == [
        ("POST", "/digits/predict", "200", "4648994770124800"),
        ("GET", "/nope", "404", "-"),
    ]
    assert log.flush() == 0 and len((tmp_path / "requests.log").read_text().splitlines()) == 2


def test_a_path_with_a_space_or_a_newline_stays_one_line_of_six_fields(tmp_path):
    log = RequestLog(tmp_path / "requests.log")
    for path in ("/_x y/predict", "/a\nPOST /forged/predict", "/caf\u00e9/predict", "/100%/predict"):
        call(logged(app_answering(404, None), log), "POST", path)  # ASGI's path: percent-decoded
    log.flush()
    lines = (tmp_path / "requests.log").read_text().splitlines()
    assert [line.split(" ")[2] for line in lines] == [
        "/_x%20y/predict",
        "/a%0APOST%20/forged/predict",
        "/caf%C3%A9/predict",
        "/100%/predict",
    ]
    assert all(len(line.split(" ")) == 6 and line.split(" ")[3] == "404" for line in lines)


def test_a_failing_app_is_logged_as_a_500(tmp_path):
    async def broken(scope, receive, send):
        raise RuntimeError("bug")

    log = RequestLog(tmp_path / "requests.log")
    with pytest.raises(RuntimeError):
        asyncio.run(logged(broken, log)({"type": "http", "method": "GET", "path": "/x"}, None, None))
    log.flush()
    assert " GET /x 500 " in (tmp_path / "requests.log").read_text()


def test_the_log_moves_aside_past_its_size(tmp_path):
    log = RequestLog(tmp_path / "requests.log", max_bytes=200)
    for _ in range(3):
        for _ in range(3):
            log.record(1.0, "POST", "/digits/predict", 200, 1.0, "1")
        log.flush()
    assert (tmp_path / "requests.log.1").is_file()
    assert len((tmp_path / "requests.log").read_text().splitlines()) == 3
