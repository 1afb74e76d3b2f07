"""The whole query path in one process: API Gateway HTTP API v2 events -> frontend handler (Mangum) ->
SQS (moto) -> event source mapping -> batcher Lambda handler with real SQS events -> ONNX endpoint
server (a real process) -> reply channel (real Redis, or DynamoDB in moto) -> response."""

from __future__ import annotations

import json
import time

import pytest

from clipper.core.domain import Application, InputType, ModelVersion
from infra.local import cfn
from tests.events import LambdaContext, http_event
from tests.iac.conftest import MODEL_TEMPLATE

pytestmark = pytest.mark.e2e


def call(stack, method, path, body=None, query=""):
    event = http_event(method, path, body, query)
    resp = stack.frontend.handler(event, LambdaContext(function_name="frontend"))
    return resp["statusCode"], json.loads(resp["body"])


def queue_depth(stack, url):
    attrs = stack.sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def test_single_and_batch_predictions_come_from_the_model(stack):
    status, body = call(stack, "POST", "/digits/predict", {"input": stack.holdout_x[0].tolist()})
    assert status == 200, body
    assert body["default"] is False and body["output"] == int(stack.expected[0])
    assert isinstance(body["query_id"], int)

    status, body = call(stack, "POST", "/digits/predict", {"input_batch": stack.holdout_x[:10].tolist()})
    assert status == 200
    outputs = [p["output"] for p in body["batch_predictions"]]
    assert outputs == [int(v) for v in stack.expected[:10]]
    assert not any(p["default"] for p in body["batch_predictions"])


def test_bad_requests_never_reach_the_queue(stack):
    stack.esm.pause()
    status, body = call(stack, "POST", "/nope/predict", {"input": [0.0] * 64})
    assert status == 404 and "'nope'" in body["cause"]
    status, body = call(stack, "POST", "/digits/predict", {"input": [0.0] * 10})
    assert status == 400 and body["cause"].startswith("input: expected shape [64]")
    status, body = call(stack, "POST", "/digits/predict", '{"input": [NaN' + ", 0" * 63 + "]}")
    assert status == 400 and "NaN" in body["cause"]
    assert queue_depth(stack, stack.queue_url) == 0


