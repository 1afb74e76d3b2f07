"""One contract for the request-queue transports: the same tests run against SQS (moto's ``mock_aws``) and
Redis Streams (a real redis-server), then a few Redis-only tests (its failures, its bounds, its atomicity)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import astuple, dataclass

import boto3
import pytest
import redis
from moto import mock_aws

from clipper.adapters.redis_streams import RedisStreamQueueReader, RedisStreamRequestQueue, queue_depth, stream_keys
from clipper.adapters.resp import RespClient
from clipper.adapters.sqs import SqsQueueReader, SqsRequestQueue
from clipper.errors import Unavailable
from clipper.ports import QueueReader, ReceivedMessage, RequestQueue
from tests.services import AtomicRequests, free_port, redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

# The shortest visibility timeouts that work: SQS counts whole seconds.
SHORT_VISIBILITY = {"sqs": 1.0, "redis": 1.0}  # a stall of a few hundred ms must not end a hold early


@dataclass
class Transport:
    kind: str
    queue: RequestQueue
    url: str
    visibility_s: float
    new_reader: Callable[[], QueueReader]
    dead_letters: Callable[[], list[str]]


MakeTransport = Callable[..., Transport]


def _sqs_queue(sqs, name: str, visibility_s: float, max_receive: int) -> tuple[str, str]:
    dlq_url = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"{max_receive}"}}'
    attributes = {"RedrivePolicy": redrive, "VisibilityTimeout": str(int(visibility_s))}
    return sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"], dlq_url


@pytest.fixture(params=["sqs", "redis"])
def make_transport(request: pytest.FixtureRequest) -> Iterator[MakeTransport]:
    """``make_transport(visibility_s=None, max_receive=3)``: a fresh queue (and its dead-letter queue) on the
    transport under test; ``visibility_s`` None picks the transport's shortest."""
    kind = request.param
    if kind == "sqs":
        request.getfixturevalue("aws_env")
        with mock_aws():
            sqs = boto3.client("sqs")
            # moto interleaves concurrent receives of one queue; SQS does not (see tests/services.py). Only
            # the readers' calls are serialised, so a send still reaches a reader's long poll.
            readers_sqs = AtomicRequests(sqs)

            def make_sqs(visibility_s: float | None = None, max_receive: int = 3) -> Transport:
                vis = visibility_s or SHORT_VISIBILITY[kind]
                url, dlq_url = _sqs_queue(sqs, f"q-{uuid.uuid4().hex[:12]}", vis, max_receive)

                def dead_letters() -> list[str]:
                    got = sqs.receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10).get("Messages", [])
                    return [m["Body"] for m in got]

                return Transport(
                    kind, SqsRequestQueue(sqs), url, vis, lambda: SqsQueueReader(readers_sqs, url), dead_letters
                )

            yield make_sqs
        return
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))  # to look at the keys
    lean = RespClient.from_url(request.getfixturevalue("redis_url"))  # the adapters' client

    def make_redis(visibility_s: float | None = None, max_receive: int = 3) -> Transport:
        vis = visibility_s or SHORT_VISIBILITY[kind]
        url = f"https://sqs.us-east-1.amazonaws.com/123456789012/q-{uuid.uuid4().hex[:12]}"
        keys = stream_keys(url)

        def dead_letters() -> list[str]:
            return [fields[b"body"].decode() for _, fields in client.xrange(keys.dead_letter)]

        def reader() -> QueueReader:
            return RedisStreamQueueReader(lean, url, visibility_timeout_s=vis, max_receive_count=max_receive)

        return Transport(kind, RedisStreamRequestQueue(lean), url, vis, reader, dead_letters)

    yield make_redis
    client.close()


def receive_within(reader: QueueReader, timeout_s: float, max_messages: int = 10) -> list[ReceivedMessage]:
    """Poll without long polls (moto's long poll notices a message visible again only once a second)."""
    end = time.monotonic() + timeout_s
    while True:
        got = reader.receive(max_messages, 0)
        if got or time.monotonic() > end:
            return got
        time.sleep(0.05)


