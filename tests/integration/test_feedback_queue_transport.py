"""The feedback queue on the request queues' transport: with Redis Streams (the local stack), the frontend's
feedback goes to a stream kept in Redis's append-only file, and the feedback worker reads it there (on moto's
SQS it lived in the emulator's memory: a restart of moto or of the stack lost what was not applied yet)."""

from __future__ import annotations

import numpy as np
import pytest

from clipper.adapters.redis_streams import QueueDepth, RedisStreamRequestQueue
from clipper.entrypoints.feedback_worker import FeedbackWorker
from clipper.feedback import FeedbackMessage
from clipper.settings import FrontendSettings
from clipper.wiring import build_feedback_receiver, queue_reader
from tests.fakes import InMemoryRegistry, digits_app
from tests.services import redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

URL = "http://127.0.0.1:1/000000000000/clipper-feedback-test"


def test_feedback_travels_on_a_redis_stream_and_the_worker_applies_it(monkeypatch, redis_url):  # noqa: F811
    monkeypatch.setenv("CLIPPER_QUEUE_TRANSPORT", "redis")
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("CLIPPER_FEEDBACK_QUEUE_URL", URL)
    settings = FrontendSettings(registry_table="registry", replies_table="replies")
    registry = InMemoryRegistry()
    registry.apps["digits"] = digits_app()
    receiver = build_feedback_receiver(settings, registry, sqs=None)  # no SQS client: it is not used
    assert isinstance(receiver._queue, RedisStreamRequestQueue)
    accepted = receiver.accept("digits", {"input": np.eye(64)[3].tolist(), "label": 3})
    reader = queue_reader(settings, None, URL, visibility_timeout_s=180.0, max_receive_count=5)
    applied: list[FeedbackMessage] = []
    worker = FeedbackWorker(reader, lambda m: applied.append(m) or "applied")
    done = worker.handle(reader.receive(10, 0))
    assert len(done) == 1 and [m.feedback_id for m in applied] == [accepted["feedback_id"]]
    assert applied[0].label == 3 and reader.depth() == QueueDepth(0, 0, 0, 0)  # deleted once applied


def test_the_management_api_reports_the_streams_depths_not_moto_sqs(monkeypatch, redis_url):  # noqa: F811
    """On Redis Streams the SQS queues stay empty: get_state's queue depths (clipper inspect) read the streams."""
    from clipper.adapters.serving_probe import AwsServingProbe
    from clipper.wiring import request_queue, stream_depths

    monkeypatch.setenv("CLIPPER_QUEUE_TRANSPORT", "redis")
    monkeypatch.setenv("REDIS_URL", redis_url)
    settings = FrontendSettings(registry_table="registry", replies_table="replies")
    url = URL + "-depth"
    for i in range(3):
        request_queue(settings, None).send(url, f"m{i}")
    queue_reader(settings, None, url).receive(1, 0)
    probe = AwsServingProbe(sqs=None, depths=stream_depths(settings))  # SQS would answer 0 and 0
    assert probe.queue_depth(url) == {"waiting": 2, "in_flight": 1, "dead_lettered": 0}
    monkeypatch.setenv("CLIPPER_QUEUE_TRANSPORT", "sqs")
    assert stream_depths(FrontendSettings(registry_table="registry", replies_table="replies")) is None