def test_batcher_stopped_gives_the_default_by_the_slo(stack):
    stack.registry.put_app(Application("digits", InputType.FLOATS, "-1", 300_000, (64,)), overwrite=True)
    stack.esm.pause()
    start = time.monotonic()
    status, body = call(stack, "POST", "/digits/predict", {"input": stack.holdout_x[0].tolist()})
    elapsed = time.monotonic() - start
    assert status == 200 and body["default"] is True and body["output"] == -1
    # by the processor at the deadline, or (a poll of moto under load overran it) by the watchdog just after
    why = body["default_explanation"]
    assert "model mlp:1: timeout" in why or "still waiting for replies from model mlp:1" in why, why
    assert elapsed < 0.3 + 0.5  # answered at the deadline, not after waiting for the model
    # the batcher, once back, drops the expired query without calling the model
    stack.esm.running.set()
    deadline = time.monotonic() + 10
    while queue_depth(stack, stack.queue_url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert queue_depth(stack, stack.queue_url) == 0 and queue_depth(stack, stack.dlq_url) == 0


def test_a_query_ends_with_the_default_before_the_function_would_be_stopped(stack):
    """An SLO (up to 30 s) past the function's timeout (FrontendTimeout, 10 s by default): the query ran on until
    its SLO, so Lambda stopped it first and API Gateway answered its own 500. It ends at the invocation's end,
    less the room for the answer, with the application's default."""
    from dataclasses import dataclass

    @dataclass
    class Ending(LambdaContext):
        def get_remaining_time_in_millis(self) -> int:
            return 1_500

    stack.registry.put_app(Application("digits", InputType.FLOATS, "-1", 20_000_000, (64,)), overwrite=True)
    stack.esm.pause()
    start = time.monotonic()
    event = http_event("POST", "/digits/predict", {"input": stack.holdout_x[0].tolist()})
    resp = stack.frontend.handler(event, Ending(function_name="frontend"))
    elapsed = time.monotonic() - start
    body = json.loads(resp["body"])
    assert resp["statusCode"] == 200 and body["default"] is True and body["output"] == -1
    assert elapsed < 1.5  # within the invocation's 1.5 s, not the 20 s SLO
    stack.esm.running.set()


def test_endpoint_down_gives_explained_default_and_the_message_reaches_the_dlq(stack, capsys, monkeypatch):
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    dead = "http://127.0.0.1:9"  # discard port: nothing answers
    stack.registry.put_version(ModelVersion("mlp", "2", InputType.FLOATS, stack.queue_url, dead, (64,)), activate=True)
    status, body = call(stack, "POST", "/digits/predict", {"input": stack.holdout_x[0].tolist()})
    assert status == 200 and body["default"] is True
    assert "model mlp:2: endpoint error" in body["default_explanation"]
    assert "unreachable" in body["default_explanation"]
    # retried by the mapping (maxReceiveCount 3), then moved to the dead-letter queue: nothing is lost
    deadline = time.monotonic() + 20
    while queue_depth(stack, stack.dlq_url) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert queue_depth(stack, stack.dlq_url) == 1
    assert any(r["batchItemFailures"] for r in stack.esm.invocations)
    # every failed try is counted by queue, for the model stack's EndpointFailuresAlarm
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')]
    errors = [m for m in emf if "EndpointErrors" in m]
    queue = stack.queue_url.rsplit("/", 1)[-1]
    assert len(errors) == 3 and all(m["queue"] == queue for m in errors)  # maxReceiveCount 3
    # by the alarm's dimensions exactly (CloudWatch matches the whole set: with "service" too it never fires)
    alarm = cfn.load_template(MODEL_TEMPLATE)["Resources"]["EndpointFailuresAlarm"]["Properties"]
    wanted = [[d["Name"] for d in alarm["Dimensions"]]]
    assert all(m["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == wanted for m in errors), errors


def test_duplicate_sqs_delivery_produces_one_answer(stack, capsys, monkeypatch):
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    stack.registry.put_app(Application("digits", InputType.FLOATS, "-1", 200_000, (64,)), overwrite=True)
    stack.esm.pause()
    _status, body = call(stack, "POST", "/digits/predict", {"input": stack.holdout_x[1].tolist()}, "debug=1")
    assert body["default"] is True  # nobody answered while the mapping was paused
    assert body["debug"]["model"] == "mlp" and "enqueue" in body["debug"]["timings_ms"]
    got = stack.sqs.receive_message(QueueUrl=stack.queue_url, MessageSystemAttributeNames=["All"])["Messages"]
    assert len(got) == 1
    # a fresh copy of the same query, with a future deadline, delivered twice in one event and again later (a
    # redelivery: its receive count says so, and the batcher looks it up rather than computing it again)
    msg = json.loads(got[0]["Body"])
    msg["deadline_ms"] = int((time.time() + 30) * 1000)
    record = dict(got[0], Body=json.dumps(msg))
    again = dict(record, MessageId="dup-2", Attributes={**record["Attributes"], "ApproximateReceiveCount": "2"})
    twice = [record, dict(record, MessageId="dup-1"), again]
    from tests.events import sqs_event

    frontend_replies = stack.frontend.processor._replies
    frontend_replies.expect(msg["reply_to"])  # as if the frontend still waited for it
    capsys.readouterr()
    first = stack.batcher.handler(sqs_event(twice[:2], stack.esm.arn), LambdaContext())
    second = stack.batcher.handler(sqs_event(twice[2:], stack.esm.arn), LambdaContext())
    assert first["batchItemFailures"] == [] and second["batchItemFailures"] == []
    # the batcher's EMF lines: the batch's size by model, the messages' fates by service
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')]

    def value(v):
        return v[0] if isinstance(v, list) else v

    batches = [m for m in emf if m.get("model") == "mlp"]
    assert len(batches) == 1 and value(batches[0]["BatchSize"]) == 1
    fates = [m for m in emf if m.get("service") == "clipper-batcher"]
    assert [(value(m["MessagesAnswered"]), value(m["MessagesDuplicate"])) for m in fates] == [(1, 1), (0, 1)]
    replies = frontend_replies.wait(msg["reply_to"], ["mlp"], 1.0)
    assert len(replies) == 1 and replies[0].ok
    frontend_replies.expect(msg["reply_to"])
    assert [r.ok for r in frontend_replies.wait(msg["reply_to"], ["mlp"], 0.2)] in ([], [True])  # no second push


def test_a_cached_prediction_is_answered_without_the_queue(stack):
    row = stack.holdout_x[2].tolist()
    status, first = call(stack, "POST", "/digits/predict", {"input": row}, "debug=1")
    assert status == 200 and first["default"] is False and first["debug"]["cache"] == {"hits": 0, "misses": 1}
    stack.esm.pause()  # no batcher: only the cache can answer now
    status, again = call(stack, "POST", "/digits/predict", {"input": row}, "debug=1")
    assert again["default"] is False and again["output"] == first["output"] == int(stack.expected[2])
    assert again["debug"]["cache"] == {"hits": 1, "misses": 0}
    assert queue_depth(stack, stack.queue_url) == 0
    # a new active version never gets the old version's cached answer
    stack.registry.put_app(Application("digits", InputType.FLOATS, "-1", 300_000, (64,)), overwrite=True)
    stack.registry.put_version(
        ModelVersion("mlp", "3", InputType.FLOATS, stack.queue_url, stack.endpoint_url, (64,)), activate=True
    )
    status, switched = call(stack, "POST", "/digits/predict", {"input": row}, "debug=1")
    assert switched["default"] is True and "timeout" in switched["default_explanation"]
    assert switched["debug"]["version"] == "3" and switched["debug"]["cache"]["hits"] == 0


def test_exp4_query_then_feedback_updates_the_bandit_state(stack):
    from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
    from clipper.selection import state_key
    from tests.e2e.conftest import fresh_import
    from tests.events import sqs_event

    stack.registry.put_app(Application("ens", InputType.FLOATS, "-1", 3_000_000, (64,), policy="exp4"))
    stack.registry.link("ens", "mlp")
    row = stack.holdout_x[4].tolist()
    status, body = call(stack, "POST", "/ens/predict", {"input": row})
    assert status == 200 and body["default"] is False and body["output"] == int(stack.expected[4])
    status, accepted = call(stack, "POST", "/ens/update", {"input": row, "label": int(stack.expected[4])})
    assert status == 200 and accepted["accepted"] is True
    status, bad = call(stack, "POST", "/ens/update", {"input": row, "label": {"x": 1}})
    assert status == 400 and bad["cause"].startswith("label:")
    status, bad = call(stack, "POST", "/nope/update", {"input": row, "label": 1})
    assert status == 404
    # the feedback function consumes the queue (as its event source mapping would)
    feedback = fresh_import("functions.feedback.app")
    url = stack.extra["feedback_url"]
    got = stack.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"])
    (message,) = got["Messages"]
    arn = stack.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    result = feedback.handler(sqs_event([message], arn), LambdaContext(function_name="feedback"))
    assert result["batchItemFailures"] == []
    state = DynamoDBSelectionStore(stack.extra["dynamodb"], "e2e-selection").load(state_key("ens"))
    assert state is not None and state.updates == 1 and state.policy == "exp4"
    # redelivered: nothing changes
    assert feedback.handler(sqs_event([message], arn), LambdaContext())["batchItemFailures"] == []
    again = DynamoDBSelectionStore(stack.extra["dynamodb"], "e2e-selection").load(state_key("ens"))
    assert again == state


def test_feedback_on_a_prediction_of_a_deleted_application_of_the_same_name_is_not_learned(stack):
    from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
    from clipper.selection import state_key
    from tests.e2e.conftest import fresh_import
    from tests.events import sqs_event

    stack.registry.put_app(Application("again", InputType.FLOATS, "-1", 3_000_000, (64,), policy="exp4", incarnation=7))
    stack.registry.link("again", "mlp")
    row = stack.holdout_x[5].tolist()
    status, body = call(stack, "POST", "/again/predict", {"input": row})  # recorded as incarnation 7's prediction
    assert status == 200 and body["default"] is False
    stack.registry.delete_app("again")  # and added again: a new application of the same name
    stack.registry.put_app(Application("again", InputType.FLOATS, "-1", 3_000_000, (64,), policy="exp4", incarnation=8))
    stack.registry.link("again", "mlp")
    status, accepted = call(stack, "POST", "/again/update", {"input": row, "label": int(stack.expected[5])})
    assert status == 200 and accepted["accepted"] is True
    feedback = fresh_import("functions.feedback.app")
    url = stack.extra["feedback_url"]
    got = stack.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"])
    (message,) = got["Messages"]
    arn = stack.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    assert feedback.handler(sqs_event([message], arn), LambdaContext())["batchItemFailures"] == []
    store = DynamoDBSelectionStore(stack.extra["dynamodb"], "e2e-selection")
    assert store.load(state_key("again")) is None
    # the same input queried again, by incarnation 8 now (the stack reads the registry afresh every time): the
    # frontend records whose prediction it is, and feedback on it is learned
    status, body = call(stack, "POST", "/again/predict", {"input": row})
    assert status == 200 and body["default"] is False
    status, accepted = call(stack, "POST", "/again/update", {"input": row, "label": int(stack.expected[5])})
    assert status == 200 and accepted["accepted"] is True
    (message,) = stack.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert feedback.handler(sqs_event([message], arn), LambdaContext())["batchItemFailures"] == []
    state = store.load(state_key("again"))
    assert state is not None and state.updates == 1 and state.incarnation == 8
