from __future__ import annotations

import statistics
import threading
import time

import pytest
import redis

from clipper.adapters.dynamodb_replies import DynamoDBReplyChannel
from clipper.adapters.redis_replies import RedisReplyChannel, inbox_of
from clipper.adapters.resp import RespClient
from clipper.core.messages import Reply
from clipper.errors import Unavailable
from tests.services import redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", "dynamodb"])
def channel(request):
    if request.param == "redis":
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        client.flushdb()
        channel = RedisReplyChannel(RespClient.from_url(request.getfixturevalue("redis_url")), ttl_s=60)
        yield channel
        channel.close()
        return
    aws = request.getfixturevalue("aws")
    yield DynamoDBReplyChannel(aws.dynamodb, aws.replies_table, ttl_s=60, poll_interval_s=0.005)


def ok(model: str = "mlp", outputs=(1,)) -> Reply:
    return Reply(query_id=1, model=model, version="1", outputs=list(outputs))


def err(model: str = "mlp") -> Reply:
    return Reply(query_id=1, model=model, version="1", error="boom", error_kind="endpoint")


def test_addresses_are_unique_and_uuid_wide(channel):
    addresses = {channel.new_address() for _ in range(10_000)}
    assert len(addresses) == 10_000
    if isinstance(channel, RedisReplyChannel):
        # a uuid4 inbox (122 random bits) a process, then that process's serial: no two processes share an inbox
        inboxes = {inbox_of(a) for a in addresses}
        assert len(inboxes) == 1 and all(len(i) == 32 for i in inboxes)
    else:  # 32 hex digits (a UUID4: 122 random bits), not a 37-bit number
        assert all(len(a) == 32 for a in addresses)


def test_redis_addresses_of_two_processes_never_meet(redis_url):  # noqa: F811
    # two frontends (or one after a reset, as after a SnapStart restore) number their queries alike: the inbox
    # part tells them apart, so a reply or a duplicate claim of one is never taken for the other's
    a = RedisReplyChannel(RespClient.from_url(redis_url), ttl_s=60)
    b = RedisReplyChannel(RespClient.from_url(redis_url), ttl_s=60)
    first = [a.new_address() for _ in range(100)]
    a.reset()
    after_reset = [a.new_address() for _ in range(100)]
    other = [b.new_address() for _ in range(100)]
    assert len(set(first) | set(after_reset) | set(other)) == 300
    assert inbox_of(first[0]) != inbox_of(after_reset[0]) != inbox_of(other[0])
    a.close()
    b.close()


def test_publish_then_wait(channel):
    q = channel.new_address()
    channel.expect(q)
    assert channel.publish(q, ok())
    (reply,) = channel.wait(q, ["mlp"], timeout_s=1.0)
    assert reply.outputs == [1] and channel.answered(q, "mlp")
    assert not channel.answered(q, "other")


def test_a_reply_reaches_only_its_own_query(channel):
    q1, q2 = channel.new_address(), channel.new_address()
    channel.expect(q1)
    channel.expect(q2)
    channel.publish(q1, ok(outputs=(1,)))
    channel.publish(q2, ok(outputs=(2,)))
    assert [r.outputs for r in channel.wait(q2, ["mlp"], 1.0)] == [[2]]
    assert [r.outputs for r in channel.wait(q1, ["mlp"], 1.0)] == [[1]]


def test_duplicate_success_is_dropped(channel):
    q = channel.new_address()
    channel.expect(q)
    assert channel.publish(q, ok())
    assert not channel.publish(q, ok(outputs=(9,)))
    assert [r.outputs for r in channel.wait(q, ["mlp", "other"], timeout_s=0.2)] == [[1]]


def test_an_ensemble_wait_counts_models_not_replies(channel):
    """An error and its retried success from one model are one model's reply: the wait goes on for the other
    model, whose on-time reply is not lost."""
    q = channel.new_address()
    channel.expect(q)
    channel.publish(q, err("a"))
    channel.publish(q, ok("a", (3,)))

    def later():
        time.sleep(0.05)
        channel.publish(q, ok("b", (4,)))

    t = threading.Thread(target=later)
    t.start()
    got = channel.wait(q, ["a", "b"], timeout_s=2.0)
    t.join()
    assert sorted((r.model, r.ok, tuple(r.outputs or ())) for r in got) == [("a", True, (3,)), ("b", True, (4,))]


def test_an_error_reply_ends_that_models_wait(channel):
    q = channel.new_address()
    channel.expect(q)
    channel.publish(q, err())
    start = time.monotonic()
    (reply,) = channel.wait(q, ["mlp"], timeout_s=2.0)
    assert not reply.ok and reply.error == "boom" and time.monotonic() - start < 1.0


def test_error_then_retry_success(channel):
    q = channel.new_address()
    assert channel.publish(q, err())
    assert not channel.answered(q, "mlp")
    assert channel.publish(q, ok())
    assert channel.answered(q, "mlp")


def test_wait_returns_what_came_at_the_timeout(channel):
    q = channel.new_address()
    channel.expect(q)
    channel.publish(q, ok("a"))
    start = time.monotonic()
    got = channel.wait(q, ["a", "b"], timeout_s=0.15)
    assert [r.model for r in got] == ["a"]
    assert 0.14 <= time.monotonic() - start < 1.0


