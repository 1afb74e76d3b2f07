"""The selection report through the Lambda handlers: queries answered by the frontend function (the real model
behind its queue), feedback consumed by the feedback function, then the admin function's
``GET /admin/apps/{app}/report`` (an API Gateway HTTP API event) shows each feedback's loss."""

from __future__ import annotations

import json

import pytest

from clipper.core.domain import Application, InputType
from tests.events import LambdaContext, http_event, sqs_event

pytestmark = pytest.mark.e2e

TOKEN = "e2e-admin-token"


def call(handler, method, path, body=None, query="", headers=None):
    resp = handler(http_event(method, path, body, query, headers), LambdaContext(function_name="f"))
    return resp["statusCode"], json.loads(resp["body"])


def test_the_report_shows_the_loss_of_live_feedback(stack, monkeypatch):
    from tests.e2e.conftest import fresh_import

    stack.registry.put_app(Application("ens", InputType.FLOATS, "-1", 3_000_000, (64,), policy="exp4"))
    stack.registry.link("ens", "mlp")
    labels = []
    for i in range(4):  # the last label is planted wrong: the model's loss is 1/4
        row = stack.holdout_x[i].tolist()
        status, body = call(stack.frontend.handler, "POST", "/ens/predict", {"input": row})
        assert status == 200 and body["default"] is False
        labels.append(body["output"] if i < 3 else (body["output"] + 1) % 10)
        status, _ = call(stack.frontend.handler, "POST", "/ens/update", {"input": row, "label": labels[-1]})
        assert status == 200
    feedback = fresh_import("functions.feedback.app")
    url = stack.extra["feedback_url"]
    arn = stack.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    messages = []
    while len(messages) < 4:
        got = stack.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"])
        messages += got.get("Messages", [])
    assert feedback.handler(sqs_event(messages, arn), LambdaContext())["batchItemFailures"] == []

    monkeypatch.setenv("CLIPPER_ADMIN_TOKEN", TOKEN)
    admin = fresh_import("functions.admin.app")
    auth = {"authorization": f"Bearer {TOKEN}"}
    status, report = call(admin.handler, "GET", "/admin/apps/ens/report", query="since=1h&window=2", headers=auth)
    assert status == 200, report
    assert report["feedbacks"] == 4 and report["policy"] == "exp4"
    assert report["models"]["mlp"] == {
        "answers": 4,
        "mean_loss": 0.25,
        "versions": {"1": {"answers": 4, "mean_loss": 0.25}},
    }
    assert sorted(p["mean_loss"]["mlp"] for p in report["loss_over_time"]["points"]) == [0.0, 0.5]  # 2 a window
    assert report["answers"] == {"judged": 4, "mean_loss": 0.25, "defaults": 0, "not_recorded": 0}
    status, refused = call(admin.handler, "GET", "/admin/apps/ens/report", query="since=soon", headers=auth)
    assert status == 400 and refused["cause"].startswith("since:")