def receive_n(reader: QueueReader, n: int, timeout_s: float = 5.0) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    end = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < end:
        got.extend(reader.receive(n - len(got), 0))
    return got


# -- the contract ------------------------------------------------------------------------------------------


def test_messages_sent_before_any_reader_are_received_then_deleted_for_good(make_transport: MakeTransport):
    t = make_transport()
    for i in range(3):
        t.queue.send(t.url, f"m{i}")
    reader = t.new_reader()
    got = receive_n(reader, 3)
    assert sorted(m.body for m in got) == ["m0", "m1", "m2"]
    assert all(m.receive_count == 1 and m.received_ms for m in got) and len({m.message_id for m in got}) == 3
    reader.delete([m.receipt_handle for m in got])
    time.sleep(t.visibility_s + 0.2)
    assert reader.receive(10, 0) == []


def test_a_receive_returns_at_most_max_messages(make_transport: MakeTransport):
    t = make_transport(visibility_s=30)
    for i in range(5):
        t.queue.send(t.url, f"m{i}")
    reader = t.new_reader()
    first = reader.receive(2, 0)
    assert len(first) == 2
    rest = receive_n(reader, 3)
    assert sorted(m.body for m in first + rest) == [f"m{i}" for i in range(5)]


def test_a_long_poll_returns_as_soon_as_a_message_arrives(make_transport: MakeTransport):
    t = make_transport()
    reader = t.new_reader()
    started = time.monotonic()
    assert reader.receive(10, 1) == []  # an empty queue's long poll waits its time
    assert time.monotonic() - started >= 0.9
    sender = threading.Timer(0.3, t.queue.send, args=(t.url, "late"))
    sender.start()
    started = time.monotonic()
    got = reader.receive(10, 10)
    sender.join()
    assert [m.body for m in got] == ["late"] and time.monotonic() - started < 8


def test_a_message_not_deleted_comes_back_after_the_visibility_timeout(make_transport: MakeTransport):
    t = make_transport()
    t.queue.send(t.url, "m")
    reader = t.new_reader()
    (first,) = reader.receive(10, 0)
    received = time.monotonic()
    assert first.receive_count == 1 and reader.receive(10, 0) == []  # invisible while in flight
    (again,) = receive_within(reader, t.visibility_s + 3)
    assert time.monotonic() - received >= t.visibility_s - 0.05
    assert (again.message_id, again.body, again.receive_count) == (first.message_id, "m", 2)


def test_release_with_a_delay_makes_the_message_visible_after_it(make_transport: MakeTransport):
    t = make_transport(visibility_s=30)  # the delay, not the visibility timeout, brings it back
    t.queue.send(t.url, "m")
    reader = t.new_reader()
    (first,) = reader.receive(10, 0)
    reader.release(first.receipt_handle, 1)
    released = time.monotonic()
    assert reader.receive(10, 0) == []
    (again,) = receive_within(reader, 4)
    assert time.monotonic() - released >= 0.9
    assert (again.message_id, again.receive_count) == (first.message_id, 2)


def test_release_zero_makes_the_message_visible_at_once(make_transport: MakeTransport):
    t = make_transport(visibility_s=30)
    t.queue.send(t.url, "m")
    reader = t.new_reader()
    (first,) = reader.receive(10, 0)
    reader.release(first.receipt_handle, 0)
    (again,) = reader.receive(10, 0)
    assert (again.message_id, again.body, again.receive_count) == (first.message_id, "m", 2)


def test_after_max_receive_count_receives_the_message_is_dead_lettered(make_transport: MakeTransport):
    t = make_transport(visibility_s=30, max_receive=3)
    t.queue.send(t.url, "poison")
    reader = t.new_reader()
    for expected in (1, 2, 3):
        (m,) = reader.receive(10, 0)
        assert m.receive_count == expected
        reader.release(m.receipt_handle, 0)
    assert reader.receive(10, 0) == []
    assert t.dead_letters() == ["poison"]
    assert reader.receive(10, 0) == []


