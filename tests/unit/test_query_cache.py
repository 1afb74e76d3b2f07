from __future__ import annotations

import pytest

from clipper.batching.core import Batcher
from clipper.core.cache_keys import row_keys
from clipper.frontend.query import QueryProcessor
from clipper.frontend.results import QueryTicket
from tests.fakes import FakeResolver, InMemoryCache, model_version
from tests.unit.test_query_processor import InlineQueue, one_hot, world  # noqa: F401  (fixture)

pytestmark = pytest.mark.unit


@pytest.fixture
def cached(world):  # noqa: F811
    processor, registry, queue, endpoint, clock = world
    cache = InMemoryCache(clock=clock)
    replies = processor._replies
    queue.batcher = Batcher(FakeResolver(endpoint), replies, clock, cache=cache)
    ids = iter(range(10**6, 10**9, 1000))
    p = QueryProcessor(registry, queue, replies, clock, lambda: next(ids), cache=cache, cache_poll_s=0)
    return p, registry, queue, endpoint, cache


def test_a_hit_never_reaches_the_queue_or_the_model(cached):
    p, _, queue, endpoint, _ = cached
    first = p.predict("digits", {"input": one_hot(3)})
    again = p.predict("digits", {"input": one_hot(3)})
    assert first.predictions[0].output == again.predictions[0].output == 3
    assert (first.cache_hits, again.cache_hits) == (0, 1)
    assert len(queue.sent) == 1 and endpoint.calls == [1]


def test_batch_sends_only_the_misses_and_answers_in_order(cached):
    p, _, _queue, endpoint, _ = cached
    p.predict("digits", {"input_batch": [one_hot(1), one_hot(2)]})
    result = p.predict("digits", {"input_batch": [one_hot(2), one_hot(5), one_hot(1), one_hot(6)]})
    assert [x.output for x in result.predictions] == [2, 5, 1, 6]
    assert result.cache_hits == 2 and endpoint.calls == [2, 2]


def test_identical_rows_in_one_batch_are_computed_once(cached):
    p, _, _, endpoint, _ = cached
    result = p.predict("digits", {"input_batch": [one_hot(4)] * 3})
    assert [x.output for x in result.predictions] == [4, 4, 4] and endpoint.calls == [1]


def test_versions_never_share_entries(cached):
    p, registry, _, endpoint, _cache = cached
    p.predict("digits", {"input": one_hot(3)})
    registry.versions[("mlp", "2")] = model_version(version="2")
    registry.active["mlp"] = "2"
    result = p.predict("digits", {"input": one_hot(3)})
    assert result.cache_hits == 0 and endpoint.calls == [1, 1]
    assert row_keys("mlp", "1", [b"x"]) != row_keys("mlp", "2", [b"x"])


def test_a_version_registered_again_after_its_delete_never_answers_the_deleted_ones_entries(cached):
    """The keys named (model, version, input): after a delete and a new upload under the version's name, the
    deleted file's predictions were answered for up to the cache's TTL."""
    from dataclasses import replace

    p, registry, _, endpoint, _cache = cached
    registry.versions[("mlp", "1")] = replace(model_version(), created_at=1_000)
    p.predict("digits", {"input": one_hot(3)})
    registry.versions[("mlp", "1")] = replace(model_version(), created_at=2_000)  # deleted, registered again
    result = p.predict("digits", {"input": one_hot(3)})
    assert result.cache_hits == 0 and endpoint.calls == [1, 1]
    assert p.predict("digits", {"input": one_hot(3)}).cache_hits == 1  # its own entries are hits


