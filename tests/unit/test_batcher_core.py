from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from clipper.batching.core import Batcher, Inbound
from clipper.core.domain import InputType
from clipper.core.messages import QueryMessage, encode_rows
from clipper.errors import Unavailable
from tests.fakes import FakeClock, FakeEndpoint, FakeResolver, InMemoryReplies

pytestmark = pytest.mark.unit


def message(qid: int, rows, clock: FakeClock, ttl_s: float = 0.1, model: str = "mlp") -> Inbound:
    payload, _ = encode_rows(rows)
    body = QueryMessage(
        query_id=qid,
        app="digits",
        model=model,
        version="1",
        input_type=InputType.FLOATS,
        rows=len(rows),
        payload=payload,
        deadline_ms=int((clock.now() + ttl_s) * 1000),
        sent_ms=int(clock.now() * 1000),
        reply_to=str(qid),
    ).to_json()
    return Inbound(message_id=f"m{qid}", body=body)


def one_hot(i: int, n: int = 1) -> np.ndarray:
    rows = np.zeros((n, 64), dtype=np.float32)
    rows[:, i] = 1
    return rows


@pytest.fixture
def setup():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), InMemoryReplies()
    return clock, endpoint, replies, Batcher(FakeResolver(endpoint), replies, clock)


def test_one_endpoint_call_per_batch_and_one_reply_per_message(setup):
    clock, endpoint, replies, batcher = setup
    msgs = [message(i, one_hot(i, n=1 + i % 2), clock) for i in range(1, 6)]
    report = batcher.process(msgs)
    assert endpoint.calls == [sum(1 + i % 2 for i in range(1, 6))]
    assert report.answered == 5 and report.failed == []
    for i in range(1, 6):
        (reply,) = replies.lists[str(i)]
        assert reply.outputs == [i] * (1 + i % 2)
        assert reply.timings["batch_size"] == 8


def test_expired_message_is_dropped_without_calling_the_model(setup):
    clock, endpoint, replies, batcher = setup
    old = message(1, one_hot(1), clock, ttl_s=0.05)
    clock.advance(0.06)
    fresh = message(2, one_hot(2), clock)
    report = batcher.process([old, fresh])
    assert report.expired == 1 and report.answered == 1
    assert endpoint.calls == [1]
    assert "1" not in replies.lists


def test_all_expired_means_no_model_call(setup):
    clock, endpoint, _, batcher = setup
    old = message(1, one_hot(1), clock, ttl_s=0.01)
    clock.advance(1)
    assert batcher.process([old]).expired == 1
    assert endpoint.calls == []


def test_duplicate_delivery_produces_one_answer(setup):
    clock, endpoint, replies, batcher = setup
    m = message(1, one_hot(3), clock)
    first = batcher.process([m, m])  # twice in the same receive
    second = batcher.process([m])  # and redelivered later
    assert first.answered == 1 and first.duplicates == 1 and second.duplicates == 1
    assert endpoint.calls == [1]
    assert len(replies.lists["1"]) == 1


def test_endpoint_failure_fails_every_member_with_an_explained_reply(setup):
    clock, endpoint, replies, batcher = setup
    endpoint.fail_with = "CUDA out of memory"
    report = batcher.process([message(1, one_hot(1), clock), message(2, one_hot(2), clock)])
    assert sorted(report.failed) == ["m1", "m2"] and report.answered == 0
    for q in ("1", "2"):
        (reply,) = replies.lists[q]
        assert not reply.ok and reply.error_kind == "endpoint" and "CUDA out of memory" in reply.error
    # a retry after the endpoint recovers answers normally
    endpoint.fail_with = None
    assert batcher.process([message(1, one_hot(1), clock)]).answered == 1


def test_wrong_output_count_fails_the_whole_batch(setup):
    clock, endpoint, replies, batcher = setup
    endpoint.wrong_count = True
    report = batcher.process([message(1, one_hot(1), clock), message(2, one_hot(2), clock)])
    assert sorted(report.failed) == ["m1", "m2"]
    assert all("2 inputs" in replies.lists[q][0].error for q in ("1", "2"))


