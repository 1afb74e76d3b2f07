from __future__ import annotations

import pytest

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.core.domain import InputType
from clipper.core.registry_cache import CachedRegistry
from clipper.errors import Conflict, NotFound
from tests.fakes import FakeClock, digits_app, model_version

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(aws):
    return DynamoDBRegistry(aws.dynamodb, aws.registry_table)


def test_app_links_and_versions_round_trip(registry):
    registry.put_app(digits_app())
    registry.link("digits", "mlp")
    registry.link("digits", "logreg")
    registry.put_version(model_version("mlp", "1"), activate=True)
    registry.put_version(model_version("mlp", "2", labels=("canary",)))
    app = registry.get_app("digits")
    assert app == digits_app()
    assert registry.linked_models("digits") == ["mlp", "logreg"]  # in the order linked: "single" takes mlp
    assert registry.active_version("mlp").version == "1"
    assert registry.get_version("mlp", "2").labels == ("canary",)
    registry.set_active_version("mlp", "2")
    assert registry.active_version("mlp").version == "2"


def test_links_keep_the_order_they_were_made_in(registry, aws):
    registry.put_app(digits_app())
    for model in ("tree", "forest", "mlp"):
        registry.link("digits", model)
    registry.link("digits", "tree")  # linked again: keeps its place
    assert registry.linked_models("digits") == ["tree", "forest", "mlp"]
    registry.unlink("digits", "tree")
    registry.link("digits", "tree")  # unlinked and linked again: now the last
    assert registry.linked_models("digits") == ["forest", "mlp", "tree"]
    # a link written before the order was recorded (no linked_at) comes first, those among them by name
    aws.dynamodb.put_item(TableName=aws.registry_table, Item={"pk": {"S": "APP#digits"}, "sk": {"S": "LINK#old"}})
    assert registry.linked_models("digits") == ["old", "forest", "mlp", "tree"]


def test_unshaped_app_and_not_found(registry):
    registry.put_app(digits_app(name="text", input_type=InputType.STRINGS, input_shape=None))
    assert registry.get_app("text").input_shape is None
    with pytest.raises(NotFound, match="application 'nope'"):
        registry.get_app("nope")
    with pytest.raises(NotFound, match="model 'nope'"):
        registry.active_version("nope")
    registry.put_version(model_version("m", "1"), activate=True)
    with pytest.raises(NotFound, match="m:9"):
        registry.get_version("m", "9")


def test_duplicate_app_is_a_conflict(registry):
    registry.put_app(digits_app())
    with pytest.raises(Conflict) as refused:
        registry.put_app(digits_app(latency_slo_micros=5))
    assert str(refused.value).endswith("application digits already exists")  # not the internal key APP#digits
    assert "APP#" not in str(refused.value)
    registry.put_app(digits_app(latency_slo_micros=5), overwrite=True)
    assert registry.get_app("digits").latency_slo_micros == 5


def test_cached_registry_refreshes_after_its_ttl(registry):
    clock = FakeClock()
    cached = CachedRegistry(registry, clock, ttl_s=2)
    registry.put_version(model_version("mlp", "1"), activate=True)
    registry.put_version(model_version("mlp", "2"))
    assert cached.active_version("mlp").version == "1"
    registry.set_active_version("mlp", "2")
    assert cached.active_version("mlp").version == "1"  # within the refresh interval
    clock.advance(2.1)
    assert cached.active_version("mlp").version == "2"
    with pytest.raises(NotFound):
        cached.get_app("digits")
    registry.put_app(digits_app())
    with pytest.raises(NotFound):
        cached.get_app("digits")  # the miss is cached too
    clock.advance(2.1)
    assert cached.get_app("digits").name == "digits"


def test_a_models_batching_settings_round_trip_and_reach_its_batcher(registry):
    from clipper.batching.model_config import RegistryBatcherConfig
    from clipper.core.domain import BatchingSettings

    registry.put_app(digits_app())  # SLO 100 ms
    registry.link("digits", "mlp")
    registry.put_version(model_version("mlp", "1"), activate=True)
    assert registry.model_record("mlp").batching == BatchingSettings()  # never set: the defaults
    chosen = BatchingSettings(controller="fixed", batch_size=16, max_batch_size=64, batch_wait_ms=2.5)
    registry.set_model_settings("mlp", batching=chosen)
    assert registry.model_record("mlp").batching == chosen
    config = RegistryBatcherConfig(registry, "mlp", 0.5, fallback_slo_s=1.0).load()
    assert (config.batching, config.apps) == (chosen, ("digits",))
    assert config.slo_s == pytest.approx(digits_app().slo_seconds / 2)
    with pytest.raises(NotFound):
        registry.set_model_settings("nope", batching=chosen)


def test_past_its_budget_a_frontends_copy_answers_unknown_names_from_one_scan_of_the_names(registry, aws, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from clipper.settings import FrontendSettings
    from clipper.wiring import _registry

    registry.put_app(digits_app())
    registry.put_app(digits_app(name="other"))
    calls: list[tuple[str, dict[str, object]]] = []

    def count(event_name: str, params: dict[str, object], **_: object) -> None:
        calls.append((event_name.rsplit(".", 1)[-1], params))

    aws.dynamodb.meta.events.register("provide-client-params.dynamodb.*", count)
    monkeypatch.setenv("CLIPPER_UNKNOWN_APP_READS_PER_S", "5")  # as the local stack sets it (20)
    settings = FrontendSettings(registry_table=aws.registry_table, replies_table="replies")
    assert FrontendSettings(registry_table="r" * 3, replies_table="r" * 3).unknown_app_reads_per_s == 5
    runner = ThreadPoolExecutor(max_workers=1)
    cached = _registry(settings, aws.dynamodb, FakeClock(), 2.0, runner.submit, settings.unknown_app_reads_per_s)
    try:
        for i in range(5):
            assert cached.get_app_held(f"nope-{i}", admit=True) == (None, False)  # within the budget: each read
            with pytest.raises(NotFound):
                cached.get_app(f"nope-{i}")
        assert [op for op, _ in calls] == ["Query"] * 5
        assert cached.get_app_held("nope-5", admit=True) == (None, False)  # over the budget: the names asked for
        runner.submit(lambda: None).result()  # the scan, on the refresh thread, is done
        scan = [params for op, params in calls if op == "Scan"]
        assert len(scan) == 1 and scan[0]["ProjectionExpression"] == "pk"  # the names alone
        calls.clear()
        for i in range(6, 200):
            with pytest.raises(NotFound, match=f"application 'nope-{i}'"):
                cached.get_app_held(f"nope-{i}", admit=True)
        assert calls == []
        assert cached.get_app_held("other", admit=True) == (None, False)  # listed: read by name
        assert cached.get_app("other").name == "other"
    finally:
        runner.shutdown()
    monkeypatch.delenv("CLIPPER_UNKNOWN_APP_READS_PER_S")
    assert FrontendSettings(registry_table="r" * 3, replies_table="r" * 3).unknown_app_reads_per_s == 0  # AWS
