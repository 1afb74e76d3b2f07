"""The local stack's append-only file compaction against a real redis-server started as the stack starts it
(append-only file, no automatic rewrite): the launcher's tick rewrites a grown file when Redis is quiet, not while
commands keep coming, and does when the file passes the forced bound."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clipper.adapters.resp import RespClient
from infra.local.aof import REDIS_OPTIONS, AofCompactor, AofPolicy, parse_info
from tests.services import free_port, wait_for_port

pytestmark = pytest.mark.integration


@pytest.fixture
def redis_with_aof(tmp_path: Path) -> Iterator[RespClient]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: run `make test` (it installs it)")
    port = free_port()
    options = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", ""]
    options += ["--appendonly", "yes", "--appendfsync", "everysec", *REDIS_OPTIONS]
    proc = subprocess.Popen([binary, *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield RespClient("127.0.0.1", port, timeout=5.0)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def persistence(client: RespClient) -> dict[str, str]:
    return parse_info(client.call("INFO", "persistence", "stats").decode())


def grow(client: RespClient, kb: int) -> None:
    value = "x" * 1000
    for start in range(0, kb, 100):  # the same keys again: the file grows, the dataset does not
        client.execute([("SET", f"k{i % 50}", value) for i in range(start, start + 100)])


def rewritten(client: RespClient, timeout_s: float = 10.0) -> dict[str, str]:
    end = time.monotonic() + timeout_s
    while True:
        info = persistence(client)
        if info["aof_rewrite_in_progress"] == "0" and info["aof_rewrite_scheduled"] == "0":
            return info
        assert time.monotonic() < end, info
        time.sleep(0.05)


def busy(client: RespClient, stop: threading.Event) -> threading.Thread:
    """Commands at several thousand a second, as queries make them, until ``stop``."""

    def run() -> None:
        while not stop.is_set():
            client.execute([("PING",)] * 20)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def ops_at_least(client: RespClient, ops: int, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while int(persistence(client)["instantaneous_ops_per_sec"]) < ops:
        assert time.monotonic() < end
        time.sleep(0.1)


def test_redis_does_not_rewrite_by_itself_and_the_tick_does_when_quiet(redis_with_aof: RespClient):
    client = redis_with_aof
    compactor = AofCompactor(client, AofPolicy(due_bytes=1024 * 1024, force_bytes=1 << 40, quiet_ops=100))
    grow(client, 3000)  # ~3 MB of writes: Redis's own rule would not rewrite under 64 MB anyway, so check it is off
    assert client.call("CONFIG", "GET", "auto-aof-rewrite-percentage") == [b"auto-aof-rewrite-percentage", b"0"]
    before = persistence(client)
    assert int(before["aof_current_size"]) - int(before["aof_base_size"]) > 2_500_000
    time.sleep(2.0)  # instantaneous_ops_per_sec is a moving average over ~1.6 s: quiet again
    assert compactor.tick() is not None and compactor.rewrites == 1
    after = rewritten(client)
    assert int(after["aof_rewrites"]) == int(before["aof_rewrites"]) + 1
    assert int(after["aof_current_size"]) - int(after["aof_base_size"]) < 100_000  # compacted: 50 keys
    assert compactor.tick() is None  # not due any more


def test_under_load_it_waits_until_the_forced_bound(redis_with_aof: RespClient):
    client = redis_with_aof
    policy = AofPolicy(due_bytes=1024 * 1024, force_bytes=6 * 1024 * 1024, quiet_ops=100, retry_s=0)
    compactor = AofCompactor(client, policy)
    grow(client, 3000)
    stop = threading.Event()
    load = busy(client, stop)
    try:
        ops_at_least(client, 1000)
        assert compactor.tick() is None and persistence(client)["aof_rewrites"] == "0"  # due, but not quiet
        grow(client, 4000)  # past the forced bound: rewritten under load
        assert compactor.tick() is not None
        assert rewritten(client)["aof_rewrites"] == "1"
    finally:
        stop.set()
        load.join(timeout=10)