@pytest.mark.parametrize(
    "body",
    [
        b'{"predictions": null}',
        b'{"predictions": 7}',
        b'{"predictions": {"a": 1}}',
        b'{"predictions": [123456789012345678901234567890]}',  # past 64 bits: the replies' encoder refuses it
    ],
)
def test_an_endpoint_answer_of_the_wrong_shape_fails_its_batch_not_the_batcher(body):
    from clipper.adapters.endpoints import decode_outputs

    class Answering:
        def predict(self, rows):
            return decode_outputs(body, "application/json", len(rows))

    clock, replies = FakeClock(), InMemoryReplies()
    batcher = Batcher(FakeResolver(Answering()), replies, clock)
    report = batcher.process([message(1, one_hot(1), clock)])  # raised a TypeError out of the batcher's loop
    assert report.failed == ["m1"] and replies.lists["1"][0].error_kind == "endpoint"


def test_an_endpoint_client_that_raises_anything_fails_its_batch_not_the_batcher(caplog):
    class Broken:
        def predict(self, rows):
            return {"not": "a list"}.__getitem__(slice(0, 1))  # TypeError: a client's own defect

    clock, replies = FakeClock(), InMemoryReplies()
    report = Batcher(FakeResolver(Broken()), replies, clock).process([message(1, one_hot(1), clock)])
    assert report.failed == ["m1"] and "endpoint client failed: TypeError" in replies.lists["1"][0].error
    assert any(r.getMessage() == "endpoint client failed" and r.exc_info for r in caplog.records)


def test_one_bad_record_never_fails_the_others(setup):
    clock, _endpoint, replies, batcher = setup
    bad = Inbound("poison", '{"not": "a query"}')
    report = batcher.process([bad, message(1, one_hot(4), clock)])
    assert report.failed == ["poison"] and report.answered == 1
    assert replies.lists["1"][0].outputs == [4]


def test_a_payload_no_retry_can_read_is_answered_with_the_reason_and_left_for_the_dead_letter_queue(setup):
    from clipper.core.messages import Payload
    from clipper.errors import NotFound

    clock, endpoint, replies, _ = setup
    wrong = message(1, one_hot(1, n=2), clock)
    body = QueryMessage.from_json(wrong.body).model_copy(update={"rows": 3}).to_json()  # says 3 rows, holds 2

    class Claims:
        def put(self, key, data):
            pass

        def get(self, key):
            if key.endswith("gone"):
                raise NotFound("claim", key)
            raise Unavailable("s3: throttled")

    def claimed(qid: int, key: str) -> Inbound:
        payload = Payload(s3_key=key)
        deadline_ms = int((clock.now() + 1.0) * 1000)
        text = QueryMessage.encode(qid, "digits", "mlp", "1", InputType.FLOATS, 1, payload, deadline_ms, 0, str(qid))
        return Inbound(f"m{qid}", text)

    batcher = Batcher(FakeResolver(endpoint), replies, clock, claims=Claims())
    report = batcher.process([Inbound("m1", body), claimed(2, "claims/gone"), claimed(3, "claims/slow")])
    assert endpoint.calls == [] and sorted(report.failed) == ["m1", "m2", "m3"]  # retried, then dead-lettered
    (first,) = replies.lists["1"]
    assert first.error_kind == "invalid" and "says 3 rows, payload has 2" in (first.error or "")
    (second,) = replies.lists["2"]
    assert second.error_kind == "invalid"
    assert "3" not in replies.lists  # the store unavailable: a retry may read it, nothing said yet


def test_rows_of_different_shapes_and_models_are_separate_calls(setup):
    clock, endpoint, _, batcher = setup
    a = message(1, one_hot(1), clock)
    b = message(2, np.ones((1, 8), dtype=np.float32), clock)
    c = message(3, one_hot(2), clock, model="logreg")
    report = batcher.process([a, b, c])
    assert report.answered == 3 and sorted(endpoint.calls) == [1, 1, 1]


