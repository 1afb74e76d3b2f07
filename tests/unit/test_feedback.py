from __future__ import annotations

import random

import numpy as np
import pytest

from clipper.core.registry_cache import CachedRegistry
from clipper.errors import InvalidInput, NotFound, Unavailable
from clipper.feedback import FeedbackMessage, FeedbackProcessor, FeedbackReceiver
from clipper.frontend.query import QueryProcessor
from clipper.frontend.selection import Selector
from clipper.selection import state_key
from tests.fakes import (
    FakeClock,
    InMemoryCache,
    InMemoryRegistry,
    InMemorySelectionStore,
    ListQueue,
    digits_app,
    model_version,
)
from tests.unit.test_query_processor import InlineQueue, one_hot, world  # noqa: F401  (fixture)

pytestmark = pytest.mark.unit


@pytest.fixture
def learning(world):  # noqa: F811
    """digits-exp4 over three fake models: "good" is always right, "bad" always answers 0."""
    processor, registry, queue, endpoint, clock = world
    registry.apps["ens"] = digits_app(name="ens", policy="exp4")
    registry.links["ens"] = ["good", "bad"]
    for name in ("good", "bad"):
        registry.versions[(name, "1")] = model_version(name)
        registry.active[name] = "1"
    original = endpoint.predict

    def predict(rows, model="good"):
        return original(rows)

    from clipper.batching.core import Batcher
    from tests.fakes import FakeEndpoint

    class BadEndpoint(FakeEndpoint):
        def predict(self, rows):
            return [0] * len(rows)

    class Resolver:
        def endpoint_for(self, model, version):
            return endpoint if model == "good" else BadEndpoint()

    cache, store = InMemoryCache(), InMemorySelectionStore()
    queue.batcher = Batcher(Resolver(), processor._replies, clock, cache=cache)
    ids = iter(range(10**6, 10**9, 1000))
    selector = Selector(registry, store, clock, random.Random(1), ttl_s=0)
    p = QueryProcessor(registry, queue, processor._replies, clock, lambda: next(ids), cache=cache, selector=selector)
    return p, registry, cache, store


def test_exp4_combines_and_reports_confidence(learning):
    p, *_ = learning
    body = p.predict("ens", {"input": one_hot(5)}).as_dict(debug=True)
    assert body["output"] in (5, 0) and body["confidence"] == pytest.approx(0.5)
    assert sorted(body["debug"]["models"]) == ["bad", "good"]
    assert body["debug"]["versions"] == {"bad": "1", "good": "1"}  # each model's, not the first one's alone


def test_feedback_moves_weight_to_the_model_that_is_right(learning):
    p, registry, cache, store = learning
    feedback = FeedbackProcessor(registry, store, cache)
    for i in range(1, 30):
        p.predict("ens", {"input": one_hot(i % 63 + 1)})
        msg = FeedbackMessage(feedback_id=f"f{i}", app="ens", payload=_payload(one_hot(i % 63 + 1)), label=i % 63 + 1)
        assert feedback.process(msg) == "applied"
    weights = store.states[state_key("ens")].weights
    assert weights["good"] > 10 * weights["bad"]
    body = p.predict("ens", {"input": one_hot(9)}).as_dict()
    assert body["output"] == 9 and body["confidence"] > 0.9


def test_redelivered_feedback_changes_nothing(learning):
    p, registry, cache, store = learning
    feedback = FeedbackProcessor(registry, store, cache)
    p.predict("ens", {"input": one_hot(3)})
    msg = FeedbackMessage(feedback_id="once", app="ens", payload=_payload(one_hot(3)), label=3)
    assert feedback.process(msg) == "applied"
    before = store.states[state_key("ens")]
    assert feedback.process(msg) == "duplicate"
    assert store.states[state_key("ens")] == before


def test_feedback_without_a_recorded_prediction_is_skipped(learning):
    _, registry, cache, store = learning
    feedback = FeedbackProcessor(registry, store, cache)
    msg = FeedbackMessage(feedback_id="x", app="ens", payload=_payload(one_hot(8)), label=8)
    assert feedback.process(msg) == "no_record" and store.states == {}


def test_per_user_state_falls_back_to_the_app_and_learns_separately(learning):
    p, registry, cache, store = learning
    registry.apps["ens"] = digits_app(name="ens", policy="exp3")
    feedback = FeedbackProcessor(registry, store, cache)
    p.predict("ens", {"uid": 42, "input": one_hot(4)})
    msg = FeedbackMessage(feedback_id="u", app="ens", user="42", payload=_payload(one_hot(4)), label=4)
    assert feedback.process(msg) == "applied"
    assert state_key("ens", "42") in store.states and state_key("ens") in store.states


def test_receiver_accepts_feedback_of_an_application_its_copy_holds_while_the_registry_is_unavailable():
    inner, clock = InMemoryRegistry(), FakeClock()
    inner.apps["digits"] = digits_app()
    copy = CachedRegistry(inner, clock, ttl_s=2.0, refresh=lambda reload: None, max_stale_s=5.0)
    queue = ListQueue()
    receiver = FeedbackReceiver(copy, queue, "https://sqs.local/feedback")
    assert receiver.accept("digits", {"input": one_hot(1), "label": 1})["accepted"]  # the first read holds it

    def down(name):
        raise Unavailable("registry: ServiceUnavailable")

    inner.get_app = down  # type: ignore[method-assign]
    clock.advance(60)  # past ttl_s + max_stale_s: read from the registry, which fails: answered as held
    assert copy.get_app("digits").name == "digits"
    assert receiver.accept("digits", {"input": one_hot(2), "label": 2})["accepted"]  # validated against the held app
    assert len(queue.sent) == 2
    with pytest.raises(InvalidInput):
        receiver.accept("digits", {"input": [1.0], "label": 2})  # still validated
    with pytest.raises(Unavailable):
        receiver.accept("never-held", {"input": one_hot(2), "label": 2})  # never held: read, and unavailable