def test_concurrent_identical_query_waits_for_the_first_computation(cached):
    p, _, queue, endpoint, cache = cached
    import numpy as np

    key = row_keys("mlp", "1", np.asarray([one_hot(7)], dtype=np.float32))[0]
    cache.claims.add(key)  # another frontend is computing this input right now
    queue.batcher = None
    original = cache.get_many
    calls = {"n": 0}

    def answer_later(keys):
        calls["n"] += 1
        if calls["n"] == 3:  # the other query's batcher fills the cache meanwhile
            cache.entries[key] = 7
        return original(keys)

    cache.get_many = answer_later
    result = p.predict("digits", {"input": one_hot(7)})
    assert result.predictions[0].output == 7 and not result.predictions[0].default
    assert queue.sent == [] and endpoint.calls == []


def test_cache_down_means_compute_not_fail(cached):
    p, _, _queue, endpoint, cache = cached
    cache.down = True
    result = p.predict("digits", {"input": one_hot(2)})
    assert result.predictions[0].output == 2 and endpoint.calls == [1]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("m", "1", [b"ab"]), ("m", "1", ["ab"])),  # bytes vs string
        (("m", "1", [b"ab"]), ("m", "11", [b"ab"])),
        (("m1", "1", [b"x"]), ("m", "11", [b"x"])),  # no ambiguity from concatenation
    ],
)
def test_keys_do_not_collide(a, b):
    assert row_keys(*a) != row_keys(*b)


def test_numeric_keys_depend_on_dtype_and_shape():
    import numpy as np

    x = np.arange(8, dtype=np.int32)
    assert row_keys("m", "1", x.reshape(1, 8)) != row_keys("m", "1", x.reshape(1, 2, 4))
    assert row_keys("m", "1", x.reshape(1, 8)) != row_keys("m", "1", x.view(np.float32).reshape(1, 8))
    assert row_keys("m", "1", x.reshape(1, 8)) == row_keys("m", "1", x.copy().reshape(1, 8))


def _holder_fails(cached, key: str, cause: str) -> None:
    """Another query holds the claim on ``key`` and its model fails: it releases the claim with its cause
    once the follower has started waiting."""
    _p, _, queue, _endpoint, cache = cached
    cache.claims.add(key)
    cache.owners[key] = "other"
    queue.batcher = None
    original = cache.get_many

    def fail_later(keys):
        if key in keys and cache.clock.t >= START + 0.02:
            cache.fail_many({key: cause}, 0.25, owner="other")
        return original(keys)

    cache.get_many = fail_later


START = 1_700_000_000.0


def test_a_follower_gets_the_owners_failure_at_once_not_at_its_deadline(cached):
    import numpy as np

    p, _, queue, endpoint, cache = cached
    key = row_keys("mlp", "1", np.asarray([one_hot(7)], dtype=np.float32))[0]
    _holder_fails(cached, key, "model mlp:1: endpoint error: boom")
    result = p.predict("digits", {"input": one_hot(7)})
    (pred,) = result.predictions
    assert pred.default and pred.default_explanation == "model mlp:1: endpoint error: boom"
    assert cache.clock.t - START < 0.06  # a few polls, not the 100 ms SLO
    assert queue.sent == [] and endpoint.calls == []
    # the owner's query counts the model's error; this one, which asked no model, counts neither kind
    assert result.model_errors == [] and result.transport_failures == []


def test_an_owner_whose_model_fails_releases_its_claims_with_the_cause(cached):
    p, _, _queue, endpoint, cache = cached
    endpoint.fail_with = "boom"
    result = p.predict("digits", {"input_batch": [one_hot(1), one_hot(2), one_hot(1)]})
    assert all(x.default for x in result.predictions)
    assert len(cache.failed) == 2 and all("endpoint error: boom" in c for c in cache.failed.values())


def test_an_owner_without_a_reply_ends_its_claims_instead_of_failing_its_followers(cached):
    """Out of time, the owner leaves no failure: a follower with time left computes the input itself."""
    p, _, queue, _endpoint, cache = cached
    queue.batcher = None  # nobody answers
    result = p.predict("digits", {"input": one_hot(3)})
    assert result.predictions[0].default and "timeout" in result.predictions[0].default_explanation
    assert cache.failed == {} and cache.claims == set()


