"""The batcher process's own entry module (clipper.entrypoints.batcher): its options, the graph it builds
per queue transport, and that the library module no longer imports the composition root."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clipper.adapters.redis_streams import RedisStreamQueueReader
from clipper.adapters.sqs import SqsQueueReader
from clipper.entrypoints.batcher import build_driver, parse_args
from clipper.settings import BatcherSettings

pytestmark = pytest.mark.unit

REQUIRED = ["--queue-url", "https://sqs.us-east-1.amazonaws.com/123456789012/q", "--endpoint-url", "http://e"]


def test_options_and_their_defaults(monkeypatch):
    monkeypatch.delenv("CLIPPER_BATCHER_RECEIVERS", raising=False)
    args = parse_args(REQUIRED)
    assert (args.batch_wait_ms, args.receivers, args.buffer_batches, args.poll_wait_s) == (1.0, None, 2.0, 1.0)
    monkeypatch.setenv("CLIPPER_BATCHER_RECEIVERS", "1")  # the local stack's on moto's SQS
    assert parse_args(REQUIRED).receivers == 1
    assert parse_args([*REQUIRED, "--receivers", "0"]).receivers == 0
    args = parse_args([*REQUIRED, "--receivers", "8", "--buffer-batches", "3", "--batch-wait-ms", "0"])
    assert (args.receivers, args.buffer_batches, args.batch_wait_ms) == (8, 3.0, 0.0)


@pytest.mark.parametrize("bad", [["--buffer-batches", "0.5"], ["--receivers", "-1"], ["--poll-wait-s", "-1"]])
def test_bad_options_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        parse_args([*REQUIRED, *bad])
    assert bad[0] in capsys.readouterr().err


@pytest.fixture
def settings(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")

    def make(**fields):
        return BatcherSettings(registry_table="registry", replies_table="replies", cache_enabled=False, **fields)

    return make


@pytest.mark.parametrize(
    ("transport", "reader_type", "receivers", "receive_max"),
    [("sqs", SqsQueueReader, 4, 10), ("redis", RedisStreamQueueReader, 0, None)],
)
def test_the_queue_reader_and_receivers_follow_the_transport(
    settings, monkeypatch, transport, reader_type, receivers, receive_max
):
    monkeypatch.delenv("CLIPPER_BATCHER_RECEIVERS", raising=False)
    # no connection is made: clients connect on their first call
    chosen = settings(queue_transport=transport, redis_url="redis://127.0.0.1:9/0")
    driver = build_driver(parse_args(REQUIRED), chosen)
    assert isinstance(driver._reader, reader_type)
    if receivers:
        assert len(driver._receivers._threads) == receivers and driver._receivers._per_receive == receive_max
    else:  # Redis Streams: the batching thread receives, its deletes carried by the receive
        assert driver._receivers is None and driver._carrier is driver._reader
    driver = build_driver(parse_args([*REQUIRED, "--receivers", "2"]), chosen)
    assert len(driver._receivers._threads) == 2 and driver._carrier is None


def run_python(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60, check=False)


def test_the_entry_module_runs_and_lists_its_options():
    out = run_python("-m", "clipper.entrypoints.batcher", "--help")
    assert out.returncode == 0 and "clipper-batcher" in out.stdout
    assert all(o in out.stdout for o in ("--receivers", "--buffer-batches", "--batch-wait-ms", "--poll-wait-s"))


def test_the_driver_module_does_not_import_the_composition_root():
    code = "import sys, clipper.batching.longpoll; print('clipper.wiring' in sys.modules)"
    out = run_python("-c", code)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_the_registry_is_the_source_of_a_named_models_settings_unless_ignored(settings):
    from clipper.entrypoints.batcher import args_config, config_source

    chosen = settings(queue_transport="sqs")
    assert config_source(parse_args([*REQUIRED, "--model", "mlp"]), chosen) is not None
    assert config_source(parse_args([*REQUIRED, "--model", "mlp", "--ignore-registry"]), chosen) is None
    assert config_source(parse_args([*REQUIRED, "--model", ""]), chosen) is None
    fixed = args_config(parse_args([*REQUIRED, "--batch-size", "8", "--slo-ms", "40"]))
    assert (fixed.batching.controller, fixed.batching.batch_size, fixed.slo_s) == ("fixed", 8, 0.04)


def test_a_zero_config_ttl_follows_the_batching_settings_twice_a_second_rather_than_every_ten_seconds(monkeypatch):
    from clipper.entrypoints.batcher import FOLLOW_MIN_S, follow_interval
    from clipper.settings import BatcherSettings

    monkeypatch.setenv("CLIPPER_REGISTRY_TABLE", "registry")
    monkeypatch.setenv("CLIPPER_REPLIES_TABLE", "replies")
    monkeypatch.setenv("CLIPPER_CONFIG_TTL_S", "0")
    assert follow_interval(BatcherSettings()) == FOLLOW_MIN_S == 0.5
    monkeypatch.setenv("CLIPPER_CONFIG_TTL_S", "3")
    assert follow_interval(BatcherSettings()) == 3.0


@pytest.mark.parametrize("bad", ["-1", "x", "1.5", "\u00b2"])
def test_a_bad_receivers_variable_is_refused_naming_it(monkeypatch, capsys, bad):
    monkeypatch.setenv("CLIPPER_BATCHER_RECEIVERS", bad)
    with pytest.raises(SystemExit):
        parse_args(REQUIRED)
    assert "CLIPPER_BATCHER_RECEIVERS must be a whole number" in capsys.readouterr().err


def test_no_receivers_ahead_on_sqs_is_allowed_with_a_warning(settings, monkeypatch, caplog):
    monkeypatch.delenv("CLIPPER_BATCHER_RECEIVERS", raising=False)
    chosen = settings(queue_transport="sqs", redis_url="redis://127.0.0.1:9/0")
    with caplog.at_level("WARNING", logger="clipper.batcher"):
        driver = build_driver(parse_args([*REQUIRED, "--receivers", "0"]), chosen)
    assert driver._receivers is None and driver._carrier is None  # SQS's deletes stay the acknowledger's
    assert any("--receivers 0 on sqs" in r.message for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="clipper.batcher"):
        build_driver(parse_args(REQUIRED), chosen)
    assert not caplog.records


def test_help_lists_defaults_and_the_environment_whatever_the_receivers_variable_says():
    env = {**os.environ, "CLIPPER_BATCHER_RECEIVERS": "two"}
    out = subprocess.run(
        [sys.executable, "-m", "clipper.entrypoints.batcher", "--help"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "(default: 1.0)" in text and "CLIPPER_REGISTRY_TABLE" in text


def test_a_missing_environment_is_one_line_naming_the_variables():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
    argv = ["--queue-url", "q", "--endpoint-url", "http://127.0.0.1:9"]
    out = subprocess.run(
        [sys.executable, "-m", "clipper.entrypoints.batcher", *argv], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "missing or invalid environment: CLIPPER_REGISTRY_TABLE: Field required" in out.stderr
