"""The batcher as a process (``python -m clipper.entrypoints.batcher``) on the Redis Streams transport, with
the real endpoint server: it answers what is queued, and SIGTERM stops it promptly and cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from clipper.adapters.redis_replies import RedisReplyChannel
from clipper.adapters.redis_streams import RedisStreamQueueReader, RedisStreamRequestQueue
from clipper.adapters.resp import RespClient
from tests.services import redis_url, start_endpoint, stop  # noqa: F401  (fixture)
from tests.unit.test_batcher_core import message, one_hot

pytestmark = pytest.mark.integration


class WallClock:
    def now(self) -> float:
        return time.time()


def test_the_batcher_process_answers_its_queue_and_stops_cleanly_on_sigterm(redis_url, demo_models):  # noqa: F811
    root = Path(demo_models["out_dir"])
    mlp = next(m for m in demo_models["models"] if m["name"] == "mlp")
    endpoint, url = start_endpoint(str(root / mlp["path"]))
    client = RespClient.from_url(redis_url)
    queue_url = f"https://sqs.us-east-1.amazonaws.com/123456789012/proc-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "CLIPPER_QUEUE_TRANSPORT": "redis",
        "REDIS_URL": redis_url,
        "CLIPPER_REGISTRY_TABLE": "unused-registry",
        "CLIPPER_REPLIES_TABLE": "unused-replies",
        "CLIPPER_CACHE_ENABLED": "false",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    command = [sys.executable, "-m", "clipper.entrypoints.batcher", "--queue-url", queue_url, "--endpoint-url", url]
    command += ["--slo-ms", "1000", "--batch-wait-ms", "2", "--poll-wait-s", "1"]
    batcher = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        clock, sender, replies = WallClock(), RedisStreamRequestQueue(client), RedisReplyChannel(client)
        queries = [message(i, one_hot(i % 64), clock, ttl_s=60) for i in range(1, 41)]
        sender.send_many([(queue_url, q.body) for q in queries])
        keys = [(str(i), "mlp") for i in range(1, 41)]
        give_up = time.monotonic() + 30
        while not all(replies.answered_many(keys)):
            assert batcher.poll() is None, batcher.communicate()[0]
            assert time.monotonic() < give_up, "the batcher did not answer every query"
            time.sleep(0.05)
        depth = RedisStreamQueueReader(client, queue_url).depth()
        give_up = time.monotonic() + 10
        while depth.ready + depth.in_flight and time.monotonic() < give_up:  # acknowledged off the batch path
            time.sleep(0.05)
            depth = RedisStreamQueueReader(client, queue_url).depth()
        assert depth.ready + depth.in_flight + depth.delayed == 0

        batcher.send_signal(signal.SIGTERM)
        output, _ = batcher.communicate(timeout=15)  # within the long poll's wait, and a margin
        assert batcher.returncode == 0, output
        assert "batcher stopped" in output and "answered=40" in output and "returned=0" in output
    finally:
        if batcher.poll() is None:
            batcher.kill()
            batcher.wait()
        stop(endpoint)
        client.close()


def test_a_burst_of_sigterms_still_stops_the_batcher(redis_url, demo_models):  # noqa: F811
    """A stop handler that set the stop event could be entered again by the next SIGTERM while it held the event's
    lock, and wait for that lock forever: a batcher orphaned by a launcher killed with -9 kept running and ignored
    SIGTERM. The signals are taken by a thread of their own now, never in the middle of another frame."""
    root = Path(demo_models["out_dir"])
    mlp = next(m for m in demo_models["models"] if m["name"] == "mlp")
    endpoint, url = start_endpoint(str(root / mlp["path"]))
    queue_url = f"https://sqs.us-east-1.amazonaws.com/123456789012/burst-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "CLIPPER_QUEUE_TRANSPORT": "redis",
        "REDIS_URL": redis_url,
        "CLIPPER_REGISTRY_TABLE": "unused-registry",
        "CLIPPER_REPLIES_TABLE": "unused-replies",
        "CLIPPER_CACHE_ENABLED": "false",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    command = [sys.executable, "-m", "clipper.entrypoints.batcher", "--queue-url", queue_url, "--endpoint-url", url]
    command += ["--slo-ms", "1000", "--poll-wait-s", "1"]
    stopped = 0
    try:
        for _ in range(3):
            batcher = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                assert batcher.stdout is not None
                for line in batcher.stdout:  # running: the handlers are set
                    if "batcher polling" in line:
                        break
                for _ in range(2000):
                    if batcher.poll() is not None:
                        break
                    batcher.send_signal(signal.SIGTERM)
                output, _ = batcher.communicate(timeout=15)
                assert "batcher stopped" in output, output  # its clean stop ran
                # a SIGTERM of the burst that came after the stop, while the interpreter exited, may end it
                assert batcher.returncode in (0, -signal.SIGTERM), output
                stopped += 1
            finally:
                if batcher.poll() is None:
                    batcher.kill()
                    batcher.wait()
    finally:
        stop(endpoint)
    assert stopped == 3