def test_feedback_on_an_input_no_linked_model_takes_is_refused_as_its_query_is():
    """A shapeless application takes flat inputs of any length, but predict refuses one that fits none of its
    linked models' shapes (a 400 naming the shape); update accepted it and the worker dropped it later as having
    no record (found by a new user). Refused the same way now; an input that fits, or a 64-value one shaped 8x8,
    is accepted, and an application with no linked model has nothing to check against."""
    inner = InMemoryRegistry()
    inner.apps["shapeless"] = digits_app(name="shapeless", input_shape=None)
    inner.links["shapeless"] = ["mlp"]
    inner.versions[("mlp", "1")] = model_version(input_shape=(8, 8))
    inner.active["mlp"] = "1"
    queue = ListQueue()
    receiver = FeedbackReceiver(inner, queue, "https://sqs.local/feedback")
    with pytest.raises(InvalidInput, match=r"input: expected shape \[8, 8\] \(or 64 flat values\).*shape \[60\]"):
        receiver.accept("shapeless", {"input": [0.5] * 60, "label": 1})
    assert queue.sent == []
    assert receiver.accept("shapeless", {"input": one_hot(3), "label": 3})["accepted"]
    # a canary of another shape answers that shape's queries: its feedback is accepted (the canary's evidence)
    from clipper.core.domain import Canary

    inner.versions[("mlp", "2")] = model_version(version="2", input_shape=(60,))
    inner.canaries["mlp"] = Canary("2", 0.5, 1_700_000_000.0)
    assert receiver.accept("shapeless", {"input": [0.5] * 60, "label": 1})["accepted"]
    del inner.canaries["mlp"]
    # the single policy's queries go to its first linked model only: one that fits the second is refused; a linked
    # model with no active version leaves the others' check in place
    inner.versions[("cnn", "1")] = model_version("cnn", input_shape=(60,))
    inner.active["cnn"] = "1"
    inner.links["shapeless"] = ["mlp", "cnn", "gone"]
    with pytest.raises(InvalidInput, match=r"shape \[8, 8\]"):
        receiver.accept("shapeless", {"input": [0.5] * 60, "label": 1})
    inner.apps["shapeless"] = digits_app(name="shapeless", input_shape=None, policy="exp3")  # every linked one
    assert receiver.accept("shapeless", {"input": [0.5] * 60, "label": 1})["accepted"]
    with pytest.raises(InvalidInput, match=r"the rows of models cnn, mlp, got shape \[59\]"):
        receiver.accept("shapeless", {"input": [0.5] * 59, "label": 1})
    inner.links["shapeless"] = []
    assert receiver.accept("shapeless", {"input": [0.5] * 60, "label": 1})["accepted"]
    assert len(queue.sent) == 4


def test_feedback_after_a_quiet_while_is_checked_against_the_application_as_it_is_now():
    """The receiver validated against the copy's application however old: 15 s after delete_app a feedback was
    accepted (200) and dropped by the worker as "unknown_app" (found by a review helper). Held past its staleness
    bound, the application is read first: deleted is a 404, changed is checked as it is now."""
    inner, clock, reloads = InMemoryRegistry(), FakeClock(), []
    inner.apps["digits"] = digits_app()
    copy = CachedRegistry(inner, clock, ttl_s=2.0, refresh=reloads.append, max_stale_s=5.0)
    queue = ListQueue()
    receiver = FeedbackReceiver(copy, queue, "https://sqs.local/feedback")
    assert receiver.accept("digits", {"input": one_hot(1), "label": 1})["accepted"]
    inner.apps["digits"] = digits_app(input_shape=(32,))  # deleted and added again with rows of 32
    clock.advance(12)  # no feedback for a while (the reload a feedback starts is in flight while it is checked)
    with pytest.raises(InvalidInput, match="shape"):
        receiver.accept("digits", {"input": one_hot(1), "label": 1})  # 64 values: the old application's
    del inner.apps["digits"]
    while reloads:  # what was started has finished
        reloads.pop()()
    clock.advance(12)
    with pytest.raises(NotFound):
        receiver.accept("digits", {"input": one_hot(2), "label": 2})
    assert len(queue.sent) == 1


@pytest.mark.parametrize(("label", "named"), [(None, "got null"), ({}, "got an object"), ([1], "got a list")])
def test_a_label_that_is_neither_number_nor_string_is_named_in_jsons_words(label, named):
    from clipper.feedback.receiving import validate_label

    with pytest.raises(InvalidInput, match=f"label: expected a number or a string, {named}$"):
        validate_label({"label": label})


def test_receiver_validates_before_queueing(learning):
    _, registry, *_ = learning
    queue = ListQueue()
    receiver = FeedbackReceiver(registry, queue, "https://sqs.local/feedback")
    ok = receiver.accept("ens", {"uid": "u1", "input": one_hot(1), "label": 1})
    assert ok["accepted"] and len(queue.sent) == 1
    for body, field in [
        ({"input": one_hot(1), "label": [1]}, "label"),
        ({"input": one_hot(1), "label": True}, "label"),
        ({"input": one_hot(1)}, "label"),
        ({"input": [1.0], "label": 1}, "input"),
        ({"uid": [], "input": one_hot(1), "label": 1}, "uid"),
        # percent-encoded in the user's state key, past DynamoDB's 2,048 bytes: never applied, not even app-wide
        ({"uid": "é" * 400, "input": one_hot(1), "label": 1}, "uid"),
        # beyond a double: accepted, it raised OverflowError in the worker's loss on every delivery
        ({"input": one_hot(1), "label": 10**400}, "label"),
        # with the input, past SQS's 256 KiB: the queue refused it, a 503 for a request no retry makes right
        ({"input": one_hot(1), "label": "x" * 300_000}, "label"),
    ]:
        with pytest.raises(InvalidInput) as e:
            receiver.accept("ens", body)
        assert e.value.field == field
    with pytest.raises(NotFound):
        receiver.accept("nope", {"input": one_hot(1), "label": 1})
    assert len(queue.sent) == 1


