"""The lean Redis client against a real redis-server: pipelines, error replies, scripts the server lost, a
deadline per call (a SIGSTOPped server), authentication and databases, large replies, threads."""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from clipper.adapters.resp import RespClient, RespError
from clipper.errors import Unavailable
from tests.services import free_port, redis_url, wait_for_port  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def client(redis_url: str) -> Iterator[RespClient]:  # noqa: F811
    c = RespClient.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def private_redis() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--save", "", "--requirepass", "s3cret"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield proc, port
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)


def test_a_pipeline_answers_in_order_with_error_replies_as_values(client):
    got = client.execute([("SET", "k", "v"), ("GET", "k"), ("INCR", "k"), ("GET", "nope"), ("ECHO", b"\x00\r\n")])
    assert got[:2] == ["OK", b"v"] and isinstance(got[2], RespError) and got[3] is None and got[4] == b"\x00\r\n"
    with pytest.raises(RespError, match="not an integer"):
        client.call("INCR", "k")
    assert client.call("RPUSH", "l", 1, 2.5, "x") == 3
    assert client.call("LRANGE", "l", 0, -1) == [b"1", b"2.5", b"x"]
    assert client.execute([]) == []


def test_a_script_the_server_lost_is_loaded_and_run_again(client):
    script = client.script("return {KEYS[1], ARGV[1]}")
    assert client.execute([script.command(["a"], ["1"])]) == [[b"a", b"1"]]
    client.call("SCRIPT", "FLUSH")  # as after a restart or a failover
    assert client.execute([("PING",), script.command(["b"], ["2"])]) == ["PONG", [b"b", b"2"]]


def test_an_error_inside_a_script_reads_as_the_error_without_the_scripts_hash(client):
    # Redis 7 appends " script: <sha>, on @user_script:<line>." to a script's error: a default's cause showed it
    client.call("SET", "text", "x")
    failing = client.script("return redis.call('INCR', KEYS[1])")
    (err,) = client.execute([failing.command(["text"], [])])
    assert isinstance(err, RespError) and str(err) == "ERR value is not an integer or out of range"
    mine = client.script("return redis.error_reply('MINE script: x')")  # an error of the script's own is kept
    assert str(client.execute([mine.command([], [])])[0]) == "MINE script: x"


def test_large_replies_span_many_reads(client):
    big = b"x" * (3 * 1024 * 1024)
    client.call("SET", "big", big)
    assert client.call("GET", "big") == big
    assert client.execute([("GET", "big")] * 3) == [big] * 3


def test_threads_share_the_client(client):
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(200):
                assert client.execute([("SET", f"t{i}", j), ("GET", f"t{i}")]) == ["OK", str(j).encode()]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_hung_server_costs_a_call_its_timeout_not_more(private_redis):
    proc, port = private_redis
    client = RespClient.from_url(f"redis://:s3cret@127.0.0.1:{port}/0")
    client.call("PING")
    proc.send_signal(signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(Unavailable, match="no answer in time"):
        client.execute([("GET", "k")], timeout=0.05)
    assert time.monotonic() - start < 0.5
    proc.send_signal(signal.SIGCONT)
    assert client.call("PING") == "PONG"  # the timed-out connection was dropped; a new one works


def test_authentication_and_databases(private_redis):
    _, port = private_redis
    with pytest.raises(RespError, match="NOAUTH"):  # an error reply: the adapters translate it
        RespClient.from_url(f"redis://127.0.0.1:{port}/0").call("GET", "k")
    with pytest.raises(Unavailable, match=r"WRONGPASS|invalid"):
        RespClient.from_url(f"redis://:wrong@127.0.0.1:{port}/0").call("PING")
    db3 = RespClient.from_url(f"redis://:s3cret@127.0.0.1:{port}/3")
    db0 = RespClient.from_url(f"redis://default:s3cret@127.0.0.1:{port}")
    db3.call("SET", "k", "three")
    assert db0.call("GET", "k") is None and db3.call("GET", "k") == b"three"


def test_nothing_listening_is_unavailable():
    client = RespClient("127.0.0.1", free_port(), connect_timeout=0.2)
    with pytest.raises(Unavailable, match="ConnectionRefusedError"):
        client.call("PING")


def test_urls():
    with pytest.raises(ValueError, match="not a Redis URL"):
        RespClient.from_url("http://127.0.0.1:6379")
    c = RespClient.from_url("rediss://user:p%40ss@cache.example:6380/2")
    assert (c.host, c.port, c.db, c.username, c.password, c.tls) == ("cache.example", 6380, 2, "user", "p@ss", True)


def test_a_pooled_connection_the_server_closed_is_not_used_again(private_redis):
    """A restart (or a failover, or an idle timeout) closes the pooled connections; the next call must not
    be the one to find out: a closed idle connection is dropped before use and the call connects anew."""
    _proc, port = private_redis
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    client = RespClient.from_url(url)
    assert client.execute([("PING",)] * 3) == ["PONG"] * 3  # one connection now idle in the pool
    admin = RespClient.from_url(url)
    assert admin.call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 1
    time.sleep(0.1)  # the server's FIN has reached the idle socket
    assert client.call("PING") == "PONG"
    client.close()
    admin.close()