@pytest.mark.parametrize("slo_ms", [20, 50, 100])
def test_an_unanswered_wait_ends_within_a_few_ms_of_its_timeout(channel, slo_ms):
    """Redis checks blocked clients' timeouts on its ~100 ms tick: a BLPOP per query answered every SLO at
    ~100 ms. The median of a few waits is taken (this machine is shared); the tolerance is far under the tick."""
    overshoot = []
    for _ in range(5):
        q = channel.new_address()
        channel.expect(q)
        start = time.monotonic()
        assert channel.wait(q, ["mlp"], timeout_s=slo_ms / 1000) == []
        overshoot.append((time.monotonic() - start) * 1000 - slo_ms)
    # the DynamoDB channel does not start a poll that could not end by the timeout (as long as the last took): it
    # may end up to one poll early
    early_ms = 5 if isinstance(channel, DynamoDBReplyChannel) else 1
    assert -early_ms <= statistics.median(overshoot) < 15, overshoot


def test_redis_a_late_reply_is_dropped_by_the_listener(redis_url):  # noqa: F811
    client = redis.Redis.from_url(redis_url)
    channel = RedisReplyChannel(RespClient.from_url(redis_url), ttl_s=60)
    try:
        q = channel.new_address()
        channel.expect(q)
        assert channel.wait(q, ["mlp"], timeout_s=0.01) == []
        channel.publish(q, ok())
        end = time.monotonic() + 2
        while channel.dropped == 0 and time.monotonic() < end:
            time.sleep(0.01)
        assert channel.dropped == 1
        assert client.llen(f"clipper:inbox:{{{inbox_of(q)}}}") == 0  # popped, not left to pile up
    finally:
        channel.close()


def test_redis_reset_gives_a_new_inbox(redis_url):  # noqa: F811
    channel = RedisReplyChannel(RespClient.from_url(redis_url), ttl_s=60)
    try:
        before = inbox_of(channel.new_address())
        channel.reset()
        q = channel.new_address()
        assert inbox_of(q) != before
        channel.expect(q)
        channel.publish(q, ok())
        assert [r.outputs for r in channel.wait(q, ["mlp"], 2.0)] == [[1]]
    finally:
        channel.close()


def test_dynamodb_expired_replies_are_never_delivered(aws):
    """DynamoDB deletes expired items days late: a reply item past its expires_at is not an answer."""
    channel = DynamoDBReplyChannel(aws.dynamodb, aws.replies_table, ttl_s=60, poll_interval_s=0.005)
    q = channel.new_address()
    aws.dynamodb.put_item(
        TableName=aws.replies_table,
        Item={
            "query_id": {"S": q},
            "model": {"S": "mlp"},
            "ok": {"BOOL": True},
            "reply": {"S": ok(outputs=(5,)).to_json()},
            "expires_at": {"N": str(int(time.time()) - 10)},
        },
    )
    assert channel.wait(q, ["mlp"], timeout_s=0.05) == []


def _dead_client() -> RespClient:
    return RespClient("127.0.0.1", 1, connect_timeout=0.2)


def test_redis_down_is_unavailable():
    channel = RedisReplyChannel(_dead_client())
    try:
        q = channel.new_address()
        with pytest.raises(Unavailable):
            channel.publish(q, ok())
        channel.expect(q)
        with pytest.raises(Unavailable):
            channel.wait(q, ["mlp"], 0.3)
    finally:
        channel.close()


def test_redis_batch_publication_answers_each_query_once(redis_url):  # noqa: F811
    client = redis.Redis.from_url(redis_url)
    channel = RedisReplyChannel(RespClient.from_url(redis_url), ttl_s=60)
    try:
        b1, b2, b3 = (channel.new_address() for _ in range(3))
        for q in (b1, b2, b3):
            channel.expect(q)
        assert channel.publish(b1, ok(outputs=(7,)))
        assert channel.answered_many([(b1, "mlp"), (b2, "mlp"), (b1, "other")]) == [True, False, False]
        got = channel.publish_many([(b1, ok(outputs=(8,))), (b2, ok(outputs=(2,))), (b3, err()), (b2, ok())])
        assert got == [False, True, True, False]
        assert 0 < client.ttl(f"clipper:done:{{{inbox_of(b2)}}}:{b2}:mlp") <= 60
        assert [r.outputs for r in channel.wait(b1, ["mlp"], timeout_s=1.0)] == [[7]]
        assert [r.outputs for r in channel.wait(b2, ["mlp"], timeout_s=1.0)] == [[2]]
        (failed,) = channel.wait(b3, ["mlp"], timeout_s=1.0)
        assert failed.error == "boom" and not channel.answered(b3, "mlp")
        assert channel.answered_many([]) == [] and channel.publish_many([]) == []
    finally:
        channel.close()


def test_redis_batch_methods_down_are_unavailable():
    channel = RedisReplyChannel(_dead_client())
    with pytest.raises(Unavailable):
        channel.publish_many([("q", ok())])
    with pytest.raises(Unavailable):
        channel.answered_many([("q", "mlp")])