def _payload(row):
    import numpy as np

    from clipper.core.messages import encode_rows

    return encode_rows(np.asarray([row], dtype=np.float32))[0]


def test_exp4_answers_with_the_models_that_replied_and_names_the_missing(learning):
    p, registry, *_ = learning
    registry.links["ens"] = ["good", "bad", "ghost"]
    registry.versions[("ghost", "1")] = model_version("ghost", queue_url="https://sqs.local/nobody")
    registry.active["ghost"] = "1"

    queue = p._queue
    inner_send = queue.send

    def send(url, body):  # nobody consumes the ghost's queue
        if url.endswith("/nobody"):
            return ListQueue.send(queue, url, body)
        return inner_send(url, body)

    queue.send = send
    body = p.predict("ens", {"input": one_hot(6)}).as_dict()
    assert body["default"] is False and body["missing_models"] == ["ghost"]
    assert body["confidence"] < 0.7  # a straggler lowers the confidence


def test_metrics_name_each_models_cache_hits(learning, capsys, monkeypatch):
    import json

    from fastapi.testclient import TestClient

    from clipper.frontend.api import create_app
    from clipper.frontend.metrics import EmfQueryMetrics

    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    p, *_ = learning
    client = TestClient(create_app(p, 1 << 20, observe=EmfQueryMetrics()))
    client.post("/ens/predict", json={"input": one_hot(2)})
    client.post("/ens/predict", json={"input": one_hot(2)})
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]

    def value(v):
        return v[0] if isinstance(v, list) else v

    hits = {(m["model"], value(m["CacheHits"])) for m in lines if "CacheHits" in m}
    assert ("good", 0) in hits and ("good", 1) in hits and ("bad", 1) in hits
    assert any("QueryLatency" in m and m["app"] == "ens" for m in lines)


def test_get_metrics_reports_clippers_counters_meters_and_histograms(learning):
    from fastapi.testclient import TestClient

    from clipper.cli import metrics_table
    from clipper.frontend.api import create_app
    from clipper.frontend.metrics import InProcessMetrics

    p, *_ = learning
    metrics = InProcessMetrics()
    client = TestClient(create_app(p, 1 << 20, observe=metrics, metrics=metrics))
    client.post("/ens/predict", json={"input_batch": [one_hot(2), one_hot(3)]})
    client.post("/ens/predict", json={"input": one_hot(2)})
    report = client.get("/metrics").json()
    counters = {k: v for c in report["counters"] for k, v in c.items()}
    assert counters["app:ens:num_predictions"] == 3 and counters["app:ens:default_predictions"] == 0
    assert counters["model:good:1:cache_hits"] == 1 and counters["model:bad:1:cache_misses"] == 2
    (meter,) = [m["app:ens:prediction_throughput"] for m in report["meters"]]
    assert meter["count"] == 3 and meter["rate_1m"] > 0
    hist = next(
        h["app:ens:prediction_latency_ms"] for h in report["histograms"] if "app:ens:prediction_latency_ms" in h
    )
    assert hist["count"] == 2 and hist["min"] <= hist["p50"] <= hist["p99"] <= hist["max"]
    assert "app:ens:prediction_latency_ms" in metrics_table(report)


def test_a_uid_and_a_label_at_their_bounds_are_accepted(learning):
    from clipper.feedback import MAX_LABEL_BYTES
    from clipper.frontend.query import MAX_UID_BYTES

    _, registry, *_ = learning
    queue = ListQueue()
    receiver = FeedbackReceiver(registry, queue, "https://sqs.local/feedback")
    uid, label = "u" * MAX_UID_BYTES, "x" * MAX_LABEL_BYTES
    assert receiver.accept("ens", {"uid": uid, "input": one_hot(1), "label": label})["accepted"]
    assert receiver.accept("ens", {"input": one_hot(1), "label": 2**1000})["accepted"]
    assert len(queue.sent[0][1]) < 256 * 1024


def test_feedback_on_a_prediction_of_the_previous_policy_leaves_the_state_alone(learning):
    p, registry, cache, store = learning
    feedback = FeedbackProcessor(registry, store, cache)
    p.predict("ens", {"input": one_hot(4)})  # chosen by exp4: every model, probabilities its mixing weights
    registry.apps["ens"] = digits_app(name="ens", policy="exp3")  # set_app_policy
    msg = FeedbackMessage(feedback_id="after", app="ens", payload=_payload(one_hot(4)), label=4)
    assert feedback.process(msg) == "policy_changed"
    assert state_key("ens") not in store.states or store.states[state_key("ens")].policy == "exp4"


def test_a_label_of_another_kind_than_the_outputs_is_not_learned(learning, caplog):
    p, registry, cache, store = learning
    feedback = FeedbackProcessor(registry, store, cache)
    p.predict("ens", {"input": one_hot(5)})  # the models answer integers (classes)
    msg = FeedbackMessage(feedback_id="s", app="ens", payload=_payload(one_hot(5)), label="5")
    with caplog.at_level("WARNING", logger="clipper.feedback"):
        assert feedback.process(msg) == "label_mismatch"
    assert state_key("ens") not in store.states  # judged, both models would have lost: "good" with "bad"
    assert any("another kind (string) than the models' outputs (number)" in r.getMessage() for r in caplog.records)
    p.predict("ens", {"input": one_hot(6)})
    float_label = FeedbackMessage(feedback_id="f", app="ens", payload=_payload(one_hot(6)), label=6.0)
    assert feedback.process(float_label) == "applied"  # numbers are one kind: 6.0 judges the class 6
    weights = store.states[state_key("ens")].weights
    assert weights["good"] > weights["bad"]


