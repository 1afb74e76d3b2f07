"""The local stack's stop with ``QUEUE=sqs`` (infra/local/stack.py): the feedback accepted and not applied yet
lives in moto's SQS, which no copy keeps, so the stop says how many messages go with it."""

from __future__ import annotations

import logging
import threading
import types

import boto3
import pytest
from moto import mock_aws

from infra.local.stack import LocalStack, unapplied
from infra.local.supervisor import Stage

pytestmark = pytest.mark.unit


@pytest.fixture
def sqs(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        yield boto3.client("sqs")


class Stages:
    def __init__(self) -> None:
        self.stopped: list[Stage | str] = []

    def stop_stage(self, stage: Stage) -> None:
        self.stopped.append(stage)

    def halt(self) -> None:
        pass


def stopping(queue: str, url: str) -> types.SimpleNamespace:
    """What ``LocalStack.stop`` uses of the launcher."""
    state = types.SimpleNamespace(
        args=types.SimpleNamespace(queue=queue),
        outputs={"FeedbackQueueUrl": url},
        stopping=threading.Event(),
        dispatcher=None,
        supervisor=Stages(),
        take_snapshot=lambda: None,
    )

    def say() -> None:
        state.supervisor.stopped.append("counted")
        LocalStack._say_feedback_dropped(state)

    state._say_feedback_dropped = say
    return state


def test_unapplied_counts_visible_in_flight_and_delayed_messages(sqs):
    url = sqs.create_queue(QueueName="feedback")["QueueUrl"]
    assert unapplied(sqs, url) == 0
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=str(i))
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=60)
    sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)  # one in flight
    assert unapplied(sqs, url) == 4


@pytest.mark.parametrize(("queue", "said"), [("sqs", True), ("redis", False)])
def test_the_stop_says_how_much_feedback_goes_with_motos_sqs(sqs, caplog, queue, said):
    url = sqs.create_queue(QueueName="feedback")["QueueUrl"]
    for i in range(2):
        sqs.send_message(QueueUrl=url, MessageBody=str(i))
    state = stopping(queue, url)
    with caplog.at_level(logging.WARNING, logger="clipper.local"):
        LocalStack.stop(state)
    assert (
        any("2 accepted feedback message(s) not applied yet are dropped" in r.message for r in caplog.records) is said
    )
    # counted after the feedback worker stopped, before moto does
    stopped = state.supervisor.stopped
    assert stopped[-2:] == [Stage.REDIS, Stage.MOTO] and stopped.index(Stage.WORKERS) < len(stopped) - 2
    assert ("counted" in stopped) is said and (not said or stopped.index("counted") == len(stopped) - 3)