def _claimed_by_another_query(cached, key: str, ends_at: float) -> None:
    """Another query holds the claim on ``key`` and runs out of time at ``ends_at``: it ends its claim."""
    _p, _, _queue, _endpoint, cache = cached
    cache.claims.add(key)
    cache.owners[key] = "other"
    original = cache.get_many

    def release_later(keys):
        if key in keys and cache.clock.t >= ends_at:
            cache.release([key], "other")
        return original(keys)

    cache.get_many = release_later


def test_a_follower_computes_the_input_itself_when_its_owner_ran_out_of_time(cached):
    """The owner (say on an app with a 10 ms SLO) gave up; this query (100 ms) has time left: it claims the input
    and sends it (it took the owner's timeout as its own default at once)."""
    import numpy as np

    p, _, queue, endpoint, cache = cached
    key = row_keys("mlp", "1", np.asarray([one_hot(7)], dtype=np.float32))[0]
    _claimed_by_another_query(cached, key, START + 0.03)
    result = p.predict("digits", {"input": one_hot(7), "debug": True})
    (pred,) = result.predictions
    assert not pred.default and pred.output == 7
    assert len(queue.sent) == 1 and endpoint.calls == [1]
    assert cache.entries[key] == 7 and cache.claims == set()  # the follower's answer fills the cache for the rest
    assert result.model_errors == [] and "send" in result.model_timings_ms["mlp"]


def test_a_follower_whose_own_send_times_out_ends_its_claim_and_defaults_with_its_own_timeout(cached):
    import numpy as np

    p, _, queue, _endpoint, cache = cached
    key = row_keys("mlp", "1", np.asarray([one_hot(7)], dtype=np.float32))[0]
    _claimed_by_another_query(cached, key, START + 0.03)
    queue.batcher = None  # nobody answers this one either
    ticket = QueryTicket()
    result = p.predict("digits", {"input": one_hot(7)}, ticket)
    (pred,) = result.predictions
    assert pred.default and "timeout, no reply within the SLO" in pred.default_explanation
    assert len(queue.sent) == 1 and result.model_errors == ["mlp"]  # its own send: the model's timeout
    assert cache.claims == set() and cache.failed == {}
    # what a late default (the watchdog's) would name: its own send, not other queries' computations
    assert ticket.stage == "waiting for replies from model mlp:1, sent for inputs whose computing query gave them up"


def test_a_follower_does_not_take_over_with_less_time_left_than_the_model_usually_takes(cached):
    """A quarter of the SLO is left (25 of 100 ms) but the model usually answers in 80 ms: no send, the default."""
    import numpy as np

    from clipper.frontend.results import ModelAnswer

    p, _, queue, _endpoint, _cache = cached
    gatherer = p._gatherer
    gatherer.observe(ModelAnswer(model_version(), [None], reply_timings={"queue_ms": 70.0, "inference_ms": 10.0}))
    assert gatherer.usual_answer_s(model_version()) == pytest.approx(0.08)
    key = row_keys("mlp", "1", np.asarray([one_hot(7)], dtype=np.float32))[0]
    _claimed_by_another_query(cached, key, START + 0.04)  # released with ~58 ms left
    result = p.predict("digits", {"input": one_hot(7)})
    assert result.predictions[0].default and queue.sent == []