def test_reply_channel_down_fails_messages_for_retry(setup):
    clock, _, replies, batcher = setup
    replies.down = True
    assert batcher.process([message(1, one_hot(1), clock)]).failed == ["m1"]


def test_query_that_cannot_be_answered_in_time_is_dropped(setup):
    clock, endpoint, _, batcher = setup

    def slow_predict(rows, inner=endpoint.predict):
        clock.advance(0.03)  # every batch takes 30 ms
        return inner(rows)

    endpoint.predict = slow_predict
    assert batcher.process([message(1, one_hot(1), clock)]).answered == 1
    assert batcher.latency_floor_s == pytest.approx(0.03)
    tight = message(2, one_hot(2), clock, ttl_s=0.02)  # 20 ms left, batches take 30
    roomy = message(3, one_hot(3), clock, ttl_s=0.1)
    report = batcher.process([tight, roomy])
    assert report.expired == 1 and report.answered == 1 and endpoint.calls == [1, 1]


class BatchReplies(InMemoryReplies):
    """InMemoryReplies counting the batch calls, with a way to fail only the publications."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_calls: list[tuple[str, int]] = []
        self.publish_down = False

    def answered_many(self, keys):
        self.batch_calls.append(("answered", len(keys)))
        if self.down:
            raise Unavailable("replies down")
        return [self.answered(*k) for k in keys]

    def publish_many(self, replies):
        self.batch_calls.append(("publish", len(replies)))
        if self.down or self.publish_down:
            raise Unavailable("replies down")
        return [self.publish(to, r) for to, r in replies]


def test_a_batch_channel_is_checked_and_published_once_a_group():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), BatchReplies()
    batcher = Batcher(FakeResolver(endpoint), replies, clock)
    first = message(1, one_hot(1), clock)
    assert batcher.process([first]).answered == 1
    msgs = [first] + [message(i, one_hot(i), clock, model="mlp" if i % 2 else "cnn") for i in range(2, 7)]
    replies.batch_calls.clear()
    report = batcher.process([*msgs, msgs[2]])  # one redelivered, one duplicated within the batch
    assert report.answered == 5 and report.duplicates == 2 and report.failed == []
    assert replies.batch_calls[0] == ("answered", 6)  # msgs[2] again is caught before the channel
    assert sorted(replies.batch_calls[1:]) == [("publish", 2), ("publish", 3)]
    assert sorted(endpoint.calls) == [1, 2, 3]
    for i in range(2, 7):
        (reply,) = replies.lists[str(i)]
        assert reply.outputs == [i]


def test_a_batch_channel_down_fails_every_message_for_retry():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), BatchReplies()
    batcher = Batcher(FakeResolver(endpoint), replies, clock)
    msgs = [message(i, one_hot(i), clock) for i in range(1, 4)]
    replies.down = True
    report = batcher.process(msgs)
    assert sorted(report.failed) == ["m1", "m2", "m3"] and report.answered == 0
    assert endpoint.calls == []  # the duplicate check failed: nothing reached the model
    replies.down, replies.publish_down = False, True
    report = batcher.process(msgs)
    assert sorted(report.failed) == ["m1", "m2", "m3"] and endpoint.calls == [3]
    replies.publish_down = False
    assert batcher.process(msgs).answered == 3


def timed(endpoint: FakeEndpoint, clock: FakeClock, fixed_s: float, per_row_s: float) -> None:
    """Every call advances the clock by ``fixed_s + per_row_s * rows``."""

    def predict(rows, inner=endpoint.predict):
        clock.advance(fixed_s + per_row_s * len(rows))
        return inner(rows)

    endpoint.predict = predict


def test_batches_are_cut_earliest_deadline_first_to_what_can_still_meet_it(setup):
    clock, endpoint, replies, batcher = setup
    timed(endpoint, clock, 0.002, 0.010)  # 12 ms for one row, 42 ms for four
    for n in (1, 4):
        assert batcher.process([message(100 + n, one_hot(0, n), clock, ttl_s=1.0)], defer=True).answered == 1
    roomy = [message(i, one_hot(i), clock, ttl_s=0.5) for i in range(1, 5)]
    urgent = message(9, one_hot(9), clock, ttl_s=0.045)  # 45 ms left: three rows fit (1.1 x 32 ms)
    report = batcher.process([*roomy, urgent], defer=True)
    assert report.answered == 3 and endpoint.calls[-1] == 3 and report.failed == []
    assert "9" in replies.lists and sorted(report.deferred) == ["m3", "m4"]  # the latest deadlines wait
    again = batcher.process([roomy[2], roomy[3]], defer=True)
    assert again.answered == 2 and again.deferred == [] and "3" in replies.lists and "4" in replies.lists


def test_the_cut_budgets_from_the_clock_after_the_claim_check_reads(setup):
    from clipper.core.domain import InputType
    from clipper.core.messages import Payload, QueryMessage
    from clipper.core.tensors import encode_npy

    clock, endpoint, replies, _ = setup
    timed(endpoint, clock, 0.002, 0.010)  # 12 ms for one row, 42 ms for four

    class SlowClaims:  # an S3 GET of 20 ms
        def put(self, key, data):
            pass

        def get(self, key):
            clock.advance(0.020)
            return encode_npy(one_hot(int(key.rsplit("-", 1)[1])))

    batcher = Batcher(FakeResolver(endpoint), replies, clock, claims=SlowClaims())
    for n in (1, 4):
        batcher.process([message(100 + n, one_hot(0, n), clock, ttl_s=1.0)], defer=True)
    deadline_ms = int((clock.now() + 0.100) * 1000)
    claimed = [
        Inbound(
            f"m{i}",
            QueryMessage.encode(
                i, "digits", "mlp", "1", InputType.FLOATS, 1, Payload(s3_key=f"claims/x-{i}"), deadline_ms, 0, str(i)
            ),
        )
        for i in range(1, 5)
    ]
    report = batcher.process(claimed, defer=True)  # 80 ms of reads: 20 ms left, one row's time (12 ms)
    assert endpoint.calls[-1] == 1 and report.answered == 1 and len(report.deferred) == 3
    assert clock.now() * 1000 <= deadline_ms  # cut from the stale clock: four rows, 22 ms past the deadline


def test_without_defer_a_batch_is_never_cut(setup):
    clock, endpoint, _, batcher = setup
    timed(endpoint, clock, 0.002, 0.010)
    for n in (1, 4):
        batcher.process([message(100 + n, one_hot(0, n), clock, ttl_s=1.0)])
    msgs = [message(i, one_hot(i), clock, ttl_s=0.5) for i in range(1, 5)]
    report = batcher.process([*msgs, message(9, one_hot(9), clock, ttl_s=0.045)])
    assert report.answered == 5 and report.deferred == [] and endpoint.calls[-1] == 5


def test_a_query_that_cannot_make_it_even_alone_is_dropped_once_the_line_is_fitted(setup):
    clock, endpoint, replies, batcher = setup
    timed(endpoint, clock, 0.002, 0.010)  # one row: 12 ms, predicted 13.2 ms with the margin
    assert batcher.process([message(101, one_hot(0), clock, ttl_s=1.0)], defer=True).answered == 1
    tight = message(1, one_hot(1), clock, ttl_s=0.013)  # over the 12 ms floor, under the prediction
    report = batcher.process([tight, message(2, one_hot(2), clock, ttl_s=0.5)], defer=True)
    # one batch size seen: a guess, so no drop; the tight one runs alone, the other waits
    assert report.answered == 1 and report.expired == 0 and report.deferred == ["m2"] and "1" in replies.lists
    batcher.process([message(102, one_hot(0, 4), clock, ttl_s=1.0)], defer=True)  # now a fitted line
    tight = message(3, one_hot(3), clock, ttl_s=0.013)
    report = batcher.process([tight, message(4, one_hot(4), clock, ttl_s=0.5)], defer=True)
    assert report.expired == 1 and report.answered == 1 and "3" not in replies.lists and "4" in replies.lists
    # the last member of a group always runs, so the line keeps being observed (and corrected)
    alone = batcher.process([message(5, one_hot(5), clock, ttl_s=0.013)], defer=True)
    assert alone.expired == 0 and alone.answered == 1 and "5" in replies.lists


def test_a_line_fitted_on_a_cold_outlier_is_corrected_not_obeyed_forever(setup):
    clock, endpoint, _, batcher = setup
    line = batcher.latency_model("mlp", "1")
    line.observe(1, 2.0)  # a cold first batch
    line.observe(4, 0.01)  # predicts that nothing fits a 100 ms budget
    assert line.fitted and line.rows_within(0.1, 1) == 0

    answered = 0
    for i in range(40):
        report = batcher.process([message(10 * i + k, one_hot(k), clock, ttl_s=0.1) for k in range(3)], defer=True)
        answered += report.answered

    assert answered > 0 and endpoint.calls  # the model is still called, and its line is observed again
    assert (
        batcher.process([message(1000 + k, one_hot(k), clock, ttl_s=0.1) for k in range(3)], defer=True).answered == 3
    )


def test_the_batch_wait_is_reported_apart_when_the_driver_stamped_the_receive(setup):
    clock, _, replies, batcher = setup
    sent = message(1, one_hot(1), clock)
    clock.advance(0.004)  # 4 ms in the queue, then received
    received = Inbound(sent.message_id, sent.body, received_ms=clock.now() * 1000)
    unstamped = message(2, one_hot(2), clock)
    clock.advance(0.003)  # 3 ms waiting for the batch to be cut

    batcher.process([received, unstamped])

    (reply,) = replies.lists["1"]
    assert reply.timings["queue_ms"] == pytest.approx(7.0, abs=1.0)  # sent -> batch start (whole-ms sent_ms)
    assert reply.timings["batch_wait_ms"] == pytest.approx(3.0)
    (other,) = replies.lists["2"]
    assert "batch_wait_ms" not in other.timings


def test_an_event_source_record_stamps_its_first_receive_only():
    first = {
        "messageId": "a",
        "body": "{}",
        "attributes": {"ApproximateReceiveCount": "1", "ApproximateFirstReceiveTimestamp": "1700000000123"},
    }
    again = {
        "messageId": "b",
        "body": "{}",
        "attributes": {"ApproximateReceiveCount": "2", "ApproximateFirstReceiveTimestamp": "1700000000123"},
    }

    assert Inbound.from_sqs_record(first) == Inbound("a", "{}", 1700000000123.0, first_delivery=True)
    assert not Inbound.from_sqs_record(again).first_delivery
    assert Inbound.from_sqs_record(again).received_ms is None
    assert Inbound.from_sqs_record({"messageId": "c", "body": "{}"}).received_ms is None


class CountingReplies(InMemoryReplies):
    """The in-memory channel, counting the duplicate checks asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.checked: list[int] = []

    def answered_many(self, keys):
        self.checked.append(len(keys))
        return super().answered_many(keys)


