from __future__ import annotations

import gzip

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
        ("/digits/predict", {"input": [1.0] * 63 + [True]}, 400, "input: expected a list of finite floats"),
        ("/digits/predict", {"input_batch": [[0.0] * 64, [False] * 64]}, 400, "input_batch[1]: expected a list"),
        ("/digits/predict", {"input": [0.0] * 64, "input_batch": []}, 400, "exactly one of"),
        ("/digits/predict", {"input": [0.0] * 64, "extra": 1}, 400, "extra: expected no such field"),
        ("/digits/update", {"input": [0.0] * 64, "label": 1, "labels": 2}, 503, "feedback is not configured"),
        # what was sent is named in JSON's words, not Python's ("got NoneType", "got dict")
        ("/digits/predict", {"input": None}, 400, "input: expected a list of finite floats, got null"),
        ("/digits/predict", {"input": {"a": 1}}, 400, "got an object"),
        ("/digits/predict", {"input_batch": "x"}, 400, "input_batch: expected a list of inputs, got a string"),
        ("/digits/predict", [1], 400, "body: expected a JSON object with"),
        (
            "/digits/predict",
            {"input": [0.0] * 64, "uid": [1]},
            400,
            "uid: expected an integer (within 64 bits) or a non-empty string, got a list",
        ),
        (  # it said "got a string" (a new user's run)
            "/digits/predict",
            {"input": [0.0] * 64, "uid": ""},
            400,
            "uid: expected an integer (within 64 bits) or a non-empty string, got an empty string",
        ),
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


def test_a_body_refused_while_it_is_read_is_not_given_a_size(world):  # noqa: F811
    """The fast path reads a body in chunks and stops once past the limit: what it read by then is not the body's
    size (the 413 said a different size on each try), so the answer says only that it is over."""
    import asyncio
    import json

    app = create_app(world[0], max_body_bytes=64 * 1024)
    chunks = [b'{"input": [' + b"0.0," * 10000, b"0.0," * 10000, b"0.0," * 10000, b"0.0]}"]
    sent: list[dict] = []

    async def receive() -> dict:
        body = chunks.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(chunks)}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/digits/predict",
        "raw_path": b"/digits/predict",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["cause"] == "body: expected at most 65536 bytes, got more than 65536 bytes"


def test_openapi_documents_request_and_responses(client):
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/{app_name}/predict"]["post"]
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    assert {"input", "input_batch"} <= set(schema["properties"])
    assert {"200", "400", "404", "413"} <= set(op["responses"])
    assert "/health" in spec["paths"]