def test_a_models_usual_answer_time_is_its_own_per_version_and_a_timeout_counts_as_at_least_its_wait(cached):
    """In an ensemble whose other model is down, a query's wait ends at its deadline: the healthy model's usual
    time is its own reported one (it was charged the whole wait, and followers never took over its inputs). A canary
    version has its own. A version that gave no reply by the deadline counts as at least that long."""
    from clipper.core.messages import Reply
    from clipper.frontend import steps
    from clipper.frontend.fanout import Fanout
    from clipper.frontend.results import ModelAnswer

    p, registry, _queue, _endpoint, cache = cached
    gatherer, clock, app = p._gatherer, cache.clock, registry.apps["digits"]
    fast, down, canary = model_version("a"), model_version("b"), model_version("a", version="2")
    answers = [ModelAnswer(fast, [None], sent_at=clock.now()), ModelAnswer(down, [None], sent_at=clock.now())]
    fan = Fanout(answers, clock.now() + 1.0)
    fan.sent = {"a": (answers[0], [0]), "b": (answers[1], [0])}
    clock.advance(1.0)  # the wait ended at the deadline, b never replied
    fast_reply = Reply(query_id=1, model="a", version="1", outputs=[3], timings={"queue_ms": 4.0, "inference_ms": 1.0})
    steps.run(gatherer.absorb(app, fan, [fast_reply]))
    assert answers[0].outputs == [3] and answers[1].failure == "timeout"
    assert gatherer.usual_answer_s(fast) == pytest.approx(0.005)
    assert gatherer.usual_answer_s(down) == pytest.approx(1.0)
    assert gatherer.usual_answer_s(canary) == 0.0
    gatherer.observe(ModelAnswer(canary, [None], reply_timings={"queue_ms": 400.0, "inference_ms": 100.0}))
    assert gatherer.usual_answer_s(canary) == pytest.approx(0.5)
    assert gatherer.usual_answer_s(fast) == pytest.approx(0.005)
    gatherer.observe(ModelAnswer(fast, [None], reply_timings={"queue_ms": 14.0, "inference_ms": 1.0}))
    assert gatherer.usual_answer_s(fast) == pytest.approx(0.006)  # a moving average


def test_a_follower_with_too_little_time_left_does_not_take_over(cached):
    """The owner ends its claim when this query has less than a quarter of its SLO left: it sends nothing (its
    batcher would likely drop the message as expired) and answers the default."""
    import numpy as np

    from clipper.frontend.fanout import ANSWER_MARGIN_S, takeover_time

    p, registry, queue, _endpoint, cache = cached
    key = row_keys("mlp", "1", np.asarray([one_hot(7)], dtype=np.float32))[0]
    cache.claims.add(key)
    cache.owners[key] = "other"
    app = registry.apps["digits"]
    deadline, enough = START + app.slo_seconds, takeover_time(app)
    assert enough == app.slo_seconds / 4
    original, polls = cache.get_many, []

    def late_release(keys):
        polls.append(cache.clock.t)
        if len(polls) == 1:  # this poll ends with just under enough left (get_many takes 10 ms of the clock)
            cache.clock.t = deadline - ANSWER_MARGIN_S - enough * 0.9 - 0.01
        else:
            cache.release([key], "other")
        return original(keys)

    cache.get_many = late_release
    result = p.predict("digits", {"input": one_hot(7)})
    assert result.predictions[0].default and queue.sent == [] and len(polls) >= 2


def test_a_timed_out_querys_unconfirmed_release_is_not_a_warning_but_an_earlier_failure_is(cached, caplog):
    """At its deadline a query's release of its claims is sent with no time left to confirm it: under overload
    every late query would log a warning that says nothing (the commands went out). With time left, a release that
    fails is a warning."""
    from clipper.errors import Unavailable

    p, _, queue, endpoint, cache = cached

    def unconfirmed(*args, **kwargs):
        raise Unavailable("redis: no answer in time")

    cache.fail_many = cache.release = unconfirmed
    replies, wait = p._replies, p._replies.wait

    def wait_out(reply_to, models, timeout_s):  # as a real reply channel: nothing came, so it waited it all
        got = wait(reply_to, models, timeout_s)
        if not got:
            cache.clock.advance(timeout_s)
        return got

    replies.wait = wait_out
    queue.batcher = None  # nobody answers: the query times out
    with caplog.at_level("DEBUG", logger="clipper.frontend.fanout"):
        assert p.predict("digits", {"input": one_hot(3)}).predictions[0].default
    assert [r.levelname for r in caplog.records if "claims" in r.getMessage()] == ["DEBUG"]
    caplog.clear()
    queue.batcher = Batcher(FakeResolver(endpoint), p._replies, cache.clock, cache=cache)
    endpoint.fail_with = "boom"  # the model fails at once: the release has the query's time left
    with caplog.at_level("DEBUG", logger="clipper.frontend.fanout"):
        assert p.predict("digits", {"input": one_hot(4)}).predictions[0].default
    assert [r.levelname for r in caplog.records if "claims" in r.getMessage()] == ["WARNING"]


