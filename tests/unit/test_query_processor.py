from __future__ import annotations

from dataclasses import dataclass

import pytest
from botocore.exceptions import ClientError

from clipper.adapters.aws_errors import translate
from clipper.batching.core import Batcher, Inbound
from clipper.core.messages import QueryMessage, Reply, decode_rows
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
    assert body["default"] is True and body["output"] == -1  # the default as the JSON number it spells
    assert "model mlp:1" in body["default_explanation"] and "model crashed" in body["default_explanation"]
    assert "endpoint error" in body["default_explanation"]


def test_a_message_the_batcher_cannot_read_gives_the_default_at_once_saying_so(world):
    processor, _, queue, endpoint, clock = world

    class Mangling(InlineQueue):  # the message reaches the batcher saying one row more than it holds
        def send(self, queue_url: str, body: str) -> None:
            msg = QueryMessage.from_json(body)
            super().send(queue_url, msg.model_copy(update={"rows": msg.rows + 1}).to_json())

    mangling = Mangling(batcher=queue.batcher, clock=clock)
    processor._gatherer._queue = mangling
    body = processor.predict("digits", {"input": one_hot(1)}).as_dict()
    assert body["default"] is True and endpoint.calls == []
    # said by the batcher's reply (without it the query waits out its SLO: "timeout")
    assert "model mlp:1: invalid query message: message says 2 rows, payload has 1" in body["default_explanation"]


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


def test_a_version_registered_without_serving_resources_gives_default_naming_it(world):
    processor, registry, queue, _, _ = world
    registry.versions[("mlp", "1")] = model_version(queue_url="", endpoint="")
    body = processor.predict("digits", {"input": one_hot(1)}).as_dict()
    assert body["default"] and "registered without serving resources" in body["default_explanation"]
    assert queue.sent == []


def test_redis_down_for_the_fused_lookup_and_send_gives_default_not_an_error(world):
    """With the cache and the queues on one Redis, one call looks up and sends: when it fails (Redis killed),
    each model's row is a default naming the cause (it once raised, a 5xx at the front door)."""
    from clipper.errors import Unavailable
    from tests.fakes import InMemoryCache

    _, registry, queue, _, clock = world

    class Down:
        def lookup_or_send(self, requests, claim_ttl_s, timeout=None, owner="1"):
            raise Unavailable("redis 127.0.0.1:6379: ConnectionRefusedError")

    cache = InMemoryCache()
    processor = QueryProcessor(registry, queue, InMemoryReplies(), clock, lambda: 1, cache=cache, fused=Down())
    body = processor.predict("digits", {"input": one_hot(1)}).as_dict()
    assert body["default"] and "queue unavailable (redis 127.0.0.1:6379" in body["default_explanation"]


def test_a_version_without_serving_resources_gives_the_default_on_the_fused_path_too(world):
    """With the cache and the queues on one Redis (the local stack's default) a single input went to the fused
    lookup-and-send with the version's empty queue name, whose "queue '' does not exist" came back as a 404
    "unknown application" (found by a review following the README's clipper_admin snippet)."""
    from clipper.errors import NotFound
    from tests.fakes import InMemoryCache

    _, registry, queue, _, clock = world
    registry.versions[("mlp", "1")] = model_version(queue_url="", endpoint="")

    class Fused:
        def lookup_or_send(self, requests, claim_ttl_s, timeout=None, owner="1"):
            if any(not url for _, url, _ in requests):
                raise NotFound("queue", "")  # as the Redis Streams queue answers an empty name
            return [("sent", None) for _ in requests]

    processor = QueryProcessor(
        registry, queue, InMemoryReplies(), clock, lambda: 1, cache=InMemoryCache(), fused=Fused()
    )
    body = processor.predict("digits", {"input": one_hot(1)}).as_dict()
    assert body["default"] and "registered without serving resources" in body["default_explanation"]


def test_app_without_linked_model_gives_default(world):
    processor, registry, _, _, _ = world
    registry.links["digits"] = []
    body = processor.predict("digits", {"input": one_hot(1)}).as_dict()
    assert body["default"] and "no model is linked" in body["default_explanation"]