def test_only_redeliveries_are_checked_for_an_earlier_answer():
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), CountingReplies()
    batcher = Batcher(FakeResolver(endpoint), replies, clock)
    first = [dataclasses.replace(message(i, one_hot(i), clock), first_delivery=True) for i in range(1, 4)]
    assert batcher.process(first).answered == 3
    assert replies.checked == []  # a first delivery cannot have been answered: no round trip for it
    again = message(1, one_hot(1), clock)  # a redelivery of an answered one, and a new one beside it
    report = batcher.process([again, dataclasses.replace(message(9, one_hot(2), clock), first_delivery=True)])
    assert replies.checked == [1] and report.duplicates == 1 and report.answered == 1
    assert endpoint.calls == [3, 1]


def test_a_copy_delivered_twice_as_first_is_answered_once():
    """SQS may hand out a copy with receive count 1 again: it is computed, and the channel drops its reply."""
    clock, endpoint, replies = FakeClock(), FakeEndpoint(), CountingReplies()
    batcher = Batcher(FakeResolver(endpoint), replies, clock)
    copy = dataclasses.replace(message(1, one_hot(3), clock), first_delivery=True)
    assert batcher.process([copy]).answered == 1
    second = batcher.process([copy])
    assert [r.outputs for r in replies.lists["1"]] == [[3]]
    assert second.answered == 0 and second.duplicates == 1  # counted as what it was


