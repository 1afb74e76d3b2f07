from __future__ import annotations

from dataclasses import dataclass

import pytest

from clipper.batching.core import Batcher, Inbound
from clipper.core.messages import QueryMessage
from clipper.errors import InvalidInput, NotFound
from clipper.frontend.query import QueryProcessor
from tests.fakes import (
    FakeClock,
    FakeEndpoint,
    FakeResolver,
    InMemoryRegistry,
    InMemoryReplies,
    ListQueue,
    digits_app,
    model_version,
)

pytestmark = pytest.mark.unit


@dataclass
class InlineQueue(ListQueue):
    """A queue whose consumer runs at once: send -> batcher -> reply (the whole path without I/O)."""

    batcher: Batcher | None = None
    delay_s: float = 0.0
    clock: FakeClock | None = None

    def send(self, queue_url: str, body: str) -> None:
        super().send(queue_url, body)
        if self.clock:
            self.clock.advance(self.delay_s)
        if self.batcher:
            self.batcher.process([Inbound(str(len(self.sent)), body)])


@pytest.fixture
def world():
    clock, registry, replies, endpoint = FakeClock(), InMemoryRegistry(), InMemoryReplies(), FakeEndpoint()
    registry.apps["digits"] = digits_app()
    registry.links["digits"] = ["mlp"]
    registry.versions[("mlp", "1")] = model_version()
    registry.active["mlp"] = "1"
    queue = InlineQueue(batcher=Batcher(FakeResolver(endpoint), replies, clock), clock=clock)
    ids = iter(range(1000, 10**6, 1000))
    processor = QueryProcessor(registry, queue, replies, clock, lambda: next(ids))
    return processor, registry, queue, endpoint, clock


def one_hot(i: int) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(64)]


def test_single_query_answered_by_the_model(world):
    processor, _, queue, _endpoint, _ = world
    result = processor.predict("digits", {"input": one_hot(7)})
    body = result.as_dict()
    assert body == {"query_id": 1000, "output": 7, "default": False}
    (url, sent) = queue.sent[0]
    msg = QueryMessage.from_json(sent)
    assert url == "https://sqs.local/q-mlp" and msg.model == "mlp" and msg.rows == 1
    assert msg.deadline_ms == int((1_700_000_000.0 + 0.1) * 1000)


def test_batch_answers_in_order_with_one_message(world):
    processor, _, queue, endpoint, _ = world
    body = processor.predict("digits", {"input_batch": [one_hot(i) for i in (3, 1, 4)]}).as_dict()
    assert [p["output"] for p in body["batch_predictions"]] == [3, 1, 4]
    assert [p["query_id"] for p in body["batch_predictions"]] == [1000, 1001, 1002]
    assert len(queue.sent) == 1 and endpoint.calls == [3]


def test_unknown_app_and_bad_input_never_reach_a_model(world):
    processor, _, queue, endpoint, _ = world
    with pytest.raises(NotFound, match="'nope'"):
        processor.predict("nope", {"input": one_hot(1)})
    with pytest.raises(InvalidInput):
        processor.predict("digits", {"input": [1.0]})
    assert queue.sent == [] and endpoint.calls == []


def test_endpoint_error_gives_default_with_explanation(world):
    processor, _, _, endpoint, _ = world
    endpoint.fail_with = "model crashed"
    body = processor.predict("digits", {"input": one_hot(1)}).as_dict()
    assert body["default"] is True and body["output"] == "-1"
    assert "model mlp:1" in body["default_explanation"] and "model crashed" in body["default_explanation"]
    assert "endpoint error" in body["default_explanation"]


def test_no_reply_by_the_deadline_gives_default_timeout(world):
    processor, _, queue, _, _ = world
    queue.batcher = None  # nobody consumes the queue
    body = processor.predict("digits", {"input_batch": [one_hot(1), one_hot(2)]}).as_dict()
    preds = body["batch_predictions"]
    assert all(p["default"] and "timeout" in p["default_explanation"] for p in preds)
    assert "100 ms" in preds[0]["default_explanation"]


def test_query_that_waited_past_its_deadline_in_the_queue_is_dropped(world):
    processor, _, queue, endpoint, _ = world
    queue.delay_s = 0.5  # the batcher reaches the message after the SLO
    body = processor.predict("digits", {"input": one_hot(1)}).as_dict()
    assert body["default"] is True and endpoint.calls == []


def test_queue_unavailable_gives_default(world):
    processor, _, queue, _, _ = world
    queue.down = True
    body = processor.predict("digits", {"input": one_hot(1)}).as_dict()
    assert body["default"] and "queue unavailable" in body["default_explanation"]


def test_app_without_linked_model_gives_default(world):
    processor, registry, _, _, _ = world
    registry.links["digits"] = []
    body = processor.predict("digits", {"input": one_hot(1)}).as_dict()
    assert body["default"] and "no model is linked" in body["default_explanation"]


def test_debug_carries_model_and_stage_timings(world):
    processor, *_ = world
    body = processor.predict("digits", {"input": one_hot(2)}).as_dict(debug=True)
    assert body["debug"]["model"] == "mlp"
    assert {"validate", "select", "cache", "enqueue", "wait", "model_inference_ms"} <= set(body["debug"]["timings_ms"])
