"""Every management operation over HTTP, against the registry in moto, with the bearer-token guard."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.admin.api import create_admin_app
from clipper.admin.service import AdminService

pytestmark = pytest.mark.integration

TOKEN = "s3cret"
DIGITS = {
    "name": "digits",
    "input_type": "floats",
    "default_output": "-1",
    "latency_slo_micros": 100000,
    "input_shape": [64],
}


def mlp(version, **extra):
    body = {"model_name": "mlp", "model_version": version, "input_type": "floats", "input_shape": [64]}
    if version == "1":
        body |= {"queue_url": "https://sqs.local/q-mlp", "endpoint": "http://127.0.0.1:9001"}
    return body | extra


@pytest.fixture
def admin(aws):
    service = AdminService(DynamoDBRegistry(aws.dynamodb, aws.registry_table))
    client = TestClient(create_admin_app(service, "token", TOKEN))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    return client


def ok(resp, status=200):
    assert resp.status_code == status, resp.text
    return resp.json()


def test_admin_calls_need_the_token(aws):
    service = AdminService(DynamoDBRegistry(aws.dynamodb, aws.registry_table))
    client = TestClient(create_admin_app(service, "token", TOKEN))
    assert client.get("/admin/ping").status_code == 401
    wrong = client.get("/admin/ping", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403 and "FRESH=1" in wrong.json()["cause"]  # a fresh local state: a new token
    assert client.post("/admin/add_app", json=DIGITS, headers={"Authorization": "Bearer x"}).status_code == 403
    unset = TestClient(create_admin_app(service, "token", ""))
    assert unset.get("/admin/ping", headers={"Authorization": "Bearer "}).status_code in (401, 403)
    assert client.get("/admin/ping", headers={"Authorization": f"Bearer {TOKEN}"}).json() == {"status": "pong"}
    assert ok(client.post("/admin/get_all_applications", json={}, headers={"Authorization": "Bearer x"}), 403)


def test_application_lifecycle(admin):
    assert ok(admin.post("/admin/add_app", json=DIGITS))["name"] == "digits"
    duplicate = ok(admin.post("/admin/add_app", json=DIGITS), 409)
    assert duplicate == {"error": "conflict", "cause": "application digits already exists"}  # not its key APP#...
    info = ok(admin.post("/admin/get_application", json={"name": "digits"}))
    assert info["latency_slo_micros"] == 100000 and info["input_shape"] == [64] and info["policy"] == "single"
    assert ok(admin.post("/admin/get_all_applications", json={})) == ["digits"]
    assert ok(admin.post("/admin/get_all_applications", json={"verbose": True}))[0]["name"] == "digits"
    assert ok(admin.post("/admin/delete_app", json={"name": "digits"})) == {"deleted": "digits"}
    assert admin.post("/admin/get_application", json={"name": "digits"}).status_code == 404


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"latency_slo_micros": 0}, "latency_slo_micros"),
        ({"latency_slo_micros": 999}, "latency_slo_micros"),  # under 1 ms every query was its default
        ({"latency_slo_micros": "fast"}, "latency_slo_micros"),
        ({"input_type": "images"}, "input_type"),
        ({"policy": "oracle"}, "policy"),
        ({"input_shape": [0]}, "input_shape"),
        ({"input_shape": [1] * 33}, "input_shape"),  # numpy's reshape refuses over 64: each query was a 500
        ({"input_shape": [2**31]}, "input_shape"),
        ({"name": "no spaces"}, "name"),
        ({"default_output": "\ud800"}, "default_output"),  # no UTF-8 answer can carry it: was a 500
        ({"default_output": "[" * 65 + "]" * 65}, "default_output"),  # answered as JSON: its encoder stops at 254
        ({"default_output": "x" * 65_537}, "default_output"),  # the registry's item limit: was a 503
    ],
)
def test_bad_registrations_name_the_field_and_change_nothing(admin, change, field):
    raw = json.dumps(DIGITS | change)  # ASCII: a lone surrogate travels as its JSON escape
    resp = admin.post("/admin/add_app", content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and resp.json()["cause"].startswith(field)
    assert ok(admin.post("/admin/get_all_applications", json={})) == []


def test_a_default_at_the_bounds_is_registered_and_answered(admin):
    nested = "[" * 64 + "]" * 64
    assert ok(admin.post("/admin/add_app", json=DIGITS | {"default_output": nested}))["default_output"] == nested
    ok(admin.post("/admin/add_app", json=DIGITS | {"name": "long", "default_output": "x" * 65_536}))


def test_the_slo_bounds_are_registered(admin):
    assert ok(admin.post("/admin/add_app", json=DIGITS | {"latency_slo_micros": 1_000}))["latency_slo_micros"] == 1_000
    late = ok(admin.post("/admin/add_app", json=DIGITS | {"name": "slow", "latency_slo_micros": 30_000_000}))
    assert late["latency_slo_micros"] == 30_000_000
    cause = ok(admin.post("/admin/add_app", json=DIGITS | {"name": "fast", "latency_slo_micros": 1}), 400)["cause"]
    assert cause.startswith("latency_slo_micros") and "1000" in cause


@pytest.mark.parametrize(
    ("operation", "body", "field"),
    [
        ("add_model", {"input_shape": [-3]}, "input_shape"),  # add_app refused these; add_model stored them
        ("add_model", {"input_shape": [0]}, "input_shape"),
        ("add_model", {"input_shape": [1] * 65}, "input_shape"),
        ("add_model", {"labels": ["x" * 1000] * 200}, "labels"),  # over the registry's item limit: was a 503
        ("add_model", {"labels": ["\udc00"]}, "labels"),
        ("add_model", {"container_name": "c" * 2049}, "container_name"),
        ("get_application", {"name": "\ud800"}, "name"),  # echoed in the 404's cause: was a 500
        ("get_application", {"name": "a" * 2049}, "name"),
        ("add_model_links", {"app_name": "digits", "model_names": ["\ud800"]}, "model_names"),
        ("rollback_model", {"model_name": "m\ud800"}, "model_name"),
    ],
)
def test_bad_text_and_shapes_in_any_operation_name_the_field(admin, operation, body, field):
    base = mlp("1") if operation == "add_model" else {}
    raw = json.dumps(base | body)  # ASCII: a lone surrogate travels as its JSON escape
    resp = admin.post(f"/admin/{operation}", content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["cause"].startswith(f"{field}: ") and "Value error" not in resp.json()["cause"]
    assert ok(admin.post("/admin/get_all_models", json={})) == []


@pytest.mark.parametrize("value", ["1e30", "-1e30"])
def test_a_number_far_out_of_an_integer_fields_range_is_named_without_pydantics_input_string(admin, value):
    raw = '{"name": "a", "input_type": "doubles", "default_output": "-1", "latency_slo_micros": ' + value + "}"
    resp = admin.post("/admin/add_app", content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    cause = resp.json()["cause"]
    assert cause == f"latency_slo_micros: expected an integer, got a number {float(value)!r}"
    assert "string" not in cause


def test_an_empty_content_type_is_a_415_not_a_body_error(admin):
    resp = admin.post("/admin/get_application", content=b'{"name": "x"}', headers={"Content-Type": ""})
    assert resp.status_code == 415 and "empty Content-Type" in resp.json()["cause"]


def test_links_are_answered_in_the_order_they_were_made(admin):
    ok(admin.post("/admin/add_app", json=DIGITS))
    ok(admin.post("/admin/add_model", json=mlp("1")))
    ok(admin.post("/admin/add_model", json=mlp("1") | {"model_name": "aaa"}))
    ok(admin.post("/admin/add_model_links", json={"app_name": "digits", "model_names": ["mlp"]}))
    added = ok(admin.post("/admin/add_model_links", json={"app_name": "digits", "model_names": ["aaa"]}))
    assert added["linked_models"] == ["mlp", "aaa"]  # the single policy answers with mlp, the first linked
    assert ok(admin.post("/admin/get_linked_models", json={"app_name": "digits"})) == ["mlp", "aaa"]


def test_models_versions_links_rollout_and_rollback(admin):
    ok(admin.post("/admin/add_app", json=DIGITS))
    ok(admin.post("/admin/add_model", json=mlp("1")))
    ok(admin.post("/admin/add_model_links", json={"app_name": "digits", "model_names": ["mlp"]}))
    assert ok(admin.post("/admin/get_linked_models", json={"app_name": "digits"})) == ["mlp"]
    # a second version, deployed without becoming current, reuses the serving resources
    v2 = ok(admin.post("/admin/add_model", json=mlp("2", activate=False)))
    assert v2["queue_url"] == "https://sqs.local/q-mlp" and v2["is_current_version"] is False
    assert admin.post("/admin/add_model", json=mlp("2")).status_code == 400  # versions are immutable
    assert sorted(ok(admin.post("/admin/get_all_models", json={}))) == ["mlp:1", "mlp:2"]
    switched = ok(admin.post("/admin/set_model_version", json={"model_name": "mlp", "model_version": "2"}))
    assert switched["previous_version"] == "1" and switched["changed"] is True
    again = ok(admin.post("/admin/set_model_version", json={"model_name": "mlp", "model_version": "2"}))
    assert again["active_version"] == "2" and again["changed"] is False  # already active: nothing changed
    assert ok(admin.post("/admin/get_model", json={"model_name": "mlp", "model_version": "2"}))["is_current_version"]
    assert ok(admin.post("/admin/rollback_model", json={"model_name": "mlp"}))["active_version"] == "1"
    assert admin.post("/admin/set_model_version", json={"model_name": "mlp", "model_version": "9"}).status_code == 404
    # the active version cannot be deleted; an inactive one can
    assert (
        admin.post("/admin/delete_versioned_model", json={"model_name": "mlp", "model_version": "1"}).status_code == 400
    )
    ok(admin.post("/admin/delete_versioned_model", json={"model_name": "mlp", "model_version": "2"}))
    state = ok(admin.post("/admin/get_state", json={}))
    assert state["models"]["mlp"]["active_version"] == "1" and state["applications"]["digits"]["linked_models"] == [
        "mlp"
    ]
    ok(admin.post("/admin/delete_model_links", json={"app_name": "digits", "model_names": ["mlp"]}))
    assert ok(admin.post("/admin/get_linked_models", json={"app_name": "digits"})) == []


def test_incompatible_links_and_unknown_names_are_refused(admin):
    ok(admin.post("/admin/add_app", json=DIGITS))
    ok(admin.post("/admin/add_model", json=mlp("1")))
    text = {"model_name": "bert", "model_version": "1", "input_type": "strings", "queue_url": "q", "endpoint": "e"}
    ok(admin.post("/admin/add_model", json=text))
    resp = admin.post("/admin/add_model_links", json={"app_name": "digits", "model_names": ["mlp", "bert"]})
    assert resp.status_code == 400 and "takes strings" in resp.json()["cause"]
    assert ok(admin.post("/admin/get_linked_models", json={"app_name": "digits"})) == []  # nothing changed
    assert admin.post("/admin/add_model_links", json={"app_name": "nope", "model_names": ["mlp"]}).status_code == 404
    assert admin.post("/admin/add_model_links", json={"app_name": "digits", "model_names": ["x"]}).status_code == 404
    half = {"model_name": "new", "model_version": "1", "input_type": "floats", "queue_url": "https://q"}
    assert admin.post("/admin/add_model", json=half).json()["cause"].startswith("queue_url")


def test_a_first_version_without_serving_resources_is_registered_as_clippers_register_model_does(admin, aws):
    """Clipper's add_model body (container_name, model_data_path, batch_size) on a new model: registered, with no
    replica, and a query to it answers the default naming why."""
    body = {
        "model_name": "described",
        "model_version": "1",
        "input_type": "floats",
        "labels": ["DEFAULT"],
        "container_name": "NO_CONTAINER",
        "model_data_path": "DEPRECATED",
        "batch_size": 8,
    }
    info = ok(admin.post("/admin/add_model", json=body))
    assert (info["model_name"], info["model_version"], info["is_current_version"]) == ("described", "1", True)
    assert (info["container_name"], info["batch_size"], info["queue_url"]) == ("NO_CONTAINER", 8, "")
    batching = ok(admin.post("/admin/get_model_batching", json={"model_name": "described"}))["batching"]
    assert (batching["controller"], batching["batch_size"]) == ("fixed", 8)
    assert ok(admin.post("/admin/get_all_containers", json={"verbose": False})) == []
    extra = admin.post("/admin/add_model", json={**body, "model_version": "2", "gpu": True})
    assert extra.status_code == 400 and extra.json()["cause"].startswith("gpu")  # other unknown fields: refused


def test_openapi_documents_every_operation(admin):
    spec = admin.get("/admin/openapi.json").json()
    ops = {p.removeprefix("/admin/") for p in spec["paths"]}
    assert ops >= {
        "ping",
        "add_app",
        "delete_app",
        "add_model",
        "delete_versioned_model",
        "set_model_version",
        "add_model_links",
        "delete_model_links",
        "get_all_applications",
        "get_application",
        "get_linked_models",
        "get_all_models",
        "get_model",
        "get_state",
    }


def test_openapi_declares_the_errors_each_operation_answers_in_clippers_error_body(admin):
    spec = admin.get("/admin/openapi.json").json()
    error_body = {"$ref": "#/components/schemas/ErrorBody"}
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            responses = operation["responses"]
            errors = {"401", "403"} if path == "/admin/ping" else {"400", "401", "403", "404", "409", "415", "503"}
            assert set(responses) == {"200"} | errors, (method, path)  # no 422: invalid bodies answer 400
            for status in errors:
                assert responses[status]["content"]["application/json"]["schema"] == error_body, (path, status)
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    assert set(spec["components"]["schemas"]["ErrorBody"]["required"]) == {"error", "cause"}
    refused = admin.post("/admin/add_app", json={"name": "x"})
    assert refused.status_code == 400 and set(refused.json()) == {"error", "cause"}


def test_the_policy_can_change_later(admin):
    ok(admin.post("/admin/add_app", json=DIGITS))
    body = {"name": "digits", "policy": "exp4", "confidence_threshold": 0.8, "default_when_unsure": True}
    info = ok(admin.post("/admin/set_app_policy", json=body))
    assert info["policy"] == "exp4" and info["confidence_threshold"] == 0.8 and info["default_when_unsure"]
    again = ok(admin.post("/admin/set_app_policy", json={"name": "digits", "policy": "exp3"}))
    assert again["confidence_threshold"] == 0.8  # what was not given stays
    assert admin.post("/admin/set_app_policy", json={"name": "digits", "policy": "magic"}).status_code == 400
    assert admin.post("/admin/set_app_policy", json={"name": "nope", "policy": "exp3"}).status_code == 404


def test_state_shows_queue_depths_and_endpoint_health(aws):
    from clipper.adapters.serving_probe import AwsServingProbe

    service = AdminService(DynamoDBRegistry(aws.dynamodb, aws.registry_table), AwsServingProbe(aws.sqs))
    client = TestClient(create_admin_app(service, "token", TOKEN))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    ok(client.post("/admin/add_model", json=mlp("1") | {"queue_url": aws.queue_url, "endpoint": "http://127.0.0.1:9"}))
    aws.sqs.send_message(QueueUrl=aws.queue_url, MessageBody="waiting")
    state = ok(client.post("/admin/get_state", json={}))["models"]["mlp"]
    assert state["queue"] == {"waiting": 1, "in_flight": 0}
    assert state["endpoint_health"].startswith("unreachable")
    # a model registered without serving resources says so (it read "unreachable (LocationValueError)")
    ok(client.post("/admin/add_model", json=mlp("2") | {"model_name": "bare", "model_version": "1"}))
    bare = ok(client.post("/admin/get_state", json={}))["models"]["bare"]
    assert bare["queue"] == bare["endpoint_health"] == "none (registered without serving resources)"


def test_state_shows_the_feedback_waiting_and_dead_lettered(aws):
    """Feedback is accepted with a 200 and applied later: what waits, and what failed for good, is visible."""
    from clipper.adapters.serving_probe import AwsServingProbe
    from clipper.cli.tables import inspect_table
    from tests.integration.conftest import create_queue

    queue, dead = create_queue(aws.sqs, "clipper-feedback")
    for body in ("a", "b"):
        aws.sqs.send_message(QueueUrl=queue, MessageBody=body)
    aws.sqs.send_message(QueueUrl=dead, MessageBody="poison")
    aws.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1)  # one in a worker's hands
    queues = {"queue": queue, "dead_letter": dead}
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    state = AdminService(registry, AwsServingProbe(aws.sqs), feedback_queues=queues).get_state()
    assert state["feedback"] == {"queue": {"waiting": 1, "in_flight": 1}, "dead_letter": {"waiting": 1, "in_flight": 0}}
    table = inspect_table(state)
    assert "feedback (accepted, not yet acknowledged" in table
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[-2:]}
    assert rows == {"feedback": ["1", "1"], "dead-lettered": ["1", "0"]}, table
    gone = {"queue": queue + "-gone"}
    assert (
        AdminService(registry, AwsServingProbe(aws.sqs), feedback_queues=gone)
        .get_state()["feedback"]["queue"]
        .startswith("unknown (")
    )
    assert "feedback" not in AdminService(registry, AwsServingProbe(aws.sqs)).get_state()


def test_a_models_batching_settings_are_stored_and_mapped_onto_its_lambda_batchers(aws):
    class LambdaStacks:
        """Versions "1" has a Lambda batcher (the event source mapping's parameters are recorded), "2" has none."""

        def __init__(self) -> None:
            self.mapping: dict[str, tuple[int, int]] = {}

        def busy(self, model: str, version: str) -> str | None:
            return None

        def set_batching(self, model: str, version: str, batch_size: int, window_s: int) -> bool:
            if version != "1":
                return False
            self.mapping[version] = (batch_size, window_s)
            return True

    from tests.fakes import model_version

    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_version(model_version("mlp", "1"), activate=True)
    registry.put_version(model_version("mlp", "2"))
    stacks = LambdaStacks()
    client = TestClient(create_admin_app(AdminService(registry, stacks=stacks), "token", TOKEN))  # type: ignore[arg-type]
    client.headers["Authorization"] = f"Bearer {TOKEN}"

    body = {"model_name": "mlp", "controller": "quantile", "max_batch_size": 64, "batch_wait_ms": 2}
    done = ok(client.post("/admin/set_model_batching", json=body))
    assert done["batching"] == {"controller": "quantile", "batch_size": 0, "max_batch_size": 64, "batch_wait_ms": 2.0}
    lam = done["lambda_batcher"]
    assert (lam["versions"], lam["BatchSize"], lam["MaximumBatchingWindowInSeconds"]) == (["1"], 10, 0)
    assert [n.split(":")[0] for n in lam["not_applied"]] == ["controller quantile", "batch_wait_ms"]
    assert done["versions_without_lambda_batcher"] == ["2"] and stacks.mapping == {"1": (10, 0)}
    stored = ok(client.post("/admin/get_model_batching", json={"model_name": "mlp"}))["batching"]
    assert stored["controller"] == "quantile"
    assert ok(client.post("/admin/get_state", json={}))["models"]["mlp"]["batching"]["max_batch_size"] == 64

    fixed = {"model_name": "mlp", "controller": "fixed", "batch_size": 32, "batch_wait_ms": 1000}
    done = ok(client.post("/admin/set_model_batching", json=fixed))
    assert stacks.mapping["1"] == (32, 1) and done["lambda_batcher"]["not_applied"] == []  # a 1 s window: > 10
    versions = ok(client.post("/admin/get_state", json={}))["models"]["mlp"]["versions"]
    assert {v["batch_size"] for v in versions.values()} == {32}  # as get_model says (get_state said -1)

    # what the long-poll batchers apply: no application linked, their --slo-ms (100 ms), half of it as the most a
    # batch waits (the 1,000 ms set is for the Lambda batcher's window), said in a note
    assert done["long_poll_batchers"] == {
        "latency_objective_ms": 100.0,
        "objective_of": [],
        "batch_wait_ms": 50.0,
        "note": "no application is linked: each batcher batches by its own --slo-ms (shown: its default, 100 ms); "
        "batch_wait_ms 1000 is more than half the latency objective: the long-poll batchers wait 50 ms "
        "(the Lambda batcher takes the setting)",
    }
    from dataclasses import replace

    from clipper.core.domain import Application, BatchingSettings, InputType

    for name, slo_micros in (("strict", 20_000), ("loose", 200_000)):
        registry.put_app(Application(name, InputType.FLOATS, "0", slo_micros, input_shape=(64,)))
        registry.link(name, "mlp")
    shown = ok(client.post("/admin/get_model_batching", json={"model_name": "mlp"}))
    assert shown["long_poll_batchers"]["latency_objective_ms"] == 10.0  # half the strictest SLO
    assert shown["long_poll_batchers"]["objective_of"] == ["strict"]
    assert shown["long_poll_batchers"]["batch_wait_ms"] == 5.0
    short = {"model_name": "mlp", "controller": "aimd", "batch_wait_ms": 2}
    assert ok(client.post("/admin/set_model_batching", json=short))["long_poll_batchers"] == {
        "latency_objective_ms": 10.0,
        "objective_of": ["strict"],
        "batch_wait_ms": 2.0,
    }
    # the answer is of the settings just set, not of a read that may precede them (DynamoDB's reads are eventual)
    stale = BatchingSettings("aimd", 0, 256, 2.0)
    read = registry.model_record
    registry.model_record = lambda name: replace(read(name), batching=stale)  # type: ignore[method-assign]
    longer = {"model_name": "mlp", "controller": "aimd", "batch_wait_ms": 8}
    assert ok(client.post("/admin/set_model_batching", json=longer))["long_poll_batchers"]["batch_wait_ms"] == 5.0
    registry.model_record = read  # type: ignore[method-assign]

    refused = client.post("/admin/set_model_batching", json={"model_name": "mlp", "controller": "fixed"})
    assert refused.status_code == 400 and refused.json()["cause"].startswith("batch_size")
    assert client.post("/admin/set_model_batching", json={"model_name": "nope"}).status_code == 404


def test_unknown_routes_methods_bad_json_and_other_bodies_answer_clippers_error_body(admin):
    cases = [
        (admin.get("/admin/nope"), 404, "GET /admin/nope: no such operation"),
        (admin.post("/admin/ping"), 405, "POST /admin/ping: method not allowed (allowed: GET)"),
        (admin.get("/admin/add_app"), 405, "GET /admin/add_app: method not allowed (allowed: POST)"),
        (
            admin.post("/admin/get_application", content=b'{"name": ', headers={"content-type": "application/json"}),
            400,
            "body: not valid JSON",
        ),
        (
            admin.post("/admin/get_application", content=b'{"name": "a"}', headers={"content-type": "text/plain"}),
            415,
            "Content-Type: expected application/json, got text/plain",
        ),
        (admin.get("/admin/ping/", follow_redirects=False), 404, "GET /admin/ping/: "),  # not a bare 307
    ]
    for resp, status, cause in cases:
        assert resp.status_code == status and set(resp.json()) == {"error", "cause"}, resp.text
        assert resp.json()["cause"].startswith(cause), resp.text
    assert cases[1][0].headers["allow"] == "GET"
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json"):  # as the query API takes them
        assert (
            admin.post("/admin/get_all_applications", content=b"{}", headers={"content-type": kind}).status_code == 200
        )


@pytest.mark.parametrize("canaried", [False, True])
def test_a_deleted_version_registered_again_is_not_a_rollback_target(admin, canaried):
    """v1 -> v2 -> v3, v2 deleted (a canary running on it or not), a new v2 registered without being made active:
    a rollback from v3 returns to v1, never to the new v2 (another model file, never active)."""
    for version in ("1", "2", "3"):
        ok(admin.post("/admin/add_model", json=mlp(version)))
    if canaried:
        ok(admin.post("/admin/start_canary", json={"model_name": "mlp", "model_version": "2", "share_percent": 10}))
    ok(admin.post("/admin/delete_versioned_model", json={"model_name": "mlp", "model_version": "2"}))
    ok(admin.post("/admin/add_model", json=mlp("2", activate=False)))
    rolled = ok(admin.post("/admin/rollback_model", json={"model_name": "mlp"}))
    assert rolled["active_version"] == "1"


@pytest.mark.parametrize(("failures", "status"), [(2, 200), (9, 503)])
def test_a_version_stack_that_fails_to_delete_is_tried_again_and_a_lasting_failure_says_what_is_left(
    aws, monkeypatch, failures, status
):
    """The registry item goes first, so a retry of the operation finds no version (404): a throttled stack delete
    left the version's queue, endpoint and instances running and billed, out of the API's reach."""
    from clipper.admin import service as service_module
    from clipper.errors import Throttled
    from tests.fakes import InMemoryServingStacks

    class Throttling(InMemoryServingStacks):
        left = failures

        def delete(self, model, version):
            if self.left:
                self.left -= 1
                raise Throttled("cloudformation.DeleteStack(model): throttled (Throttling)")
            super().delete(model, version)

    monkeypatch.setattr(service_module, "RETIRE_BACKOFF_S", (0.0, 0.0, 0.0))
    stacks = Throttling()
    stacks.served[("mlp", "2")] = (None, 1)
    service = AdminService(DynamoDBRegistry(aws.dynamodb, aws.registry_table), stacks=stacks)
    client = TestClient(create_admin_app(service, "token", TOKEN))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    ok(client.post("/admin/add_model", json=mlp("1")))
    two = mlp("2", activate=False) | {"queue_url": "https://sqs.local/q-mlp-2", "endpoint": "http://127.0.0.1:9002"}
    ok(client.post("/admin/add_model", json=two))
    resp = client.post("/admin/delete_versioned_model", json={"model_name": "mlp", "model_version": "2"})
    assert resp.status_code == status, resp.text
    if status == 200:
        assert ("mlp", "2") not in stacks.served
    else:
        assert "deleted from the registry, but its serving stack" in resp.json()["cause"]


@pytest.mark.parametrize("value", ["yes", "false", 1, 0])
def test_a_switch_takes_json_true_or_false_and_refuses_anything_else_naming_it(admin, value):
    """pydantic's lax bool took "yes", "false", 1 and 0: set_auto_promote applied "false" as false and "yes" as
    true, so a typo or a stringly-typed client was applied instead of refused."""
    ok(admin.post("/admin/add_model", json=mlp("1")))
    refused = admin.post("/admin/set_auto_promote", json={"model_name": "mlp", "auto_promote": value})
    assert refused.status_code == 400, refused.text
    assert refused.json()["cause"].startswith("auto_promote: expected true or false, got a "), refused.text
    for op, body in (("get_all_models", {"verbose": value}), ("add_model", mlp("2", activate=value))):
        answer = admin.post(f"/admin/{op}", json=body)
        assert answer.status_code == 400, (op, answer.text)
    assert ok(admin.post("/admin/set_auto_promote", json={"model_name": "mlp", "auto_promote": True}))["auto_promote"]


@pytest.mark.parametrize(
    ("op", "body", "field"),
    [
        ("add_app", {**DIGITS, "latency_slo_micros": True}, "latency_slo_micros"),
        ("add_app", {**DIGITS, "latency_slo_micros": "100000"}, "latency_slo_micros"),
        ("add_app", {**DIGITS, "latency_slo_micros": 100000.0}, "latency_slo_micros"),
        ("add_app", {**DIGITS, "input_shape": [True, 64]}, "input_shape"),
        ("add_app", {**DIGITS, "confidence_threshold": "0.5"}, "confidence_threshold"),
        ("add_app", {**DIGITS, "confidence_threshold": True}, "confidence_threshold"),
        ("set_num_replicas", {"model_name": "mlp", "num_replicas": True}, "num_replicas"),
        ("set_num_replicas", {"model_name": "mlp", "num_replicas": "2"}, "num_replicas"),
        ("set_num_replicas", {"model_name": "mlp", "num_replicas": 2.0}, "num_replicas"),
        ("set_policy_params", {"name": "digits", "eta": True}, "eta"),
        ("set_policy_params", {"name": "digits", "loss_scale": "5"}, "loss_scale"),
        ("set_policy_params", {"name": "digits", "loss_scale": 1e200}, "loss_scale"),
        ("start_canary", {"model_name": "mlp", "model_version": "1", "share_percent": "10"}, "share_percent"),
    ],
)
def test_a_number_is_a_json_number_and_an_integer_an_integer(admin, op, body, field):
    """pydantic's lax numbers took true as 1 and "100000" as 100000 (an application registered with an SLO of 1 us
    from one JSON slip, every query of it a default), and 2.0 replicas as 2; a number past DynamoDB's (1e200) was
    a 503 from the registry's write. Each is a 400 naming the field, and nothing changes."""
    ok(admin.post("/admin/add_model", json=mlp("1")))
    ok(admin.post("/admin/add_app", json={**DIGITS, "name": "digits"}))
    before = ok(admin.post("/admin/get_state", json={}))
    refused = admin.post(f"/admin/{op}", json=body if op != "add_app" else {**body, "name": "other"})
    assert refused.status_code == 400 and refused.json()["cause"].startswith(f"{field}"), refused.text
    assert ok(admin.post("/admin/get_state", json={})) == before
    if body.get(field) is True:
        assert refused.json()["cause"].endswith("got a boolean true"), refused.text


def test_an_integer_past_a_numbers_range_is_named_as_such(admin):
    ok(admin.post("/admin/add_app", json=DIGITS))
    raw = '{"name": "digits", "eta": 1' + "0" * 400 + "}"
    refused = admin.post("/admin/set_policy_params", content=raw, headers={"Content-Type": "application/json"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["cause"] == "eta: expected a number, got an integer out of a number's range"


def test_the_admin_apis_own_segment_is_no_application_name(admin):
    """An application named admin was registered (200) and never answered: POST /admin/predict is the admin API's
    (API Gateway's POST /admin/{operation}), a 404 'no such operation' (a user's review). A 400 naming the field
    now; a name that only begins with admin is an application like any other."""
    refused = ok(admin.post("/admin/add_app", json={**DIGITS, "name": "admin"}), 400)
    assert refused["cause"].startswith("name") and "reserved" in refused["cause"]
    assert ok(admin.post("/admin/add_app", json={**DIGITS, "name": "administrator"}))["name"] == "administrator"