def test_the_cache_is_filled_under_the_keys_a_message_carries_else_under_the_rows_hash():
    from clipper.core.cache_keys import row_keys
    from tests.fakes import InMemoryCache

    clock, endpoint, replies, cache = FakeClock(), FakeEndpoint(), InMemoryReplies(), InMemoryCache()
    batcher = Batcher(FakeResolver(endpoint), replies, clock, cache=cache)
    carried = message(1, one_hot(1, n=2), clock)
    body = QueryMessage.from_json(carried.body).model_copy(update={"cache_keys": ["k-a", "k-b"]}).to_json()
    plain, short = message(2, one_hot(2), clock), message(3, one_hot(3), clock)
    wrong = QueryMessage.from_json(short.body).model_copy(update={"cache_keys": ["x", "y"]}).to_json()  # 2 keys, 1 row
    report = batcher.process([dataclasses.replace(carried, body=body), plain, dataclasses.replace(short, body=wrong)])
    assert report.answered == 3
    hashed = [row_keys("mlp", "1", one_hot(i))[0] for i in (2, 3)]
    assert cache.get_many(["k-a", "k-b", *hashed]) == {"k-a": 1, "k-b": 1, hashed[0]: 2, hashed[1]: 3}


def test_the_frontends_message_carries_the_keys_it_looked_up():
    from clipper.core.cache_keys import row_keys

    rows = one_hot(4, n=3)
    keys = row_keys("mlp", "1", rows)
    payload, _ = encode_rows(rows)
    fields = dict(app="digits", model="mlp", version="1", input_type=InputType.FLOATS, rows=3, payload=payload)
    body = QueryMessage.encode(query_id=1, deadline_ms=1, sent_ms=1, reply_to="r", cache_keys=keys, **fields)
    assert QueryMessage.from_json(body).cache_keys == keys
    assert (
        QueryMessage.from_json(
            QueryMessage.encode(query_id=1, deadline_ms=1, sent_ms=1, reply_to="r", **fields)
        ).cache_keys
        is None
    )