def test_debug_carries_model_and_stage_timings(world):
    processor, *_ = world
    body = processor.predict("digits", {"input": one_hot(2)}).as_dict(debug=True)
    assert body["debug"]["model"] == "mlp" and body["debug"]["versions"] == {"mlp": "1"}
    assert {"validate", "select", "cache", "enqueue", "wait", "combine"} <= set(body["debug"]["timings_ms"])
    assert {"send", "queue", "inference", "batch_size", "reply"} <= set(body["debug"]["model_timings_ms"]["mlp"])


@dataclass
class ScriptedQueue(ListQueue):
    """Each send costs ``send_s`` of the clock and is answered at once with the reply timings scripted for
    its model (as a batcher would report them)."""

    clock: FakeClock | None = None
    replies: InMemoryReplies | None = None
    send_s: dict[str, float] | None = None
    reported: dict[str, dict[str, float]] | None = None

    def send(self, queue_url: str, body: str) -> None:
        super().send(queue_url, body)
        assert self.clock and self.replies and self.send_s and self.reported
        msg = QueryMessage.from_json(body)
        self.clock.advance(self.send_s[msg.model])
        reply = Reply(
            query_id=msg.query_id, model=msg.model, version=msg.version, outputs=[1] * msg.rows,
            timings=self.reported[msg.model],
        )  # fmt: skip
        self.replies.publish(msg.reply_to, reply)


class SlowReplies(InMemoryReplies):
    """The replies arrive ``wait_s`` after the frontend starts waiting."""

    def __init__(self, clock: FakeClock, wait_s: float) -> None:
        super().__init__()
        self.clock, self.wait_s = clock, wait_s

    def wait(self, reply_to: str, expected: int, timeout_s: float) -> list[Reply]:
        self.clock.advance(self.wait_s)
        return super().wait(reply_to, expected, timeout_s)


def test_each_model_of_an_ensemble_keeps_its_own_timings_and_the_batch_wait_is_apart():
    clock, registry = FakeClock(), InMemoryRegistry()
    registry.apps["ens"] = digits_app(name="ens", policy="exp4")
    registry.links["ens"] = ["good", "slow"]
    for name in ("good", "slow"):
        registry.versions[(name, "1")] = model_version(name)
        registry.active[name] = "1"
    replies = SlowReplies(clock, 0.050)
    queue = ScriptedQueue(
        clock=clock,
        replies=replies,
        send_s={"good": 0.004, "slow": 0.006},
        reported={
            # queue_ms runs from the message's sent_ms (stamped before the send) to the batch's start
            "good": {"queue_ms": 13.0, "batch_wait_ms": 3.0, "inference_ms": 2.0, "batch_size": 5.0},
            "slow": {"queue_ms": 20.0, "inference_ms": 7.0, "batch_size": 1.0},
        },
    )
    processor = QueryProcessor(registry, queue, replies, clock, lambda: 1000)
    result = processor.predict("ens", {"input": one_hot(1)})
    assert sorted(result.models) == ["good", "slow"] and result.model_errors == []
    good, slow = result.model_timings_ms["good"], result.model_timings_ms["slow"]
    # the fan-out is one send of both messages (4 + 6 ms here), then 50 ms of waiting until the frontend holds
    # both replies; each model's queue time runs from the end of that send
    assert good == pytest.approx(
        {"send": 10.0, "queue": 0.0, "batch_wait": 3.0, "inference": 2.0, "batch_size": 5.0, "reply": 45.0}, abs=1e-3
    )
    assert slow == pytest.approx(
        {"send": 10.0, "queue": 10.0, "inference": 7.0, "batch_size": 1.0, "reply": 33.0}, abs=1e-3
    )
    assert result.timings_ms["enqueue"] == pytest.approx(10.0) and result.timings_ms["wait"] == pytest.approx(50.0)
    debug = result.as_dict(debug=True)["debug"]
    assert debug["model_timings_ms"] == result.model_timings_ms and "combine" in debug["timings_ms"]