def test_identical_rows_of_a_query_take_the_first_rows_output_without_waiting(cached):
    p, _, _, endpoint, cache = cached
    polls = []
    original = cache.poll
    cache.poll = lambda keys: polls.append(keys) or original(keys)
    result = p.predict("digits", {"input_batch": [one_hot(4), one_hot(5), one_hot(4)]})
    assert [x.output for x in result.predictions] == [4, 5, 4] and endpoint.calls == [2]
    assert polls == []  # the repeated row is filled from the first, not awaited in the cache


def test_a_late_follower_says_it_waits_for_other_queries_not_for_an_empty_list_of_models(cached):
    """A query all of whose rows another query is computing sends nothing: when it is answered late (the watchdog's
    default), the explanation names what it waits for, not "replies from " and an empty list of models."""
    import numpy as np

    from clipper.frontend import steps
    from clipper.frontend.results import QueryTicket

    p, _, queue, _endpoint, cache = cached
    key = row_keys("mlp", "1", np.asarray([one_hot(7)], dtype=np.float32))[0]
    cache.claims.add(key)  # another frontend is computing this input right now
    queue.batcher = None
    ticket = QueryTicket()
    started = steps.run(p.start("digits", {"input": one_hot(7)}, ticket))
    assert queue.sent == [] and started.fanout.followers
    why = p.late(ticket).predictions[0].default_explanation
    assert "still waiting for the answers of model mlp:1 for inputs that other queries are computing" in why
    assert "replies from" not in why


def test_a_late_query_names_the_models_it_sent_to(cached):
    from clipper.frontend import steps
    from clipper.frontend.results import QueryTicket

    p, _, queue, _endpoint, _cache = cached
    queue.batcher = None  # nobody answers
    ticket = QueryTicket()
    steps.run(p.start("digits", {"input": one_hot(5)}, ticket))
    late = p.late(ticket)
    assert "still waiting for replies from model mlp:1 (a dependency" in late.predictions[0].default_explanation
    assert late.model_errors == [] and late.transport_failures == ["mlp"]  # held up by a dependency, not the model


def _key(i: int) -> str:
    import numpy as np

    return row_keys("mlp", "1", np.asarray([one_hot(i)], dtype=np.float32))[0]


def _followed(cached, events: dict[str, tuple[float, str, object]]) -> None:
    """Other queries hold the claims on these keys; at a clock time each fills its key with an output
    ("fill") or leaves its model's failure in the claim ("fail")."""
    _p, _, _queue, _endpoint, cache = cached
    for key in events:
        cache.claims.add(key)
        cache.owners[key] = f"other-{key}"
    original = cache.get_many

    def later(keys):
        for key, (at, what, value) in events.items():
            if key in keys and cache.clock.t >= at and cache.owners.get(key) == f"other-{key}":
                if what == "fill":
                    cache.put_many({key: value})
                elif key not in cache.failed:
                    cache.fail_many({key: str(value)}, 0.25, owner=f"other-{key}")
        return original(keys)

    cache.get_many = later