def test_two_readers_never_hold_the_same_message_at_once(make_transport: MakeTransport):
    t = make_transport(visibility_s=30)
    n = 30
    for i in range(n):
        t.queue.send(t.url, f"m{i}")
    held: list[list[str]] = [[], []]
    start = threading.Barrier(2)

    def consume(mine: list[str]) -> None:
        reader = t.new_reader()
        start.wait()
        while got := reader.receive(3, 0):
            mine.extend(m.message_id for m in got)

    threads = [threading.Thread(target=consume, args=(held[i],)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    everything = held[0] + held[1]
    assert len(everything) == n and len(set(everything)) == n


def test_nothing_is_lost_when_a_reader_dies_between_receive_and_delete(make_transport: MakeTransport):
    t = make_transport()
    t.queue.send(t.url, "m")
    dying = t.new_reader()
    (first,) = dying.receive(10, 0)
    del dying  # never deletes nor releases
    survivor = t.new_reader()
    (again,) = receive_within(survivor, t.visibility_s + 3)
    assert (again.message_id, again.body, again.receive_count) == (first.message_id, "m", 2)
    survivor.delete([again.receipt_handle])
    time.sleep(t.visibility_s + 0.2)
    assert survivor.receive(10, 0) == []


def test_deleting_twice_is_harmless(make_transport: MakeTransport):
    t = make_transport()
    t.queue.send(t.url, "m")
    reader = t.new_reader()
    (m,) = reader.receive(10, 0)
    reader.delete([m.receipt_handle])
    reader.delete([m.receipt_handle])
    reader.delete([])
    time.sleep(t.visibility_s + 0.2)
    assert reader.receive(10, 0) == []


# -- Redis Streams only ------------------------------------------------------------------------------------


@pytest.fixture
def rclient(redis_url: str) -> Iterator[redis.Redis]:  # noqa: F811
    """redis-py, to look at the keys."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def lean(redis_url: str) -> Iterator[RespClient]:  # noqa: F811
    """The adapters' client."""
    client = RespClient.from_url(redis_url)
    yield client
    client.close()


def new_url() -> str:
    return f"https://sqs.us-east-1.amazonaws.com/123456789012/q-{uuid.uuid4().hex[:12]}"


def race(readers: list[RedisStreamQueueReader]) -> list[ReceivedMessage]:
    """Every reader receives (5 at a time) at once until the queue gives it nothing."""
    got: list[ReceivedMessage] = []
    start = threading.Barrier(len(readers))

    def consume(reader: RedisStreamQueueReader) -> None:
        start.wait()
        while batch := reader.receive(5, 0):
            got.extend(batch)  # list.extend is atomic under the GIL

    threads = [threading.Thread(target=consume, args=(r,)) for r in readers]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return got


def test_redis_down_raises_unavailable():
    client = RespClient.from_url(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.2)
    url = new_url()
    reader = RedisStreamQueueReader(client, url)
    calls = [
        lambda: RedisStreamRequestQueue(client).send(url, "m"),
        lambda: reader.receive(10, 0),
        lambda: reader.receive(10, 0.2),
        lambda: reader.delete(["1-0:1"]),
        lambda: reader.release("1-0:1", 0),
        reader.depth,
    ]
    for call in calls:
        with pytest.raises(Unavailable) as e:
            call()
        assert isinstance(e.value.__cause__, OSError)


def test_the_stream_stays_bounded_after_deletes(rclient: redis.Redis, lean: RespClient):
    url = new_url()
    queue, reader = RedisStreamRequestQueue(lean), RedisStreamQueueReader(lean, url)
    for i in range(300):
        queue.send(url, f"m{i}")
    answered = 0
    while got := reader.receive(50, 0):
        reader.delete([m.receipt_handle for m in got])
        answered += len(got)
    keys = stream_keys(url)
    assert answered == 300
    assert rclient.xlen(keys.stream) == 0  # acknowledged entries are removed, not only acknowledged
    assert rclient.xpending(keys.stream, "batchers")["pending"] == 0
    assert reader.depth() == queue_depth(lean, url) and reader.depth().ready == 0


def test_a_delete_refused_inside_its_transaction_is_unavailable(rclient: redis.Redis, lean: RespClient):
    """An error inside MULTI/EXEC (here: the delayed set's key holds a string) comes back inside EXEC's reply; the
    delete passed it as a success (found by a review), so the batcher took the message as acknowledged."""
    url = new_url()
    queue, reader = RedisStreamRequestQueue(lean), RedisStreamQueueReader(lean, url)
    queue.send(url, "m")
    (got,) = reader.receive(1, 0)
    rclient.set(stream_keys(url).delayed, "not a sorted set")
    with pytest.raises(Unavailable, match="WRONGTYPE"):
        reader.delete([got.receipt_handle])


def test_send_trims_messages_past_the_retention(rclient: redis.Redis, lean: RespClient):
    kept, trimmed = new_url(), new_url()
    for i in range(1000):
        RedisStreamRequestQueue(lean).send(kept, f"m{i}")
        RedisStreamRequestQueue(lean, retention_s=0).send(trimmed, f"m{i}")
    assert rclient.xlen(stream_keys(kept).stream) == 1000
    assert rclient.xlen(stream_keys(trimmed).stream) < 1000  # whole stream nodes at a time (approximate)


def test_reclaim_and_dead_letter_steps_are_atomic_under_concurrent_receivers(rclient: redis.Redis, lean: RespClient):
    url, n, vis = new_url(), 40, 0.2
    queue = RedisStreamRequestQueue(lean)
    for i in range(n):
        queue.send(url, f"m{i}")

    def reader() -> RedisStreamQueueReader:
        return RedisStreamQueueReader(lean, url, visibility_timeout_s=vis, max_receive_count=2)

    first = receive_n(reader(), n)
    ids = sorted(m.message_id for m in first)
    time.sleep(vis + 0.05)
    # every message is visible again: eight readers reclaim them at once, each message goes to exactly one
    second = race([reader() for _ in range(8)])
    assert sorted(m.message_id for m in second) == ids and {m.receive_count for m in second} == {2}
    time.sleep(vis + 0.05)
    # delivered twice (max_receive_count): the racers dead-letter each message exactly once, deliver none
    assert race([reader() for _ in range(8)]) == []
    keys = stream_keys(url)
    dead = rclient.xrange(keys.dead_letter)
    assert sorted(fields[b"source_id"].decode() for _, fields in dead) == ids
    assert {fields[b"receive_count"] for _, fields in dead} == {b"2"}
    assert rclient.xlen(keys.stream) == 0 and rclient.xpending(keys.stream, "batchers")["pending"] == 0
    assert not rclient.exists(keys.delayed)


def test_a_long_poll_ends_when_a_pending_message_is_visible_again(rclient: redis.Redis, lean: RespClient):
    url = new_url()
    RedisStreamRequestQueue(lean).send(url, "m")
    reader = RedisStreamQueueReader(lean, url, visibility_timeout_s=0.5)
    assert len(reader.receive(10, 0)) == 1
    started = time.monotonic()
    (again,) = reader.receive(10, 10)  # visibility timeout over during the poll
    assert again.receive_count == 2 and 0.4 <= time.monotonic() - started < 8
    reader.release(again.receipt_handle, 1)
    started = time.monotonic()
    (third,) = reader.receive(10, 10)  # the release's delay over during the poll
    assert third.receive_count == 3 and 0.9 <= time.monotonic() - started < 8


def test_a_fractional_wait_is_honoured(rclient: redis.Redis, lean: RespClient):
    reader = RedisStreamQueueReader(lean, new_url())
    started = time.monotonic()
    assert reader.receive(10, 0.3) == []
    assert 0.25 <= time.monotonic() - started < 5


def test_a_stale_release_leaves_the_current_holder_its_message(rclient: redis.Redis, lean: RespClient):
    url, vis = new_url(), 1.0  # third.receive comes within it, on a slow machine too
    RedisStreamRequestQueue(lean).send(url, "m")
    slow, other, third = (RedisStreamQueueReader(lean, url, visibility_timeout_s=vis) for _ in range(3))
    (m1,) = slow.receive(10, 0)
    (m2,) = receive_within(other, vis + 3)  # slow missed its visibility timeout: other holds the message
    slow.release(m1.receipt_handle, 0)
    assert third.receive(10, 0) == []
    other.release(m2.receipt_handle, 0)
    (m3,) = third.receive(10, 0)
    assert m3.receive_count == 3


def test_depth_shows_ready_in_flight_delayed_and_dead_lettered(rclient: redis.Redis, lean: RespClient):
    url = new_url()
    queue = RedisStreamRequestQueue(lean)
    reader = RedisStreamQueueReader(lean, url, visibility_timeout_s=30, max_receive_count=1)
    for i in range(5):
        queue.send(url, f"m{i}")
    assert reader.depth() == (d := queue_depth(lean, url, 30)) and (d.ready, d.in_flight) == (5, 0)
    got = reader.receive(3, 0)
    assert astuple(reader.depth()) == (2, 3, 0, 0)
    reader.release(got[0].receipt_handle, 60)
    assert astuple(reader.depth()) == (2, 2, 1, 0)
    reader.release(got[1].receipt_handle, 0)
    assert astuple(reader.depth()) == (3 + 1, 1, 1, 0)  # and the release's wake-up entry, until a reader takes it
    assert len(reader.receive(10, 0)) == 2  # the two new ones; got[1] was received once: dead-lettered
    assert astuple(reader.depth()) == (0, 3, 1, 1)


def test_a_queue_whose_group_was_lost_is_read_again(rclient: redis.Redis, lean: RespClient):
    url = new_url()
    reader = RedisStreamQueueReader(lean, url)
    keys = stream_keys(url)
    assert reader.receive(10, 0) == []  # creates the group
    destroyer = threading.Timer(0.3, rclient.xgroup_destroy, args=(keys.stream, "batchers"))
    destroyer.start()
    started = time.monotonic()
    assert reader.receive(10, 10) == []  # the blocked read fails with the group: the poll ends, no error
    destroyer.join()
    assert time.monotonic() - started < 8
    RedisStreamRequestQueue(lean).send(url, "m")
    assert [m.body for m in reader.receive(10, 1)] == ["m"]  # the group is created again, from the start


def test_an_ensembles_messages_go_in_one_call(make_transport: MakeTransport):
    first, second = make_transport(), make_transport()
    queue = first.queue
    assert queue.send_many([(first.url, "a"), (second.url, "b"), (first.url, "c")]) == [None, None, None]
    got_first = receive_n(first.new_reader(), 2)
    got_second = receive_n(second.new_reader(), 1)
    assert sorted(m.body for m in got_first) == ["a", "c"] and [m.body for m in got_second] == ["b"]


class CountingClient(RespClient):
    """The adapters' client, recording the name of every command it sends."""

    def __init__(self, url: str) -> None:
        base = RespClient.from_url(url)
        super().__init__(base.host, base.port)
        base.close()
        self.sent: list[str] = []

    def execute(self, commands, timeout=None):  # type: ignore[no-untyped-def]
        self.sent.extend(str(c[0]) for c in commands)
        return super().execute(commands, timeout)


def test_a_busy_reader_receives_new_messages_in_one_round_trip_without_the_script(redis_url: str):  # noqa: F811
    client = CountingClient(redis_url)
    url = new_url()
    queue, reader = RedisStreamRequestQueue(client), RedisStreamQueueReader(client, url)
    queue.send(url, "first")
    assert [m.body for m in reader.receive(10, 1)] == ["first"]  # the first receive scans (and makes the group)
    for i in range(5):
        queue.send(url, f"m{i}")
        client.sent.clear()
        assert [m.body for m in reader.receive(10, 1)] == [f"m{i}"]
        assert client.sent == ["XREADGROUP"]
    client.close()


def test_a_busy_reader_still_takes_back_a_message_visible_again(rclient: redis.Redis, lean: RespClient):
    """Between its scans a reader reads only new messages; its scans still come at least every half visibility
    timeout, so a message another reader left is taken back while new ones keep arriving."""
    url, vis = new_url(), 0.6
    queue = RedisStreamRequestQueue(lean)
    queue.send(url, "left")
    dead, busy = (RedisStreamQueueReader(lean, url, visibility_timeout_s=vis) for _ in range(2))
    (left,) = dead.receive(10, 0)  # never deleted
    left_at = time.monotonic()
    taken_back: list[ReceivedMessage] = []
    while not taken_back and time.monotonic() - left_at < vis + 3:
        queue.send(url, "new")
        got = busy.receive(10, 1)
        taken_back = [m for m in got if m.message_id == left.message_id]
        busy.delete([m.receipt_handle for m in got if m.message_id != left.message_id])
        time.sleep(0.02)
    assert taken_back and taken_back[0].receive_count == 2
    assert time.monotonic() - left_at < vis + vis / 2 + 0.5


def test_a_message_handed_back_at_once_reaches_a_reader_blocked_for_new_ones_at_once(
    rclient: redis.Redis, lean: RespClient, monkeypatch: pytest.MonkeyPatch
):
    """A stopping batcher hands its messages back (release 0); another replica, blocked in XREADGROUP for new
    entries, found them only at its next scan, up to RESCAN_S (1 s) later: past a short SLO's deadline."""
    import clipper.adapters.redis_streams as streams

    monkeypatch.setattr(streams, "RESCAN_S", 30.0)  # its next scan far away: only the wake-up can bring it
    url = new_url()
    stopping = RedisStreamQueueReader(lean, url)
    other = RedisStreamQueueReader(RespClient.from_url(f"redis://{lean.host}:{lean.port}/0"), url)
    assert other.receive(10, 0) == []  # scanned once: from now on it blocks for new entries only
    RedisStreamRequestQueue(lean).send(url, "held")
    (held,) = stopping.receive(10, 0)
    got: list[ReceivedMessage] = []
    blocked = threading.Thread(target=lambda: got.extend(other.receive(10, 10)))
    blocked.start()
    time.sleep(0.3)  # other is in its blocking read
    stopping.release(held.receipt_handle, 0)
    blocked.join(15)
    assert [(m.body, m.receive_count) for m in got] == [("held", 2)]
    other.delete([m.receipt_handle for m in got])
    assert rclient.xlen(stream_keys(url).stream) == 0  # the wake-up entry is gone too
    assert astuple(other.depth()) == (0, 0, 0, 0)


def test_a_wake_up_whose_reader_died_is_dropped_never_dead_lettered(rclient: redis.Redis, lean: RespClient):
    """A wake-up entry delivered to a reader that died before dropping it comes back after the visibility
    timeout; with MaxReceiveCount 1 it went to the dead-letter stream as an empty message."""
    url = new_url()
    keys = stream_keys(url)
    reader = RedisStreamQueueReader(lean, url, visibility_timeout_s=0.3, max_receive_count=1)
    assert reader.receive(10, 0) == []  # the group
    rclient.xadd(keys.stream, {"wake": "1"})
    rclient.xreadgroup("batchers", "died", {keys.stream: ">"}, count=10)  # taken, never acknowledged
    time.sleep(0.4)
    assert reader.receive(10, 0) == []
    assert rclient.xlen(keys.dead_letter) == 0 and rclient.xlen(keys.stream) == 0