def test_a_model_that_gives_no_output_is_counted_as_its_error(world):
    processor, _, _, endpoint, _ = world
    endpoint.fail_with = "boom"
    result = processor.predict("digits", {"input": one_hot(1)})
    assert result.predictions[0].default and result.model_errors == ["mlp"]
    assert result.transport_failures == []


def test_a_request_queue_that_fails_is_counted_apart_from_the_models_errors(world):
    """Redis down or SQS refusing the send: the query gets the default, and the metrics charge the queue, not the
    model (its error count says the model failed)."""
    from clipper.frontend.metrics import InProcessMetrics

    processor, _, queue, endpoint, _ = world
    queue.down = True
    result = processor.predict("digits", {"input": one_hot(1)})
    assert result.predictions[0].default and "queue unavailable" in result.predictions[0].default_explanation
    assert result.model_errors == [] and result.transport_failures == ["mlp"] and endpoint.calls == []
    metrics = InProcessMetrics()
    metrics("digits", result, 0.01)
    counters = {k: v for c in metrics.report()["counters"] for k, v in c.items()}
    assert counters["model:mlp:1:num_transport_failures"] == 1 and "model:mlp:1:num_errors" not in counters


@pytest.mark.parametrize(
    ("registered", "answered"),
    [("-1", -1), ("0.5", 0.5), ("[0.5, 0.5]", [0.5, 0.5]), ("unknown", "unknown"), ('"1"', "1"), ("null", "null")],
)
def test_a_default_output_is_answered_as_the_json_value_it_spells(registered, answered):
    from clipper.frontend.query import default_value

    assert default_value(registered) == answered and type(default_value(registered)) is type(answered)


def test_a_shapeless_apps_input_that_its_model_cannot_take_is_a_400_not_a_default(world):
    """Clipper's applications have no input shape (``register_application``), so such an application takes flat
    inputs of any length; the model linked to it declares its rows' shape: an input of another size is the
    caller's error, named, and never reaches the model (its refusal was answered as the default, with a 200)."""
    processor, registry, queue, endpoint, _ = world
    registry.apps["shapeless"] = digits_app(name="shapeless", input_shape=None)
    registry.links["shapeless"] = ["mlp"]
    with pytest.raises(
        InvalidInput, match=r"input: expected shape \[64\] \(or 64 flat values\): the rows of model mlp"
    ):
        processor.predict("shapeless", {"input": [0.5] * 60})
    with pytest.raises(InvalidInput, match=r"input_batch: expected shape \[64\].*got shape \[65\]"):
        processor.predict("shapeless", {"input_batch": [[0.5] * 65]})
    assert queue.sent == [] and endpoint.calls == []
    assert processor.predict("shapeless", {"input": one_hot(3)}).as_dict()["output"] == 3


def test_a_shapeless_apps_flat_input_is_shaped_as_its_models_rows(world):
    processor, registry, queue, _, _ = world
    registry.apps["grid"] = digits_app(name="grid", input_shape=None)
    registry.links["grid"] = ["mlp"]
    registry.versions[("mlp", "1")] = model_version(input_shape=(8, 8))
    processor.predict("grid", {"input": one_hot(3)})
    assert decode_rows(QueryMessage.from_json(queue.sent[-1][1]).payload).shape == (1, 8, 8)


def test_the_feedback_record_of_a_shaped_input_keeps_the_applications_view(world):
    """Feedback validates its input as the application does (flat, for a shapeless one) and joins the query's
    record by it: the record is keyed by the input as the application took it, not as the model's rows."""
    import numpy as np

    from clipper.core.cache_keys import record_keys
    from tests.fakes import InMemoryCache

    _, registry, _, endpoint, clock = world
    registry.apps["grid"] = digits_app(name="grid", input_shape=None, policy="exp3")
    registry.links["grid"] = ["mlp"]
    registry.versions[("mlp", "1")] = model_version(input_shape=(8, 8))
    cache, replies = InMemoryCache(), InMemoryReplies()
    queue = InlineQueue(batcher=Batcher(FakeResolver(endpoint), replies, clock), clock=clock)
    processor = QueryProcessor(registry, queue, replies, clock, lambda: 7, cache=cache)
    assert processor.predict("grid", {"input": one_hot(3)}).as_dict()["default"] is False
    (flat,) = record_keys("grid", None, np.asarray([one_hot(3)], dtype=np.float32))
    assert flat in cache.entries