def test_a_followed_rows_failure_does_not_end_the_wait_for_the_querys_other_followed_rows(cached):
    """A batch of two inputs, each computed by another query: the first one's model fails on its input (a null
    output for that input, say), the second one's answers later. The first row is the default with the cause, the
    second is answered (its owner answered within this query's SLO); it was the default too."""
    p, _, queue, endpoint, _cache = cached
    x, y = _key(3), _key(5)
    _followed(
        cached, {x: (START + 0.02, "fail", "model mlp:1: no answer for 1 of 1 inputs"), y: (START + 0.05, "fill", 5)}
    )
    result = p.predict("digits", {"input_batch": [one_hot(3), one_hot(5)]})
    first, second = result.predictions
    assert first.default and first.default_explanation == "model mlp:1: no answer for 1 of 1 inputs"
    assert not second.default and second.output == 5
    assert queue.sent == [] and endpoint.calls == []


def test_the_querys_own_failed_rows_do_not_end_the_wait_for_its_followed_rows(cached):
    """The query computes one input (its model fails on it) and follows another query's computation of the other:
    that one's answer, come within the SLO, is still this query's answer for that input."""
    p, _, queue, endpoint, _cache = cached
    _followed(cached, {_key(5): (START + 0.05, "fill", 5)})
    endpoint.fail_with = "boom"
    result = p.predict("digits", {"input_batch": [one_hot(3), one_hot(5)]})
    own, followed = result.predictions
    assert own.default and "endpoint error: boom" in own.default_explanation
    assert not followed.default and followed.output == 5
    assert len(queue.sent) == 1 and endpoint.calls == [1]  # one row sent: its own
    assert result.model_errors == ["mlp"]  # its own message's failure is charged to the model


def test_a_followed_rows_failure_does_not_keep_the_query_from_computing_another_row_given_up(cached):
    """One followed input's owner fails; another's owner runs out of time and ends its claim: this query, with time
    left, computes that input itself (the claim it took was let go before, the input answered the default)."""
    p, _, queue, endpoint, cache = cached
    x, y = _key(3), _key(5)
    _followed(cached, {x: (START + 0.02, "fail", "model mlp:1: endpoint error: boom")})
    _claimed_by_another_query(cached, y, START + 0.03)
    result = p.predict("digits", {"input_batch": [one_hot(3), one_hot(5)]})
    first, second = result.predictions
    assert first.default and "boom" in first.default_explanation
    assert not second.default and second.output == 5
    assert len(queue.sent) == 1 and endpoint.calls == [1] and cache.entries[y] == 5


def test_an_owners_failure_is_given_to_identical_queries_only_for_its_short_while(cached):
    """An identical query arriving after the failure's 250 ms computes the input anew (the model may be back), as
    on Redis and DynamoDB, where the failure expires and leaves the key free."""
    from clipper.frontend.fanout import FAILED_CLAIM_TTL_S

    p, _, _queue, endpoint, cache = cached
    endpoint.fail_with = "boom"
    assert p.predict("digits", {"input": one_hot(3)}).predictions[0].default
    assert len(cache.failed) == 1
    endpoint.fail_with = None
    cache.clock.advance(FAILED_CLAIM_TTL_S)
    again = p.predict("digits", {"input": one_hot(3)}).predictions[0]
    assert not again.default and again.output == 3 and endpoint.calls == [1, 1]


def test_an_input_filled_while_a_takeover_waited_out_the_deadline_is_still_answered(cached):
    """One input is taken over (its owner gave it up) and its model never replies, so the takeover's wait runs to
    the deadline; meanwhile another query fills the batch's other input: the cache is read once more."""
    p, _, queue, _endpoint, cache = cached
    x, y = _key(3), _key(5)
    _claimed_by_another_query(cached, x, START + 0.02)
    cache.claims.add(y)
    cache.owners[y] = "other-y"
    queue.batcher = None  # the takeover's model gives no reply
    wait = p._replies.wait

    def wait_out(reply_to, models, timeout_s):  # as a real wait: to the deadline; y's owner fills y meanwhile
        cache.clock.advance(timeout_s)
        cache.put_many({y: 5})
        return wait(reply_to, models, timeout_s)

    p._replies.wait = wait_out
    first, second = p.predict("digits", {"input_batch": [one_hot(3), one_hot(5)]}).predictions
    assert first.default and "timeout, no reply within the SLO" in first.default_explanation
    assert not second.default and second.output == 5