def test_an_integer_label_beyond_a_double_is_as_far_off_as_can_be():
    from clipper.selection import loss

    assert loss(0.5, 10**400) == 1.0 and loss(10**400, 0.5) == 1.0


def test_a_feedback_sent_again_with_the_clients_feedback_id_is_applied_once(learning):
    p, registry, cache, store = learning
    queue = ListQueue()
    receiver = FeedbackReceiver(registry, queue, "https://sqs.local/feedback")
    feedback = FeedbackProcessor(registry, store, cache)
    p.predict("ens", {"uid": "u", "input": one_hot(6)})
    body = {"uid": "u", "input": one_hot(6), "label": 6, "feedback_id": "order-17:label"}
    first, again = receiver.accept("ens", body), receiver.accept("ens", body)  # a retry after a lost answer
    assert first == again
    outcomes = [feedback.process(FeedbackMessage.from_json(sent)) for _, sent in queue.sent]
    assert outcomes == ["applied", "duplicate"]
    # the same key from another user, or without a key, is another feedback
    other = receiver.accept("ens", {**body, "uid": "v"})["feedback_id"]
    fresh = [receiver.accept("ens", {k: v for k, v in body.items() if k != "feedback_id"}) for _ in range(2)]
    assert len({first["feedback_id"], other, fresh[0]["feedback_id"], fresh[1]["feedback_id"]}) == 4
    # the key sent again with another input or label is another feedback: it was accepted, then dropped by the
    # worker as a duplicate of the first
    p.predict("ens", {"uid": "u", "input": one_hot(7)})
    reused = [
        receiver.accept("ens", {**body, "input": one_hot(7), "label": 7}),
        receiver.accept("ens", {**body, "label": 5}),
    ]
    assert len({first["feedback_id"], *(r["feedback_id"] for r in reused)}) == 3
    assert feedback.process(FeedbackMessage.from_json(queue.sent[-2][1])) == "applied"
    for bad in ("", "a b", "x" * 129, 17, ["k"]):
        with pytest.raises(InvalidInput) as e:
            receiver.accept("ens", {**body, "feedback_id": bad})
        assert e.value.field == "feedback_id"


def test_a_feedback_id_of_an_application_added_again_under_its_name_is_the_new_applications_own(learning):
    """The id derived from a client's feedback_id did not name the application's incarnation: after delete_app and
    add_app under the name, a client numbering its feedbacks 1, 2, 3... had them dropped as duplicates of the
    deleted application's (found by a review helper)."""
    from dataclasses import replace

    p, registry, cache, store = learning
    queue = ListQueue()
    receiver = FeedbackReceiver(registry, queue, "https://sqs.local/feedback")
    feedback = FeedbackProcessor(registry, store, cache)
    body = {"input": one_hot(6), "label": 6, "feedback_id": "1"}
    outcomes = []
    for incarnation in (11, 12):  # 12: deleted and added again
        registry.apps["ens"] = replace(registry.apps["ens"], incarnation=incarnation)
        p.predict("ens", {"input": one_hot(6)})
        receiver.accept("ens", body)
        outcomes.append(feedback.process(FeedbackMessage.from_json(queue.sent[-1][1])))
    assert outcomes == ["applied", "applied"]
    receiver.accept("ens", body)  # the new one's own key sent again: still applied once
    assert feedback.process(FeedbackMessage.from_json(queue.sent[-1][1])) == "duplicate"


def test_the_clients_update_sends_its_feedback_id(monkeypatch):
    from clipper import client_query

    sent = []
    monkeypatch.setattr(client_query, "post", lambda url, body, timeout_s: sent.append(body) or {"accepted": True})
    client_query.update("http://x", "a", [1.0], 1, None, 1.0, feedback_id="k1")
    client_query.update("http://x", "a", [1.0], 1, None, 1.0)
    client_query.update("http://x", "a", [1.0], 1, None, 1.0)
    assert sent[0]["feedback_id"] == "k1"
    assert len({sent[1]["feedback_id"], sent[2]["feedback_id"]}) == 2  # a key of its own for each feedback


@pytest.mark.parametrize("status", [503, 0, 502, 504, 500])
def test_the_clients_update_sends_a_feedback_again_once_with_the_same_key(monkeypatch, status):
    """No answer, or a 5xx (the feedback may be queued all the same: a 503, or a frontend that failed after
    sending it): sent again once with the same key, which the server makes the same feedback (applied once). A 4xx
    is not sent again."""
    from clipper import client_query

    sent: list[dict] = []

    def post(url, body, timeout_s):
        sent.append(dict(body))
        if len(sent) == 1:
            raise client_query.QueryError(status, "service unavailable", "sqs.SendMessage: ReadTimeoutError")
        return {"accepted": True, "feedback_id": "k-derived"}

    monkeypatch.setattr(client_query, "post", post)
    monkeypatch.setattr(client_query, "RETRY_PAUSE_S", 0.0)
    assert client_query.update("http://x", "a", [1.0], 1, None, 1.0)["accepted"]
    assert len(sent) == 2 and sent[0] == sent[1]

    def refused(url, body, timeout_s):
        sent.append(body)
        raise client_query.QueryError(400, "invalid input", "label: ...")

    monkeypatch.setattr(client_query, "post", refused)
    with pytest.raises(client_query.QueryError) as no:
        client_query.update("http://x", "a", [1.0], 1, None, 1.0)
    assert len(sent) == 3 and no.value.feedback_id is None  # refused: not taken, no key to send it again with

    def never(url, body, timeout_s):
        sent.append(dict(body))
        raise client_query.QueryError(status, "service unavailable", "sqs.SendMessage: ReadTimeoutError")

    monkeypatch.setattr(client_query, "post", never)
    with pytest.raises(client_query.QueryError) as unknown:  # both tries: taken or not, unknown
        client_query.update("http://x", "a", [1.0], 1, None, 1.0)
    assert len(sent) == 5 and unknown.value.feedback_id == sent[3]["feedback_id"] == sent[4]["feedback_id"]