def test_json_is_the_only_body_type(client):
    r = client.post("/digits/predict", content=b'{"input": [1]}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["cause"] == "Content-Type: expected application/json, got text/plain"
    form = {"content-type": "application/x-www-form-urlencoded"}  # curl -d without -H
    assert client.post("/digits/predict", content=b"{}", headers=form).status_code == 415
    r = client.post("/digits/predict", content=b'{"input": ' + str(one_hot(2)).encode() + b"}")
    assert r.status_code == 200 and r.json()["output"] == 2  # no Content-Type: taken as JSON


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_compressed_body_is_a_415_naming_content_encoding(world, fast_path):  # noqa: F811
    client = TestClient(create_app(world[0], max_body_bytes=64 * 1024, fast_path=fast_path))
    body = gzip.compress(b'{"input": ' + str(one_hot(2)).encode() + b"}")
    gzipped = {"content-type": "application/json", "content-encoding": "gzip"}
    for route in ("/digits/predict", "/digits/update"):
        r = client.post(route, content=body, headers=gzipped)
        assert r.status_code == 415, route
        assert r.json()["cause"] == "Content-Encoding: expected none or identity (an uncompressed JSON body), got gzip"
    plain = b'{"input": ' + str(one_hot(2)).encode() + b"}"
    r = client.post("/digits/predict", content=plain, headers={"content-encoding": "identity"})
    assert r.status_code == 200 and r.json()["output"] == 2
    # several headers are one list, whichever order: any coding but identity is a 415, on both paths alike
    for codings in (["gzip", "identity"], ["identity", "gzip"], ["identity, gzip"]):
        headers = [("content-type", "application/json"), *(("content-encoding", c) for c in codings)]
        r = client.post("/digits/predict", content=body, headers=headers)
        assert r.status_code == 415, codings
    headers = [("content-encoding", "identity"), ("content-encoding", "Identity, ")]
    assert client.post("/digits/predict", content=plain, headers=headers).status_code == 200


def test_deeply_nested_bodies_are_a_400_not_a_500(client):
    for depth in (900, 2000, 30_000):
        for leaf in (b"1", b"NaN"):  # NaN: orjson refuses it, the json fallback (and its checks) reads the body
            body = b'{"input": ' + b"[" * depth + leaf + b"]" * depth + b"}"
            r = client.post("/digits/predict", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400 and set(r.json()) == {"error", "cause"}, (depth, leaf, r.text)


def test_unknown_routes_and_methods_answer_in_clippers_shape(client):
    r = client.get("/digits/predict")
    assert r.status_code == 405 and set(r.json()) == {"error", "cause"} and r.json()["error"] == "method not allowed"
    assert r.json()["cause"] == "GET /digits/predict: method not allowed (allowed: POST)"  # what to send instead
    r = client.post("/digits/nothing-here", json={})
    assert r.status_code == 404 and set(r.json()) == {"error", "cause"}
    assert r.json()["cause"].startswith("POST /digits/nothing-here: no such route (POST /<app>/predict")
    for path in ("/digits/predict/", "/health/"):  # a trailing slash: a 404 in the shape, not a bare 307
        r = client.request(
            "POST" if "predict" in path else "GET", path, json={"input": one_hot(1)}, follow_redirects=False
        )
        assert r.status_code == 404 and set(r.json()) == {"error", "cause"}, (path, r.status_code, r.text)


def test_the_query_id_is_a_response_header(client):
    r = client.post("/digits/predict", json={"input": one_hot(5)})
    assert r.headers["x-clipper-query-id"] == str(r.json()["query_id"])


def test_a_hung_dependency_gets_the_default_at_the_deadline_naming_the_stage():
    """The queue's send never returns: the watchdog answers by the SLO with the default and the stage."""
    import threading
    import time

    from clipper.adapters.clock import SystemClock
    from clipper.frontend.query import QueryProcessor
    from tests.fakes import InMemoryRegistry, InMemoryReplies, ListQueue, digits_app, model_version

    release = threading.Event()

    class HungQueue(ListQueue):
        def send(self, queue_url: str, body: str) -> None:
            release.wait(10)

    registry = InMemoryRegistry()
    registry.apps["digits"] = digits_app(latency_slo_micros=50_000)
    registry.links["digits"] = ["mlp"]
    registry.versions[("mlp", "1")] = model_version()
    registry.active["mlp"] = "1"
    processor = QueryProcessor(registry, HungQueue(), InMemoryReplies(), SystemClock(), lambda: 7 << 16)
    client = TestClient(create_app(processor, max_body_bytes=64 * 1024))
    try:
        start = time.monotonic()
        r = client.post("/digits/predict", json={"input_batch": [one_hot(1), one_hot(2)]})
        elapsed = time.monotonic() - start
    finally:
        release.set()
    assert r.status_code == 200
    preds = r.json()["batch_predictions"]
    assert [p["default"] for p in preds] == [True, True] and [p["output"] for p in preds] == [-1, -1]
    assert "still sending to model mlp:1 (request queue)" in preds[0]["default_explanation"]
    assert elapsed < 2.0  # answered by the watchdog, not after the 10 s hang


def _processor(inline: bool, policy: str = "single", registry_clock=None, refresh=None):
    from clipper.adapters.clock import SystemClock
    from clipper.batching.core import Batcher
    from clipper.core.registry_cache import CachedRegistry
    from clipper.frontend.query import QueryProcessor
    from clipper.frontend.selection import Selector
    from tests.fakes import (
        FakeEndpoint,
        FakeResolver,
        InMemoryRegistry,
        InMemoryReplies,
        InMemorySelectionStore,
        digits_app,
        model_version,
    )
    from tests.unit.test_query_processor import InlineQueue

    registry = InMemoryRegistry()
    registry.apps["digits"] = digits_app(latency_slo_micros=1_000_000, policy=policy)
    registry.links["digits"] = ["mlp"]
    registry.versions[("mlp", "1")] = model_version()
    registry.active["mlp"] = "1"
    clock, replies = SystemClock(), InMemoryReplies()
    queue = InlineQueue(batcher=Batcher(FakeResolver(FakeEndpoint()), replies, clock))
    if registry_clock is None:
        cached = CachedRegistry(registry, clock, ttl_s=60)
    else:  # a registry copy whose age the test moves: 2 s fresh, 2 s more while reloaded
        cached = CachedRegistry(registry, registry_clock, ttl_s=2, refresh=refresh, max_stale_s=2)
    selector = Selector(cached, InMemorySelectionStore(), clock, __import__("random").Random(1), ttl_s=60)
    return QueryProcessor(cached, queue, replies, clock, lambda: 1 << 16, selector=selector, inline=inline)


@pytest.mark.parametrize("quiet_s", [12, 60])  # 12: its reload still in flight, the copy answers it 30 s more
@pytest.mark.parametrize("inline", [True, False])
def test_the_first_query_after_a_quiet_while_reads_an_application_changed_or_deleted_meanwhile(inline, quiet_s):
    """The registry copy answers a query's application however old (its deadline and default are needed while
    the registry cannot be read), and the query went on with it: the first queries after a quiet while were
    answered by an application changed (its policy, default, a new incarnation) or deleted meanwhile. Now the
    application is read again first (found by a review helper: an Exp4 answer 12 s after set_app_policy exp3)."""
    from tests.fakes import FakeClock, digits_app

    registry_clock, reloads = FakeClock(), []
    # the copy's background reloads run when the test says: the one a query starts is in flight while it runs
    processor = _processor(inline, registry_clock=registry_clock, refresh=reloads.append)
    registry = processor.registry.uncached
    client = TestClient(create_app(processor, max_body_bytes=64 * 1024))

    def quiet(seconds: float) -> None:  # what was started finishes; then no query for a while
        while reloads:
            reloads.pop()()
        registry_clock.advance(seconds)

    assert client.post("/digits/predict", json={"input": one_hot(5)}).json()["output"] == 5
    registry.apps["digits"] = digits_app(latency_slo_micros=1_000_000, default_output="7")
    registry.links["digits"] = []  # changed: answered with its new default, no model linked
    quiet(quiet_s)  # past ttl + max_stale
    r = client.post("/digits/predict", json={"input": one_hot(5)}).json()
    assert (r["output"], r["default"]) == (7, True), r
    del registry.apps["digits"]  # deleted
    quiet(quiet_s)
    r = client.post("/digits/predict", json={"input": one_hot(5)})
    assert r.status_code == 404 and "digits" in r.json()["cause"], r.text


def test_an_application_whose_reload_is_slow_is_not_read_by_every_query_meanwhile():
    """Under load a reload of the registry copy can take seconds (moto at its background niceness on a saturated
    core): while one is in flight the held application is current, so queries do not each read it themselves
    (that made bursts of defaults: the benchmark's MLP search fell from 1,250 to 688 q/s with a version of the
    recheck that did not count the reload in flight)."""
    from tests.fakes import FakeClock

    registry_clock, reloads = FakeClock(), []
    processor = _processor(True, registry_clock=registry_clock, refresh=reloads.append)
    registry = processor.registry.uncached
    reads = []
    real = registry.get_app
    registry.get_app = lambda name: (reads.append(name), real(name))[1]  # type: ignore[method-assign]
    client = TestClient(create_app(processor, max_body_bytes=64 * 1024))
    assert client.post("/digits/predict", json={"input": one_hot(5)}).json()["output"] == 5
    registry_clock.advance(2.5)  # past the ttl: the next query starts a reload, which stays in flight
    assert client.post("/digits/predict", json={"input": one_hot(5)}).json()["output"] == 5
    assert reloads  # started, not finished
    read_before = len(reads)
    registry_clock.advance(3.0)  # past ttl + max_stale, the reload still in flight
    for _ in range(5):
        assert client.post("/digits/predict", json={"input": one_hot(6)}).json()["output"] == 6
    assert len(reads) == read_before  # no query read the application itself


@pytest.mark.parametrize("inline", [True, False])
def test_a_query_runs_on_the_event_loop_only_when_its_dependencies_allow(inline):
    client = TestClient(create_app(_processor(inline), max_body_bytes=64 * 1024))
    client.post("/digits/predict", json={"input": one_hot(1)})  # the registry copy now knows the app
    r = client.post("/digits/predict?debug=1", json={"input": one_hot(5)})
    assert r.json()["output"] == 5 and r.json()["default"] is False
    # a worker thread's query reports how long it waited for its thread; one on the loop has no such stage
    assert ("worker" in r.json()["debug"]["timings_ms"]) is not inline


def test_a_bandit_state_still_to_read_sends_the_query_to_a_worker_thread():
    processor = _processor(True, policy="exp3")
    client = TestClient(create_app(processor, max_body_bytes=64 * 1024))
    client.post("/digits/predict", json={"input": one_hot(1)})
    r = client.post("/digits/predict?debug=1", json={"input": one_hot(5), "uid": "new-user"})
    assert "worker" in r.json()["debug"]["timings_ms"]  # the user's state was not in memory: read off the loop
    r = client.post("/digits/predict?debug=1", json={"input": one_hot(6), "uid": "new-user"})
    assert "worker" not in r.json()["debug"]["timings_ms"]  # now it is


def test_the_fast_path_and_the_documented_route_answer_alike(client, world):  # noqa: F811
    """POST /<app>/predict is answered in front of FastAPI; the FastAPI route (what the OpenAPI document
    describes) answers the same requests the same way."""
    assert client.app.fast_path is not None
    route_only = TestClient(create_app(world[0], max_body_bytes=64 * 1024, fast_path=False))
    requests = [
        ("/digits/predict", b'{"input": ' + str(one_hot(3)).encode() + b"}", "application/json"),
        ("/digits/predict?debug=0", b'{"input_batch": [' + str(one_hot(2)).encode() + b"]}", None),
        ("/digits/predict", b"{not json", "application/json"),
        ("/digits/predict", b'{"input": [1], "x": 1}', "application/json"),
        ("/nope/predict", b'{"input": [1]}', "application/json"),
        ("/digits/predict", b'{"input": [1]}', "text/plain"),
        ("/digits/predict", b'{"input": [1.0, 2.0]}', "application/json; charset=utf-8"),
        ("/digits/predict", b'{"input": [' + b"0.0," * 20_000 + b"0.0]}", "text/plain"),  # 415 before 413
        ("/digits/predict?debug=banana", b'{"input": [1]}', "application/json"),
        ("/digits/predict?debug&x=1", b'{"input_batch": [' + str(one_hot(2)).encode() + b"]}", None),
    ]
    for path, body, content_type in requests:
        headers = {"content-type": content_type} if content_type else {}
        fast, slow = (c.post(path, content=body, headers=headers) for c in (client, route_only))
        a, b = fast.json(), slow.json()
        for answer in (a, b):  # query ids differ from call to call
            answer.pop("query_id", None)
            for p in answer.get("batch_predictions", []):
                p.pop("query_id")
        assert (fast.status_code, a) == (slow.status_code, b), path


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_debug_switch_that_is_neither_yes_nor_no_is_a_400_naming_it(world, fast_path):  # noqa: F811
    """?debug=banana was read as "no": a typo silently dropped the timings the caller asked for."""
    client = TestClient(create_app(world[0], max_body_bytes=64 * 1024, fast_path=fast_path))
    row = {"input": one_hot(5)}
    for query, header in [("debug=banana", None), ("debug=tru", None), ("", "please"), ("debug=1", "2")]:
        headers = {} if header is None else {"X-Clipper-Debug": header}
        r = client.post(f"/digits/predict?{query}", json=row, headers=headers)
        named = "debug" if header is None else "X-Clipper-Debug"
        assert r.status_code == 400, (query, header, r.text)
        assert r.json()["cause"].startswith(f"{named}: expected true or false"), r.json()
    for query, header, on in [
        ("debug=TRUE", None, True),
        ("debug", None, True),  # a bare switch is on
        ("debug=off", None, False),
        ("debug=no&other=1", None, False),
        ("", "yes", True),
        ("", "0", False),
        ("debug=%74rue", None, True),  # percent-encoded
        ("debug=false", "1", False),  # the URL, when it says, decides (a client's default header on)
        ("debug=1", "0", True),
        ("debug=1&debug=0", None, False),  # the last one given
        ("other=1", "1", True),
    ]:
        headers = {} if header is None else {"X-Clipper-Debug": header}
        r = client.post(f"/digits/predict?{query}", json=row, headers=headers)
        assert r.status_code == 200 and r.json()["output"] == 5, (query, r.text)
        assert ("debug" in r.json()) is on, (query, header)


def test_a_repeated_debug_header_is_read_as_the_framework_reads_it_the_first(world):  # noqa: F811
    for fast_path in (True, False):
        client = TestClient(create_app(world[0], max_body_bytes=64 * 1024, fast_path=fast_path))
        twice = [("X-Clipper-Debug", "banana"), ("X-Clipper-Debug", "1")]
        assert client.post("/digits/predict", json={"input": one_hot(5)}, headers=twice).status_code == 400


def test_the_fast_path_answers_before_the_framework_and_its_middleware(world):  # noqa: F811
    """A query does not pass through FastAPI's middleware stack (its cost per request is what the fast path
    saves); every other request still does."""
    app = create_app(world[0], max_body_bytes=64 * 1024)
    seen: list[str] = []

    @app.middleware("http")
    async def count(request, call_next):  # type: ignore[no-untyped-def]
        seen.append(request.url.path)
        return await call_next(request)

    client = TestClient(app)
    assert client.post("/digits/predict", json={"input": one_hot(4)}).json()["output"] == 4
    assert client.get("/health").status_code == 200
    assert seen == ["/health"]


def test_an_unexpected_failure_on_the_fast_path_answers_clippers_500(world, monkeypatch, caplog):  # noqa: F811
    app = create_app(world[0], max_body_bytes=64 * 1024)

    def broken(*_args: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(world[0], "admit", broken)
    with caplog.at_level("ERROR", logger="clipper.frontend.fastpath"):
        r = TestClient(app, raise_server_exceptions=False).post("/digits/predict", json={"input": one_hot(4)})
    assert r.status_code == 500 and r.json()["error"] == "internal error"
    assert "KeyError: 'a bug'" in caplog.text


def test_a_boolean_free_body_is_not_searched_for_booleans_and_a_boolean_is_still_refused(client, monkeypatch):
    """The handler looks at the raw text (``may_hold_booleans``) and spares validation the search of the parsed
    lists when no array can hold ``true`` or ``false``; a body that holds one is searched and refused."""
    from clipper.core import validation

    searched = []
    real = validation._has_bool
    monkeypatch.setattr(validation, "_has_bool", lambda value: searched.append(1) or real(value))
    r = client.post("/digits/predict", json={"input": one_hot(2)})
    assert r.status_code == 200 and r.json()["output"] == 2 and searched == []
    r = client.post("/digits/predict", json={"input": [0.0] * 63 + [True]})
    assert r.status_code == 400 and "non-numeric values" in r.json()["cause"] and searched


def test_update_takes_the_clients_feedback_id_and_names_it_when_it_is_bad(world):  # noqa: F811
    from clipper.feedback import FeedbackReceiver
    from tests.fakes import ListQueue

    queue = ListQueue()
    feedback = FeedbackReceiver(world[1], queue, "https://sqs.local/feedback")
    client = TestClient(create_app(world[0], max_body_bytes=64 * 1024, feedback=feedback))
    body = {"input": one_hot(3), "label": 3, "feedback_id": "retry-me"}
    first, again = (client.post("/digits/update", json=body) for _ in range(2))
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    r = client.post("/digits/update", json={**body, "feedback_id": "no spaces"})
    assert r.status_code == 400 and r.json()["cause"] == (
        "feedback_id: expected 1 to 128 letters, digits, '_', '.', ':' or '-', got ' ' at position 2"
    )
    r = client.post("/digits/update", json={**body, "feedback_id": "k" * 129})
    assert r.json()["cause"].endswith("got 129 characters")
    r = client.post("/digits/update", json={"label": 3})  # the input the label is for: named, as /update takes it
    assert r.status_code == 400 and r.json()["cause"].startswith("input: expected the input the label is for")
    r = client.post("/digits/update", json={"input": [0.0] * 64, "label": 3, "uid": 18446744073709551616})
    assert r.json()["cause"] == (
        "uid: expected an integer (within 64 bits) or a non-empty string, got an integer past 64 bits"
    )
    reads = world[1].reads
    r = client.post("/" + "y" * 3000 + "/update", json=body)  # no application can be named so: no registry read
    assert r.status_code == 404 and "(3000 characters)' does not exist" in r.json()["cause"] and world[1].reads == reads
    spec = client.get("/openapi.json").json()
    update = spec["paths"]["/{app_name}/update"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "feedback_id" in update["properties"]


def test_a_feedback_whose_send_timed_out_is_answered_with_the_key_that_applies_it_once(world):  # noqa: F811
    """The queue timed out on the send (it may hold the feedback all the same): a 503 with the feedback's key; the
    same feedback sent again with it is the same feedback (one id: the worker applies it once)."""
    from clipper.errors import Unavailable
    from clipper.feedback import FeedbackMessage, FeedbackReceiver
    from tests.fakes import ListQueue

    class TimesOutOnce(ListQueue):
        def send(self, queue_url: str, body: str) -> None:
            super().send(queue_url, body)  # SQS took it, its answer was lost
            if len(self.sent) == 1:
                raise Unavailable("sqs.SendMessage: ReadTimeoutError")

    queue = TimesOutOnce()
    feedback = FeedbackReceiver(world[1], queue, "https://sqs.local/feedback")
    client = TestClient(create_app(world[0], max_body_bytes=64 * 1024, feedback=feedback))
    body = {"input": one_hot(3), "label": 3}
    first = client.post("/digits/update", json=body)
    assert first.status_code == 503, first.text
    key = first.json()["retry_feedback_id"]
    assert f'send it again with "feedback_id": "{key}"' in first.json()["cause"]
    again = client.post("/digits/update", json={**body, "feedback_id": key})
    assert again.status_code == 200
    ids = [FeedbackMessage.from_json(b).feedback_id for _, b in queue.sent]
    assert ids[0] == ids[1] == again.json()["feedback_id"]  # one feedback, applied once
    other = client.post("/digits/update", json=body)  # without the key: another feedback
    assert other.json()["feedback_id"] != ids[0]


def test_a_lone_surrogate_escape_is_a_400_not_a_500(world):  # noqa: F811
    """orjson refuses "\\ud800" alone and Python's json (the fallback that names NaN's field) takes it, but no
    queue message or DynamoDB item can carry it: feedback (a label, an input string) and queries answer 400."""
    from clipper.feedback import FeedbackReceiver
    from tests.fakes import ListQueue

    queue = ListQueue()
    feedback = FeedbackReceiver(world[1], queue, "https://sqs.local/feedback")
    client = TestClient(create_app(world[0], max_body_bytes=64 * 1024, feedback=feedback))
    headers = {"content-type": "application/json"}
    label = b'{"input": ' + str(one_hot(3)).encode() + b', "label": "a\\ud800b"}'
    for path, body in (("/digits/update", label), ("/digits/predict", b'{"input": [1], "uid": "\\udfff"}')):
        r = client.post(path, content=body, headers=headers)
        assert r.status_code == 400 and "lone surrogate" in r.json()["cause"], r.text
    assert queue.sent == []


def test_feedback_whose_input_no_queue_message_carries_names_the_limit_and_its_size(world):  # noqa: F811
    from clipper.errors import InvalidInput
    from clipper.feedback import FeedbackReceiver
    from tests.fakes import ListQueue, digits_app

    world[1].apps["wide"] = digits_app(name="wide", input_shape=None)
    feedback = FeedbackReceiver(world[1], ListQueue(), "https://sqs.local/feedback")
    with pytest.raises(InvalidInput) as refused:
        feedback.accept("wide", {"input": [0.5] * 60_000, "label": 1})  # 240 KB of float32, 320 KB in base64
    assert str(refused.value) == (
        "input: expected an input of at most 200 KiB as a queue message carries it, got 320,172 bytes"
    )


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_url_naming_what_no_application_can_be_named_is_a_404_without_a_registry_read(world, fast_path):  # noqa: F811
    """A made-up name of thousands of bytes was read from the registry (DynamoDB refuses a key past 2,048 bytes: an
    Unavailable, a 503, and a failed read that held the frontend's copy as failing)."""
    processor, registry = world[0], world[1]
    client = TestClient(create_app(processor, max_body_bytes=64 * 1024, fast_path=fast_path))
    reads = registry.reads
    for name, shown in [("x" * 3000, "x" * 100 + "... (3000 characters)"), ("a%20b", "a b"), ("-digits", "-digits")]:
        r = client.post(f"/{name}/predict", json={"input": one_hot(1)})
        assert r.status_code == 404 and r.json()["error"] == "unknown application", r.text
        assert r.json()["cause"].startswith(f"application '{shown}' does not exist (an application's name is 1-100")
    assert registry.reads == reads
    r = client.post("/digits/predict", json={"input": one_hot(1)})
    assert r.status_code == 200 and r.json()["output"] == 1


def test_health_answers_head_and_the_unknown_route_lists_the_document(client):
    """HEAD /health was a 405 (some health checkers send it); the 404 of an unknown route named every route but
    GET /openapi.json (a new user's run)."""
    r = client.head("/health")
    assert r.status_code == 200 and r.content == b""
    cause = client.get("/nope").json()["cause"]
    assert "GET /openapi.json" in cause and client.get("/openapi.json").status_code == 200
