"""When the local stack's launcher asks Redis to rewrite its append-only file (infra.local.aof): once it grew as
much as Redis would have waited for and Redis is quiet, or once it grew by the forced bound whatever the load."""

from __future__ import annotations

import pytest

from infra.local.aof import MIB, AofPolicy, parse_info, rewrite_reason

pytestmark = pytest.mark.unit

POLICY = AofPolicy(due_bytes=64 * MIB, force_bytes=512 * MIB, quiet_ops=100)


def info(base_mb: float, current_mb: float, ops: int, **more: str) -> dict[str, str]:
    fields = {
        "aof_enabled": "1",
        "aof_rewrite_in_progress": "0",
        "aof_rewrite_scheduled": "0",
        "rdb_bgsave_in_progress": "0",
        "aof_base_size": str(int(base_mb * MIB)),
        "aof_current_size": str(int(current_mb * MIB)),
        "instantaneous_ops_per_sec": str(ops),
    }
    return fields | more


def test_due_and_quiet_rewrites_due_and_busy_waits():
    assert rewrite_reason(info(2, 60, ops=10), POLICY) is None  # grew 58 MB: not due
    assert "quiet" in (rewrite_reason(info(2, 70, ops=10), POLICY) or "")
    assert rewrite_reason(info(2, 70, ops=8000), POLICY) is None  # queries are running: later
    assert rewrite_reason(info(2, 500, ops=8000), POLICY) is None


def test_past_the_forced_bound_it_rewrites_whatever_the_load():
    assert "grew by 512 MB" in (rewrite_reason(info(2, 514, ops=8000), POLICY) or "")


def test_a_large_dataset_waits_for_the_file_to_double_as_redis_would():
    assert rewrite_reason(info(100, 190, ops=10), POLICY) is None  # grew 90 MB < its 100 MB base
    assert rewrite_reason(info(100, 201, ops=10), POLICY) is not None
    assert rewrite_reason(info(600, 1150, ops=8000), POLICY) is None  # the forced bound is the base's size too
    assert rewrite_reason(info(600, 1201, ops=8000), POLICY) is not None


def test_nothing_while_a_rewrite_or_save_runs_or_without_an_append_only_file():
    assert rewrite_reason(info(2, 600, ops=10, aof_rewrite_in_progress="1"), POLICY) is None
    assert rewrite_reason(info(2, 600, ops=10, aof_rewrite_scheduled="1"), POLICY) is None
    assert rewrite_reason(info(2, 600, ops=10, rdb_bgsave_in_progress="1"), POLICY) is None
    assert rewrite_reason(info(2, 600, ops=10, aof_enabled="0"), POLICY) is None
    assert rewrite_reason({"aof_enabled": "1", "aof_rewrite_in_progress": "0"}, POLICY) is None  # sizes unknown


def test_info_text_is_read_by_field():
    text = "# Persistence\r\naof_enabled:1\r\naof_base_size:123\r\n\r\n# Stats\r\ninstantaneous_ops_per_sec:7\r\n"
    assert parse_info(text) == {"aof_enabled": "1", "aof_base_size": "123", "instantaneous_ops_per_sec": "7"}