def test_a_stale_registry_copy_does_not_reset_the_state_the_new_policy_learned(learning):
    """set_app_policy exp4 -> exp3: a worker whose registry copy still says exp4 gets feedback on a query exp4
    chose (before the switch); the stored state is exp3's. Its copy is read again before anything is reset."""
    from clipper.adapters.clock import SystemClock
    from clipper.core.registry_cache import CachedRegistry
    from clipper.selection import SelectionState

    p, registry, cache, store = learning
    p.predict("ens", {"input": one_hot(8)})  # chosen by exp4
    stale = CachedRegistry(registry, SystemClock(), ttl_s=600)
    assert stale.get_app("ens").policy == "exp4"  # held
    registry.apps["ens"] = digits_app(name="ens", policy="exp3")  # set_app_policy
    exp3 = FeedbackProcessor(registry, store, cache)
    learned = SelectionState.from_dict(
        {"policy": "exp3", "version": 3, "arms": [{"model": "good", "weight": 0.9}, {"model": "bad", "weight": 0.1}]}
    )
    store.states[state_key("ens")] = learned
    worker = FeedbackProcessor(stale, store, cache)
    msg = FeedbackMessage(feedback_id="stale", app="ens", payload=_payload(one_hot(8)), label=8)
    assert worker.process(msg) == "policy_changed"  # read again: the app is exp3 now, the query was exp4's
    assert store.states[state_key("ens")] == learned
    assert exp3.process(msg) == "policy_changed"  # a worker with a fresh copy says the same


def _stale_copy(registry):
    """A registry copy that holds what it read (as the worker's does for up to its TTL)."""
    from clipper.core.registry_cache import CachedRegistry
    from tests.fakes import FakeClock

    return CachedRegistry(registry, FakeClock(), ttl_s=600)


def test_feedback_on_the_new_policys_choice_is_applied_by_a_worker_whose_copy_is_behind(learning):
    """set_app_policy exp4 -> exp3; the frontend (already following it) answers with Exp3's draw; a worker whose
    copy still says exp4 applies the feedback (it reads the registry itself) and drops its copy."""
    p, registry, cache, store = learning
    stale = _stale_copy(registry)
    assert stale.get_app("ens").policy == "exp4"  # held
    registry.apps["ens"] = digits_app(name="ens", policy="exp3")
    p.predict("ens", {"input": one_hot(2)})  # chosen by exp3
    worker = FeedbackProcessor(stale, store, cache)
    msg = FeedbackMessage(feedback_id="new-policy", app="ens", payload=_payload(one_hot(2)), label=2)
    assert worker.process(msg) == "applied"
    assert store.states[state_key("ens")].policy == "exp3"
    assert stale.get_app("ens").policy == "exp3"  # the copy was dropped: the next feedback needs no second read


def test_a_worker_whose_copy_is_behind_a_rollout_does_not_move_the_arm_back(learning):
    """bad 1 -> 2: a worker with a fresh registry restarts bad's arm on version 2 and learns; a worker whose copy
    still has version 1 must not restart it on version 1 (throwing away what version 2 learned), nor drop the
    feedback on version 2's answer."""
    p, registry, cache, store = learning
    stale = _stale_copy(registry)
    assert stale.active_version("bad").version == "1"  # held
    registry.versions[("bad", "2")] = model_version("bad", "2")
    registry.active["bad"] = "2"
    fresh = FeedbackProcessor(registry, store, cache)
    for i in range(1, 5):
        p.predict("ens", {"input": one_hot(i)})
        msg = FeedbackMessage(feedback_id=f"a{i}", app="ens", payload=_payload(one_hot(i)), label=i)
        assert fresh.process(msg) == "applied"
    learned = store.states[state_key("ens")].arm("bad")
    assert learned.version == "2" and learned.pulls == 4
    p.predict("ens", {"input": one_hot(20)})
    msg = FeedbackMessage(feedback_id="b20", app="ens", payload=_payload(one_hot(20)), label=20)
    assert FeedbackProcessor(stale, store, cache).process(msg) == "applied"
    arm = store.states[state_key("ens")].arm("bad")
    assert arm.version == "2" and arm.pulls == 5  # version 2's arm, with this feedback on it


def test_a_worker_whose_copy_is_behind_a_link_keeps_the_new_models_arm(learning):
    p, registry, cache, store = learning
    stale = _stale_copy(registry)
    assert stale.linked_models("ens") == ["good", "bad"]  # held
    registry.versions[("third", "1")] = model_version("third")
    registry.active["third"] = "1"
    registry.links["ens"] = ["good", "bad", "third"]
    p.predict("ens", {"input": one_hot(4)})
    msg = FeedbackMessage(feedback_id="l1", app="ens", payload=_payload(one_hot(4)), label=4)
    assert FeedbackProcessor(registry, store, cache).process(msg) == "applied"
    assert set(store.states[state_key("ens")].models) == {"good", "bad", "third"}
    p.predict("ens", {"input": one_hot(5)})
    msg = FeedbackMessage(feedback_id="l2", app="ens", payload=_payload(one_hot(5)), label=5)
    assert FeedbackProcessor(stale, store, cache).process(msg) == "applied"
    assert set(store.states[state_key("ens")].models) == {"good", "bad", "third"}