def test_a_row_too_large_for_the_endpoint_fails_its_query_alone():
    """SageMaker takes at most 6 MB a request: a batch over it goes in parts, and a query whose own row is over
    it is answered with the error while the rest of its batch is answered (not failed and retried with it)."""
    import io
    import json

    from botocore.response import StreamingBody

    from clipper.adapters.endpoints import SageMakerModelEndpoint

    class Runtime:  # InvokeEndpoint: the length of each string
        def __init__(self) -> None:
            self.bodies: list[int] = []

        def invoke_endpoint(self, **request):
            self.bodies.append(len(request["Body"]))
            out = json.dumps({"predictions": [len(s) for s in json.loads(request["Body"])["instances"]]}).encode()
            return {"Body": StreamingBody(io.BytesIO(out), len(out)), "ContentType": "application/json"}

    runtime, clock, replies = Runtime(), FakeClock(), InMemoryReplies()
    batcher = Batcher(FakeResolver(SageMakerModelEndpoint(runtime, "e", max_bytes=200)), replies, clock)
    texts = {1: ["a" * 50], 2: ["b" * 300], 3: ["c" * 60, "d" * 70]}
    msgs = []
    for qid, rows in texts.items():
        payload, _ = encode_rows(rows)
        body = QueryMessage(
            query_id=qid,
            app="t",
            model="mlp",
            version="1",
            input_type=InputType.STRINGS,
            rows=len(rows),
            payload=payload,
            deadline_ms=int((clock.now() + 1) * 1000),
            sent_ms=int(clock.now() * 1000),
            reply_to=str(qid),
        ).to_json()
        msgs.append(Inbound(message_id=f"m{qid}", body=body))
    report = batcher.process(msgs)
    assert report.failed == [] and report.answered == 3
    assert replies.lists["1"][0].outputs == [50] and replies.lists["3"][0].outputs == [60, 70]
    (too_large,) = replies.lists["2"]
    assert too_large.outputs is None and "over InvokeEndpoint" in (too_large.error or "")
    assert runtime.bodies and max(runtime.bodies) <= 200