def _first_send_fails(queue, then=None):
    from clipper.errors import Unavailable

    send, calls = queue.send_many, []

    def send_many(messages, timeout=None):
        calls.append(len(messages))
        if len(calls) == 1:
            return [Unavailable("blip")] * len(messages)
        if then is not None:
            then()
        return send(messages, timeout)

    queue.send_many = send_many
    return calls


def test_a_repeated_input_ends_as_the_querys_own_computation_of_it_did(cached):
    """[x, x]: the query's own send of x fails (the frontend's queue): the repeat is answered the same, at once,
    not sent again (one input, two answers) nor awaited until the deadline as if another query computed it."""
    from clipper.frontend.results import ModelAnswer

    p, _, queue, _endpoint, cache = cached
    calls = _first_send_fails(queue)
    first, again = p.predict("digits", {"input_batch": [one_hot(3), one_hot(3)]}).predictions
    assert first.default and again.default and len(calls) == 1
    assert (
        first.default_explanation == again.default_explanation
        and "queue unavailable (blip)" in again.default_explanation
    )
    p._gatherer.observe(ModelAnswer(model_version(), [None], reply_timings={"queue_ms": 95.0}))  # no takeover now
    queue.down = True
    started = cache.clock.t
    assert all(r.default for r in p.predict("digits", {"input_batch": [one_hot(4), one_hot(4)]}).predictions)
    assert cache.clock.t - started < 0.05  # not the 100 ms SLO


def test_each_followed_input_is_explained_by_its_own_cause(cached):
    """x's owner fails; y's owner never answers: y's default says so, not x's owner's error."""
    p, _, _queue, _endpoint, cache = cached
    x, y = _key(3), _key(5)
    _followed(cached, {x: (START + 0.02, "fail", "model mlp:1: endpoint error: boom")})
    cache.claims.add(y)
    cache.owners[y] = "other-y"
    first, second = p.predict("digits", {"input_batch": [one_hot(3), one_hot(5)]}).predictions
    assert first.default_explanation == "model mlp:1: endpoint error: boom"
    assert second.default_explanation == (
        "model mlp:1: timeout, the identical query computing this input gave no answer within the SLO"
    )


def test_a_takeovers_own_model_error_is_charged_to_the_model_though_the_querys_own_send_failed(cached):
    """[x, y]: the query's own send of x fails (the frontend's queue: not the model's failure); y's owner gives it
    up, this query sends y and the model errors on it: that is the model's failure, charged to it, and each input
    names its own cause."""
    p, _, queue, endpoint, _cache = cached
    _claimed_by_another_query(cached, _key(5), START + 0.02)
    calls = _first_send_fails(queue, then=lambda: setattr(endpoint, "fail_with", "boom"))
    gatherer, fans = p._gatherer, []
    follow = gatherer.await_followers
    gatherer.await_followers = lambda app, fan, ticket=None: fans.append(fan) or follow(app, fan, ticket)
    result = p.predict("digits", {"input_batch": [one_hot(3), one_hot(5)]})
    first, second = result.predictions
    assert len(calls) == 2 and endpoint.calls == [1] and result.model_errors == ["mlp"]
    assert fans[0].answers[0].failure == "error"  # the model's own (feedback and the canary's tally count it)
    assert "queue unavailable (blip)" in first.default_explanation
    assert "endpoint error: boom" in second.default_explanation