class BrokenQueue:
    """A request queue whose send fails with an error no default covers (a bug: the query answers 500)."""

    def send(self, queue_url: str, body: str) -> None:
        raise RuntimeError("a bug in the send")

    def send_many(self, messages, timeout=None):
        raise RuntimeError("a bug in the send")


def test_a_query_that_fails_after_expecting_its_replies_leaves_no_waiter(redis_url):  # noqa: F811
    import asyncio

    from clipper.adapters.clock import SystemClock
    from clipper.frontend.query import QueryProcessor
    from tests.fakes import InMemoryRegistry, digits_app, model_version

    registry = InMemoryRegistry()
    registry.apps["digits"] = digits_app()
    registry.links["digits"] = ["mlp"]
    registry.versions[("mlp", "1")] = model_version()
    registry.active["mlp"] = "1"
    channel = RedisReplyChannel(RespClient.from_url(redis_url), ttl_s=60)
    ids = iter(range(1000, 10**6, 1000))
    processor = QueryProcessor(registry, BrokenQueue(), channel, SystemClock(), lambda: next(ids))
    row = [0.0] * 64
    for _ in range(3):
        with pytest.raises(RuntimeError, match="a bug"):
            processor.predict("digits", {"input": row})
    assert channel._waiters == {}

    async def on_the_loop() -> None:
        from clipper.frontend.results import QueryTicket

        with pytest.raises(RuntimeError, match="a bug"):
            await processor.predict_async("digits", {"input": row}, QueryTicket())

    asyncio.run(on_the_loop())
    assert channel._waiters == {}
    channel.close()


def test_dynamodb_a_reply_over_the_item_limit_is_an_error_and_its_batch_is_answered(aws):
    """One reply over DynamoDB's 400 KB item limit failed the batch's transaction: no query of the batch was
    answered, and each redelivery failed again until the messages were dead-lettered (moto does not enforce the
    limit; DynamoDB does)."""
    channel = DynamoDBReplyChannel(aws.dynamodb, aws.replies_table, ttl_s=60, poll_interval_s=0.005)
    big, small = channel.new_address(), channel.new_address()
    huge = ok(outputs=[[0.123456789] * 40] * 1000)  # an input_batch of 1,000 rows of 40 scores: ~520 KB
    assert channel.publish_many([(big, huge), (small, ok())]) == [True, True]
    (answer,) = channel.wait(big, ["mlp"], 1.0)
    assert not answer.ok and "over DynamoDB's item limit (400 KB)" in (answer.error or "")
    (fine,) = channel.wait(small, ["mlp"], 1.0)
    assert fine.ok and fine.outputs == [1]


def test_dynamodb_a_long_wait_reads_at_a_slowing_pace_and_an_early_reply_is_seen_at_once(aws):
    """A model down: a query waiting 1 s for its reply read DynamoDB every 10 ms (~70-100 consistent reads, billed,
    and throttled under load); the pace slows after the first ten polls, which still see an early reply at once."""
    import threading

    calls = {"query": 0}
    client = aws.dynamodb

    class Counting:
        def __getattr__(self, name):
            return getattr(client, name)

        def query(self, **kwargs):
            calls["query"] += 1
            return client.query(**kwargs)

    channel = DynamoDBReplyChannel(Counting(), aws.replies_table, ttl_s=60, poll_interval_s=0.01)
    q = channel.new_address()
    assert channel.wait(q, ["mlp"], timeout_s=1.0) == []
    assert calls["query"] <= 40  # at a fixed 10 ms: 1 s / (10 ms + a read's time), over 60 here

    early = channel.new_address()
    timer = threading.Timer(0.04, lambda: channel.publish(early, ok()))
    timer.start()
    started = time.monotonic()
    assert [r.outputs for r in channel.wait(early, ["mlp"], timeout_s=1.0)] == [[1]]
    assert time.monotonic() - started < 0.04 + 0.03  # seen within a base interval (and a read) of its arrival
    timer.join()


def test_redis_the_loop_listener_does_not_carry_the_first_querys_context(redis_url):  # noqa: F811
    """The listener is a task made by the first query that waits on the loop: it took that query's context, so its
    log lines (inbox unreadable, read again) named that query's correlation id and application for the
    process's life (seen in bench-faults' Redis-killed frontend log)."""
    import asyncio
    import contextvars

    query_var: contextvars.ContextVar[str] = contextvars.ContextVar("query_var")
    channel = RedisReplyChannel(RespClient.from_url(redis_url), ttl_s=60)
    seen: list[str] = []

    async def listen(*args):
        seen.append(query_var.get("none"))

    channel._listen_on_loop = listen  # type: ignore[method-assign]

    async def first_query() -> None:
        query_var.set("query 1")
        q = channel.new_address()
        channel.expect(q)
        assert await channel.wait_async(q, ["mlp"], timeout_s=0.01) == []
        await asyncio.sleep(0)

    try:
        asyncio.run(first_query())
    finally:
        channel.close()
    assert seen == ["none"]