def test_a_batch_the_endpoint_refuses_is_sent_again_in_halves_so_one_bad_input_fails_alone():
    """Found by a new user: a model failing on one query's input (ONNX Runtime's index out of bounds, a 500; or the
    model server's input checks, a 400) failed every query of its batch. A refused batch is sent again in halves:
    a half answered is done, a refused half is halved again, a query refused alone fails alone. Bounded (from a
    review): both halves refused fail with no further call (a model that refuses everything costs 3 calls, not one
    a query), a half past its deadlines fails without a call, and an endpoint that cannot be reached fails the
    batch once."""
    from clipper.errors import BatchRefused

    class Picky(FakeEndpoint):
        bad = 9

        def predict(self, rows):
            if (np.asarray(rows)[:, self.bad] > 0).any():
                self.calls.append(len(rows))
                raise BatchRefused(f"endpoint answered 500: model failed on a batch: idx={self.bad} out of bounds")
            return super().predict(rows)

    clock, replies = FakeClock(), InMemoryReplies()
    picky = Picky()
    batcher = Batcher(FakeResolver(picky), replies, clock)
    msgs = [message(i, one_hot(i, n=2 if i == 3 else 1), clock) for i in (1, 2, 9, 3)]
    report = batcher.process(msgs)
    assert picky.calls == [5, 2, 3, 1, 2]  # the batch; [1, 2] answered; [9, 3] refused: [9] fails, [3] answered
    for q, out in (("1", [1]), ("2", [2]), ("3", [3, 3])):
        assert replies.lists[q][0].outputs == out
    (bad,) = replies.lists["9"]
    assert bad.outputs is None and "idx=9" in bad.error and report.endpoint_errors == 1
    assert report.failed == ["m9"]  # its message comes back (as any endpoint error's), the others' are done

    picky.calls.clear()
    picky.bad = 0  # every input refused: the batch and its two halves, then all fail
    every = [message(i, one_hot(i) + one_hot(0), clock) for i in range(20, 28)]
    report = batcher.process(every)
    assert picky.calls == [8, 4, 4] and report.endpoint_errors == 8 and report.answered == 0

    picky.calls.clear()
    late = [message(i, one_hot(0) + one_hot(i), clock, ttl_s=0.001) for i in (30, 31)]

    class Slow(Picky):
        def predict(self, rows):
            clock.advance(0.01)  # the call outlasts the queries' deadlines: no call for the halves
            return super().predict(rows)

    slow = Slow()
    slow.bad = 0
    report = Batcher(FakeResolver(slow), replies, clock).process(late)
    assert slow.calls == [2] and report.endpoint_errors == 2

    down = FakeEndpoint(fail_with="endpoint unreachable at http://127.0.0.1:1/invocations: ConnectionRefused")
    report = Batcher(FakeResolver(down), replies, clock).process([message(i, one_hot(i), clock) for i in (41, 42, 43)])
    assert down.calls == [3] and report.endpoint_errors == 3