def test_in_an_ensemble_one_models_failed_input_leaves_the_other_models_and_inputs_waiting(cached):
    """Exp4 over mlp and cnn, a batch of two inputs all computed by other queries: mlp's owner fails on the first
    input; cnn's answer for it, and both models' for the second, still come (the first answered without mlp)."""
    import numpy as np

    from tests.fakes import digits_app

    p, registry, queue, _endpoint, _cache = cached
    registry.apps["ens"] = digits_app(name="ens", policy="exp4")
    registry.links["ens"] = ["mlp", "cnn"]
    registry.versions[("cnn", "1")] = model_version("cnn")
    registry.active["cnn"] = "1"

    def key(model: str, i: int) -> str:
        return row_keys(model, "1", np.asarray([one_hot(i)], dtype=np.float32))[0]

    _followed(
        cached,
        {
            key("mlp", 3): (START + 0.02, "fail", "model mlp:1: endpoint error: boom"),
            key("cnn", 3): (START + 0.05, "fill", 3),
            key("mlp", 5): (START + 0.03, "fill", 5),
            key("cnn", 5): (START + 0.06, "fill", 5),
        },
    )
    first, second = p.predict("ens", {"input_batch": [one_hot(3), one_hot(5)]}).predictions
    assert (first.output, second.output) == (3, 5) and not first.default and not second.default
    assert first.missing_models == ("mlp",) and queue.sent == []


def test_the_async_path_ends_each_followed_input_on_its_own(cached):
    """predict_async awaits followed inputs on a worker thread: an owner's failure, a later answer, a takeover and
    the query's own input, in one batch."""
    import asyncio

    p, _, _queue, _endpoint, _cache = cached
    _followed(
        cached,
        {
            _key(3): (START + 0.02, "fail", "model mlp:1: no answer for 1 of 1 inputs"),
            _key(5): (START + 0.05, "fill", 5),
        },
    )
    _claimed_by_another_query(cached, _key(7), START + 0.03)
    batch = [one_hot(3), one_hot(5), one_hot(7), one_hot(1)]
    result = asyncio.run(p.predict_async("digits", {"input_batch": batch}, QueryTicket()))
    assert [r.output for r in result.predictions][1:] == [5, 7, 1]
    assert result.predictions[0].default and "no answer" in result.predictions[0].default_explanation


def _records(cache, app: str, inputs) -> list:
    import numpy as np

    from clipper.core.cache_keys import record_keys

    return [cache.entries.get(k) for k in record_keys(app, None, np.asarray(inputs, dtype=np.float32))]


def test_feedback_charges_each_input_by_its_own_failure(cached):
    """A bandit application's records say which selected models failed an input by their own failure (feedback
    counts a loss of 1 for each): per input. The query's own send failing (the frontend's queue) charges no model
    though the model errored on its other input; an input whose computing query timed out is charged there, not
    here, though the model errored on this query's own input."""
    from dataclasses import replace

    p, registry, queue, endpoint, cache = cached
    registry.apps["digits"] = replace(registry.apps["digits"], policy="exp3")
    _claimed_by_another_query(cached, _key(5), START + 0.02)
    _first_send_fails(queue, then=lambda: setattr(endpoint, "fail_with", "boom"))
    first, second = p.predict("digits", {"input_batch": [one_hot(3), one_hot(5)]}).predictions
    assert "queue unavailable" in first.default_explanation and "boom" in second.default_explanation
    queued, errored = _records(cache, "digits", [one_hot(3), one_hot(5)])
    assert errored["missing"] == ["mlp"] and (queued is None or "missing" not in queued)

    y = _key(9)
    cache.claims.add(y)
    cache.owners[y] = "other-y"  # never answers
    endpoint.fail_with = "boom"
    assert all(r.default for r in p.predict("digits", {"input_batch": [one_hot(8), one_hot(9)]}).predictions)
    own, followed = _records(cache, "digits", [one_hot(8), one_hot(9)])
    assert own["missing"] == ["mlp"] and (followed is None or "missing" not in followed)
