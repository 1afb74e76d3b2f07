"""The Redis Streams transport's pure helpers (key names, receipt handles) and the wiring that picks the
request queues' transport. No sockets: a Redis client connects on its first command."""

from __future__ import annotations

from typing import Any

import pytest

from clipper.adapters.redis_streams import (
    RedisStreamQueueReader,
    RedisStreamRequestQueue,
    parse_receipt_handle,
    queue_name,
    receipt_handle,
    stream_keys,
)
from clipper.adapters.sqs import SqsQueueReader, SqsRequestQueue
from clipper.errors import NotFound
from clipper.settings import CommonSettings
from clipper.wiring import queue_reader, request_queue

pytestmark = pytest.mark.unit

URL = "https://sqs.us-east-1.amazonaws.com/123456789012/clipper-model-mlp-1"


def test_the_queue_name_is_the_last_segment_of_its_url():
    assert queue_name(URL) == "clipper-model-mlp-1"
    assert queue_name("http://127.0.0.1:5000/000000000000/q_2.fifo") == "q_2.fifo"
    assert queue_name("bare-name") == "bare-name"


@pytest.mark.parametrize("bad", ["", "https://sqs/123/", "https://sqs/123/a{b}", "https://sqs/1/" + "x" * 81])
def test_a_url_without_a_valid_queue_name_is_not_found(bad: str):
    with pytest.raises(NotFound):
        queue_name(bad)


def test_every_key_of_a_queue_carries_the_same_hash_tag():
    keys = stream_keys(URL)
    assert keys.stream == "clipper:queue:{clipper-model-mlp-1}"
    assert keys.delayed == "clipper:queue:{clipper-model-mlp-1}:delayed"
    assert keys.dead_letter == "clipper:queue:{clipper-model-mlp-1}:dlq"
    assert {k.split("{")[1].split("}")[0] for k in keys.all} == {"clipper-model-mlp-1"}
    assert stream_keys(URL, prefix="t").stream == "t:queue:{clipper-model-mlp-1}"


def test_a_receipt_handle_names_the_entry_and_its_delivery():
    assert parse_receipt_handle(receipt_handle("1700000000000-3", 2)) == ("1700000000000-3", 2)
    for bad in ["", "1-0", "1-0:", ":2", "1-0:x"]:
        with pytest.raises(ValueError):
            parse_receipt_handle(bad)


def settings(monkeypatch: pytest.MonkeyPatch, transport: str, redis_url: str = "") -> CommonSettings:
    monkeypatch.setenv("CLIPPER_QUEUE_TRANSPORT", transport)
    monkeypatch.setenv("REDIS_URL", redis_url)
    return CommonSettings(registry_table="registry", replies_table="replies")


def test_sqs_is_the_default_transport(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CLIPPER_QUEUE_TRANSPORT", raising=False)
    s = CommonSettings(registry_table="registry", replies_table="replies")
    sqs = object()
    assert isinstance(request_queue(s, sqs), SqsRequestQueue)
    reader = queue_reader(s, sqs, URL, visibility_timeout_s=5, max_receive_count=2)
    assert isinstance(reader, SqsQueueReader) and reader.queue_url == URL


def test_the_redis_transport_builds_stream_adapters(monkeypatch: pytest.MonkeyPatch):
    s = settings(monkeypatch, "redis", "redis://127.0.0.1:1/0")
    assert isinstance(request_queue(s, None), RedisStreamRequestQueue)
    reader = queue_reader(s, None, URL, visibility_timeout_s=5, max_receive_count=2)
    assert isinstance(reader, RedisStreamQueueReader) and reader.keys == stream_keys(URL)


def test_the_redis_transport_without_redis_url_fails_at_build_time_naming_both(monkeypatch: pytest.MonkeyPatch):
    s = settings(monkeypatch, "redis")
    for build in (lambda: request_queue(s, None), lambda: queue_reader(s, None, URL)):
        with pytest.raises(ValueError, match="CLIPPER_QUEUE_TRANSPORT=redis needs REDIS_URL"):
            build()


@pytest.mark.parametrize(
    ("transport", "cluster", "inline", "fused"),
    [("redis", "false", True, True), ("redis", "true", True, False), ("sqs", "false", False, False)],
)
def test_the_frontend_runs_on_its_loop_and_in_one_round_trip_only_on_a_standalone_redis(
    monkeypatch: pytest.MonkeyPatch, transport: str, cluster: str, inline: bool, fused: bool
):
    from clipper.settings import FrontendSettings
    from clipper.wiring import build_query_processor

    monkeypatch.setenv("CLIPPER_QUEUE_TRANSPORT", transport)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("CLIPPER_REDIS_CLUSTER", cluster)
    s = FrontendSettings(registry_table="registry", replies_table="replies")
    processor = build_query_processor(s, dynamodb=None, sqs=None, s3=None, background_refresh=False)
    assert processor._inline is inline and (processor._gatherer._fused is not None) is fused


def test_the_frontends_registry_copy_gets_the_budget_of_unknown_names_its_settings_say(monkeypatch: pytest.MonkeyPatch):
    import clipper.wiring as wiring
    from clipper.settings import FrontendSettings

    seen: list[float] = []
    real = wiring._registry

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[5] if len(args) > 5 else kwargs.get("unknown_reads_per_s", 0.0))
        return real(*args, **kwargs)

    monkeypatch.setattr(wiring, "_registry", spy)
    monkeypatch.setenv("CLIPPER_UNKNOWN_APP_READS_PER_S", "20")
    s = FrontendSettings(registry_table="registry", replies_table="replies")
    wiring.build_query_processor(s, dynamodb=None, sqs=None, s3=None, background_refresh=False)
    assert seen == [20.0]