def test_a_registry_that_cannot_be_read_fails_the_feedback_rather_than_judging_no_model(learning):
    """A throttled read of the active versions is not "no active version": the feedback fails (the queue
    retries it) and nothing is marked applied, so the retry learns from it."""
    from clipper.errors import Throttled

    p, registry, cache, store = learning

    class Throttling:
        def __getattr__(self, name):
            return getattr(registry, name)

        def active_version(self, model):
            raise Throttled("ProvisionedThroughputExceeded")

    p.predict("ens", {"input": one_hot(3)})
    msg = FeedbackMessage(feedback_id="t", app="ens", payload=_payload(one_hot(3)), label=3)
    with pytest.raises(Throttled):
        FeedbackProcessor(Throttling(), store, cache).process(msg)
    assert state_key("ens") not in store.states
    assert FeedbackProcessor(registry, store, cache).process(msg) == "applied"
    assert sum(a.pulls for a in store.states[state_key("ens")].arms) == 2


def test_feedback_too_large_for_a_queue_message_as_it_travels_is_a_400():
    """SQS counts the message's bytes: a label's control characters travel escaped (6 bytes each) and a string
    input's characters as UTF-8 (up to 4 bytes each); measured as characters both passed and SQS refused the
    message (a 503 no retry could mend)."""
    from clipper.core.domain import InputType
    from clipper.feedback import MAX_LABEL_BYTES
    from tests.fakes import InMemoryRegistry

    registry = InMemoryRegistry()
    registry.apps["t"] = digits_app(name="t", input_type=InputType.STRINGS, input_shape=None)
    queue = ListQueue()
    receiver = FeedbackReceiver(registry, queue, "https://sqs.local/feedback")
    with pytest.raises(InvalidInput) as e:
        receiver.accept("t", {"input": "a" * 200_000, "label": "\x01" * MAX_LABEL_BYTES})
    assert e.value.field == "label"
    with pytest.raises(InvalidInput) as e:
        receiver.accept("t", {"input": "\u4e00" * 70_000, "label": "x"})  # 70,000 characters, 210,000 bytes
    assert e.value.field == "input"
    # at both bounds as they travel: accepted, and the message fits
    largest = "a" * (200 * 1024 - 32)
    receiver.accept("t", {"input": largest, "label": "\x01" * (MAX_LABEL_BYTES // 6)})
    assert queue.sent and len(queue.sent[-1][1].encode()) <= 256 * 1024


def test_a_string_query_goes_by_claim_check_when_its_utf8_bytes_pass_the_inline_limit():
    from clipper.core.messages import MAX_INLINE_PAYLOAD, encode_rows

    chars = MAX_INLINE_PAYLOAD // 2  # under the limit in characters, over it in bytes (3 a character)
    payload, blob = encode_rows(["\u4e00" * chars])
    assert blob is not None and payload.strings is None
    payload, blob = encode_rows(["a" * chars])
    assert blob is None and payload.strings == ["a" * chars]


def test_feedback_for_an_application_the_workers_copy_holds_as_missing_is_applied(learning):
    """The copy keeps "no such application" for a second: feedback for an application added in that second is
    not taken for feedback of a deleted one."""
    p, registry, cache, store = learning
    stale = _stale_copy(registry)
    with pytest.raises(NotFound):
        stale.get_app("later")
    registry.apps["later"] = digits_app(name="later", policy="exp4")
    registry.links["later"] = ["good", "bad"]
    p.predict("later", {"input": one_hot(6)})
    msg = FeedbackMessage(feedback_id="later", app="later", payload=_payload(one_hot(6)), label=6)
    assert FeedbackProcessor(stale, store, cache).process(msg) == "applied"
    assert stale.get_app("later").name == "later"  # the copy was dropped
    gone = FeedbackMessage(feedback_id="gone", app="nope", payload=_payload(one_hot(6)), label=6)
    assert FeedbackProcessor(stale, store, cache).process(gone) == "unknown_app"


def _roll_out_bad_v2(registry):
    registry.versions[("bad", "2")] = model_version("bad", "2")
    registry.active["bad"] = "2"


def test_a_worker_behind_a_rollout_learns_the_first_answer_of_the_new_version(learning):
    """The app-wide state still on bad:1 agrees with a copy behind the rollout: the record says bad:2 answered,
    so the registry is read, bad's arm restarts on version 2 and counts this feedback."""
    p, registry, cache, store = learning
    stale = _stale_copy(registry)
    assert stale.active_version("bad").version == "1"
    p.predict("ens", {"input": one_hot(1)})
    msg = FeedbackMessage(feedback_id="x0", app="ens", payload=_payload(one_hot(1)), label=1)
    assert FeedbackProcessor(registry, store, cache).process(msg) == "applied"
    _roll_out_bad_v2(registry)
    p.predict("ens", {"input": one_hot(3)})
    msg = FeedbackMessage(feedback_id="x1", app="ens", payload=_payload(one_hot(3)), label=3)
    assert FeedbackProcessor(stale, store, cache).process(msg) == "applied"
    arm = store.states[state_key("ens")].arm("bad")
    assert arm.version == "2" and arm.pulls == 1


def test_a_users_state_is_not_written_before_the_app_wide_state_shows_the_copy_behind(learning):
    """User B learned before the rollout (bad:1); the app-wide state after it (bad:2, by a worker with a fresh
    copy). A worker behind the rollout gets B's feedback on bad:2's answer: B's arm restarts on version 2 and
    counts it (checked against every state before any is written, B's is not saved on the copy's word first)."""
    p, registry, cache, store = learning
    stale = _stale_copy(registry)
    assert stale.active_version("bad").version == "1"
    fresh = FeedbackProcessor(registry, store, cache)
    p.predict("ens", {"uid": "B", "input": one_hot(1)})
    assert fresh.process(FeedbackMessage(feedback_id="b0", app="ens", user="B", payload=_payload(one_hot(1)), label=1))
    _roll_out_bad_v2(registry)
    p.predict("ens", {"uid": "A", "input": one_hot(2)})
    assert fresh.process(FeedbackMessage(feedback_id="a0", app="ens", user="A", payload=_payload(one_hot(2)), label=2))
    assert store.states[state_key("ens")].arm("bad").version == "2"
    p.predict("ens", {"uid": "B", "input": one_hot(3)})
    msg = FeedbackMessage(feedback_id="b1", app="ens", user="B", payload=_payload(one_hot(3)), label=3)
    assert FeedbackProcessor(stale, store, cache).process(msg) == "applied"
    arm = store.states[state_key("ens", "B")].arm("bad")
    assert arm.version == "2" and arm.pulls == 1


def test_a_canary_started_within_the_copys_lag_gets_its_evidence(learning):
    """A single-model application, a canary of good:2 started moments ago: the record says good:2 answered; a
    worker whose copy knows no canary reads the registry and adds the evidence (not "not_learning")."""
    import numpy as np

    from clipper.core.cache_keys import record_keys
    from clipper.core.domain import Canary
    from clipper.selection import Selection
    from tests.fakes import InMemoryCanaryEvidence

    _, registry, cache, store = learning
    registry.apps["ens"] = digits_app(name="ens", policy="single")
    stale = _stale_copy(registry)
    assert stale.canary("good") is None
    registry.versions[("good", "2")] = model_version("good", "2")
    registry.canaries["good"] = canary = Canary("2", 0.5, 1_700_000_000.0)
    (key,) = record_keys("ens", None, np.asarray([one_hot(3)], dtype=np.float32))
    selection = Selection("single", ("good",), {"good": 1.0, "bad": 0.0})
    cache.entries[key] = {"selection": selection.to_dict(), "outputs": {"good": 3}, "versions": {"good": "2"}}
    cache.entries[key]["trials"] = {"good": canary.trial}
    evidence = InMemoryCanaryEvidence()
    msg = FeedbackMessage(feedback_id="c1", app="ens", payload=_payload(one_hot(3)), label=3)
    assert FeedbackProcessor(stale, store, cache, evidence=evidence).process(msg) == "canary_only"
    assert [(m, v, e.feedback) for (m, _, v), e in evidence.counts.items()] == [("good", "2", 1)]


def test_the_frontends_record_names_the_trial_its_answer_was_in_and_the_feedback_counts_there(learning):
    from clipper.core.domain import Canary
    from tests.fakes import InMemoryCanaryEvidence

    p, registry, cache, store = learning  # "ens": exp4 over good and bad, so every query is recorded
    registry.versions[("good", "2")] = model_version("good", "2")
    registry.canaries["good"] = first = Canary("2", 0.5, 1_700_000_000.0)
    p.predict("ens", {"input": one_hot(4)})
    (record,) = [e for e in cache.entries.values() if isinstance(e, dict) and "trials" in e]
    assert record["trials"] == {"good": first.trial}
    registry.canaries["good"] = second = Canary("2", 0.5, 1_700_000_600.0)  # aborted and started again
    evidence = InMemoryCanaryEvidence()
    feedback = FeedbackProcessor(registry, store, cache, evidence=evidence)
    late = FeedbackMessage(feedback_id="late", app="ens", payload=_payload(one_hot(4)), label=4)
    assert feedback.process(late) == "applied" and evidence.counts == {}  # the first trial's answer
    p.predict("ens", {"input": one_hot(5)})
    now = FeedbackMessage(feedback_id="now", app="ens", payload=_payload(one_hot(5)), label=5)
    assert feedback.process(now) == "applied"
    assert [(m, t) for (m, t, _) in evidence.counts] == [("good", second.trial)]


@pytest.mark.parametrize("policy", ["exp4", "exp3", "epsilon_greedy"])
def test_a_model_that_gives_no_output_loses_its_share(learning, policy):
    """A selected model that gave no output (no reply within the SLO) was not judged: a model that stopped
    answering kept the share it had, and won what the others lost on their mistakes (under Exp3 its draw
    probability went to ~1: most queries answered the default). It now loses as a wrong answer does."""
    p, registry, cache, store = learning
    registry.apps["ens"] = digits_app(name="ens", policy=policy)
    registry.links["ens"] = ["good", "ghost"]
    registry.versions[("ghost", "1")] = model_version("ghost", queue_url="https://sqs.local/nobody")
    registry.active["ghost"] = "1"
    queue = p._queue
    inner_send = queue.send

    def send(url, body):  # nobody consumes the ghost's queue
        if url.endswith("/nobody"):
            return ListQueue.send(queue, url, body)
        return inner_send(url, body)

    queue.send = send
    feedback = FeedbackProcessor(registry, store, cache)
    for i in range(1, 151):  # epsilon_greedy asks the ghost 1 in 20; every input distinct
        x = [v * (1 + i // 63) for v in one_hot(i % 63 + 1)]
        p.predict("ens", {"input": x})
        msg = FeedbackMessage(feedback_id=f"g{i}", app="ens", payload=_payload(x), label=i % 63 + 1)
        assert feedback.process(msg) == "applied"  # a query the ghost alone was asked is recorded too
    state = store.states[state_key("ens")]
    ghost = next(a for a in state.arms if a.model == "ghost")
    assert ghost.pulls >= 1 and ghost.losses == ghost.pulls  # every time it was asked, a loss
    assert state.weights["good"] > 3 * state.weights["ghost"]


def test_a_model_is_not_charged_for_the_frontends_own_failures_nor_a_failed_retry(learning):
    """The review of d8af522: every selected model without an output was recorded as missing, whatever the
    cause: with the queue down every model lost on every feedback; and a retry of an answered input that failed
    replaced the answered record, charging every model for the answer the user did get."""
    p, registry, cache, store = learning
    feedback = FeedbackProcessor(registry, store, cache)
    p._queue.down = True  # the frontend's dependency, no model's doing
    x = one_hot(9)
    assert p.predict("ens", {"input": x}).predictions[0].default
    assert feedback.process(FeedbackMessage(feedback_id="q", app="ens", payload=_payload(x), label=9)) == "no_record"
    p._queue.down = False
    y = one_hot(10)
    assert p.predict("ens", {"input": y}).predictions[0].output in (10, 0)  # answered by both
    for k in [k for k in cache.entries if not k.startswith("rec:")]:
        del cache.entries[k]  # the predictions expired, the record kept: the retry asks the models again
    answered = dict(cache.entries)
    registry.links["ens"] = ["good", "bad", "ghost"]
    registry.versions[("ghost", "1")] = model_version("ghost", queue_url="https://sqs.local/nobody")
    registry.active["ghost"] = "1"
    inner_send = p._queue.send
    p._queue.send = lambda url, body: ListQueue.send(p._queue, url, body)  # nobody answers: every model times out
    assert p.predict("ens", {"input": y}).predictions[0].default
    p._queue.send = inner_send
    assert cache.entries == answered  # the answered record stands
    registry.links["ens"] = ["good", "bad"]
    assert feedback.process(FeedbackMessage(feedback_id="r", app="ens", payload=_payload(y), label=10)) == "applied"
    state = store.states[state_key("ens")]
    assert state.arm("good").losses == 0.0 and state.arm("bad").losses == 1.0  # judged on the answer given


def test_a_feedback_judges_the_prediction_of_its_input_when_it_was_accepted(learning):
    """A new user's run: exp3 answered an input with one model, the feedback was accepted, the same user queried
    the input again (another model answered, its record replacing the first's), and the worker, reading the record
    when it applied the feedback, charged the label to the later answer's model. The frontend now reads the record
    when it accepts the feedback and it travels in the message."""
    from clipper.core.cache_keys import record_keys
    from clipper.selection import Selection

    p, registry, cache, store = learning
    registry.apps["e3"] = digits_app(name="e3", policy="exp3")
    registry.links["e3"] = ["good", "bad"]
    queue = ListQueue()
    receiver = FeedbackReceiver(registry, queue, "https://sqs.local/feedback", cache)
    feedback = FeedbackProcessor(registry, store, cache)
    body = {"uid": "u", "input": one_hot(5)}
    (key,) = record_keys("e3", "u", np.asarray([one_hot(5)], dtype=np.float32))

    def chosen() -> str:
        (model,) = Selection.from_dict(cache.get_many([key])[key]["selection"]).models
        return model

    p.predict("e3", body)
    first = chosen()
    receiver.accept("e3", {**body, "label": 7})  # neither model says 7: the model that answered loses
    for _ in range(200):  # the same input queried again until the other model answers it
        p.predict("e3", body)
        if chosen() != first:
            break
    assert chosen() != first
    assert store.load(state_key("e3")) is None  # no feedback yet: the arms start even
    (message,) = [FeedbackMessage.from_json(sent) for _, sent in queue.sent]
    assert message.record is not None
    assert feedback.process(message) == "applied"
    weights = store.load(state_key("e3")).weights
    other = "bad" if first == "good" else "good"
    assert weights[first] < weights[other], (first, weights)  # the model that answered the labelled query lost
    # without the record in the message (an older frontend's), the worker reads the cache's: the later answer's
    assert feedback.process(message.model_copy(update={"record": None, "feedback_id": "again"})) == "applied"


@pytest.mark.parametrize("trouble", ["missing table", "hung"])
def test_the_record_read_at_accept_is_best_effort_and_bounded(learning, trouble):
    """A review: the read of the query's record at accept let a missing cache table through as a 404 ('unknown
    application': the feedback not queued), and a hung cache held the request past the frontend's timeout. The
    feedback is now queued without the record (the worker reads it), within the read's budget."""
    import threading
    import time

    from clipper.feedback import receiving

    p, registry, cache, store = learning
    p.predict("ens", {"input": one_hot(4)})
    release = threading.Event()

    class Troubled(InMemoryCache):
        def get_many(self, keys, timeout=None):
            if trouble == "hung":
                release.wait(5)
                return {}
            raise NotFound("resource", "dynamodb.BatchGetItem(cache) (ResourceNotFoundException)")

    queue = ListQueue()
    receiver = FeedbackReceiver(registry, queue, "https://sqs.local/feedback", Troubled())
    try:
        started = time.monotonic()
        assert receiver.accept("ens", {"input": one_hot(4), "label": 4})["accepted"] is True
        assert time.monotonic() - started < receiving.RECORD_READ_S + 0.5
        (message,) = [FeedbackMessage.from_json(sent) for _, sent in queue.sent]
        assert message.record is None
        # the worker reads the record itself, from the cache it uses
        assert FeedbackProcessor(registry, store, cache).process(message) == "applied"
        if trouble == "hung":  # reads in flight are bounded: past them, none is started
            for _ in range(receiving.MAX_RECORD_READS + 2):
                receiver.accept("ens", {"input": one_hot(4), "label": 4})
            assert receiver._reads <= receiving.MAX_RECORD_READS
    finally:
        release.set()