def test_a_bandit_app_refuses_an_input_only_when_no_linked_model_takes_it(world):
    """Exp3 draws one model a query: whether an input is refused must not depend on the draw, so it is checked
    against every linked model; and a model registered without a shape gets the input as the app took it."""
    processor, registry, queue, _, _ = world
    registry.versions[("m32", "1")] = model_version("m32", input_shape=(32,))
    registry.versions[("free", "1")] = model_version("free", input_shape=None)
    registry.active.update({"m32": "1", "free": "1"})
    registry.apps["bandit"] = digits_app(name="bandit", input_shape=None, policy="exp3")
    registry.links["bandit"] = ["mlp", "m32"]
    for _ in range(12):  # whichever model is drawn
        processor.predict("bandit", {"input": one_hot(5)})
    with pytest.raises(
        InvalidInput,
        match=r"input: expected shape \[32\] \(or 32 flat values\) or shape \[64\] \(or 64 flat values\): the rows "
        r"of models m32, mlp, got shape \[50\]",
    ):
        processor.predict("bandit", {"input": [0.5] * 50})
    registry.apps["ens"] = digits_app(name="ens", input_shape=None, policy="exp4")
    registry.links["ens"] = ["free", "m32"]
    registry.versions[("m32", "1")] = model_version("m32", input_shape=(8, 8))
    sent = len(queue.sent)
    processor.predict("ens", {"input": one_hot(5)})  # free takes anything: no refusal, and no shaping for it
    shapes = {decode_rows(QueryMessage.from_json(body).payload).shape for _, body in queue.sent[sent:]}
    assert shapes == {(1, 64)}


def test_a_late_single_model_query_names_the_models_choice_not_a_bandit_state(world):
    """A single-model application reads no bandit state: a default given while its model is chosen says so."""
    from dataclasses import replace

    from clipper.frontend.results import QueryTicket

    processor, registry, _queue, _endpoint, _ = world
    seen, choose = [], processor._selector.choose
    ticket = QueryTicket()

    def watching(app, user):
        seen.append((app.policy, ticket.stage))
        return choose(app, user)

    processor._selector.choose = watching
    processor.predict("digits", {"input": one_hot(1)}, ticket)
    registry.apps["digits"] = replace(registry.apps["digits"], policy="exp3")
    ticket = QueryTicket()
    processor.predict("digits", {"input": one_hot(1)}, ticket)
    assert seen == [("single", "choosing the model"), ("exp3", "reading the bandit state")]


@pytest.mark.parametrize(
    "refusal",
    [
        NotFound("resource", "sqs.SendMessage (AWS.SimpleQueueService.NonExistentQueue)"),
        translate(ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "SendMessage"), "sqs.SendMessage"),
    ],
)
def test_a_versions_queue_that_is_gone_or_not_ours_is_the_models_error(world, monkeypatch, refusal):
    """Its stack deleted, or outside the frontend's grants: every query defaults until it is fixed, and no retry
    of the transport helps. The model's error (it cannot be asked), not a transport failure as if SQS were down."""
    processor, _, queue, _, _ = world

    def send(queue_url: str, body: str, timeout: float | None = None) -> None:
        raise refusal

    monkeypatch.setattr(queue, "send", send)
    monkeypatch.setattr(queue, "send_many", lambda messages, timeout=None: [refusal for _ in messages])
    result = processor.predict("digits", {"input": one_hot(1)})
    assert result.predictions[0].default and "its request queue refused it" in result.predictions[0].default_explanation
    assert result.model_errors == ["mlp"] and result.transport_failures == []
