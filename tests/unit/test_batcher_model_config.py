"""A model's batching configuration as the long-poll batcher reads it from the registry: its settings, the
strictest linked application's SLO, and the driver reconfigured between batches when they change."""

from __future__ import annotations

import threading

import pytest

from clipper.batching.controller import AimdController, FixedController, QuantileController
from clipper.batching.longpoll import LongPollDriver
from clipper.batching.model_config import BatcherConfig, ConfigFollower, RegistryBatcherConfig
from clipper.core.domain import Application, BatchingSettings, InputType, Model, ModelRecord
from clipper.errors import NotFound, Unavailable
from clipper.ports import ReceivedMessage

pytestmark = pytest.mark.unit


class Registry:
    def __init__(self) -> None:
        self.apps: dict[str, int] = {"fast": 20_000, "slow": 200_000}
        self.links = ["fast", "slow"]
        self.batching = BatchingSettings()
        self.down = False
        self.app_reads: list[str] = []

    def model_record(self, name: str) -> ModelRecord:
        if self.down:
            raise Unavailable("registry down")
        if name != "mlp":
            raise NotFound("model", name)
        return ModelRecord(Model("mlp", "1"), {}, linked_apps=list(self.links), batching=self.batching)

    def get_app(self, name: str) -> Application:
        self.app_reads.append(name)
        if name not in self.apps:
            raise NotFound("application", name)
        return Application(name, InputType.FLOATS, "-1", self.apps[name])


def test_the_objective_is_a_fraction_of_the_strictest_linked_slo():
    registry = Registry()
    config = RegistryBatcherConfig(registry, "mlp", 0.5, fallback_slo_s=0.1).load()
    assert config.slo_s == pytest.approx(0.010)  # half of fast's 20 ms
    assert config.apps == ("fast",)
    registry.apps["slow"] = 8_000  # an SLO made stricter
    assert RegistryBatcherConfig(registry, "mlp", 0.5, 0.1).load().slo_s == pytest.approx(0.004)
    registry.links = ["gone"]  # a link to an app deleted meanwhile, and no other: the fallback
    assert RegistryBatcherConfig(registry, "mlp", 0.5, 0.1).load() == BatcherConfig(0.1, BatchingSettings())
    with pytest.raises(NotFound):
        RegistryBatcherConfig(registry, "nope", 0.5, 0.1).load()


def test_a_linked_applications_slo_is_read_when_linked_then_again_every_apps_every_loads():
    """A load reads the model's record each time, but an application's SLO (fixed while the application exists)
    only when it is newly linked, and again every ``apps_every`` loads (an application deleted and added again
    under its name within one interval)."""
    registry = Registry()
    source = RegistryBatcherConfig(registry, "mlp", 0.5, 0.1, apps_every=3)
    assert source.load().slo_s == pytest.approx(0.010)
    assert sorted(registry.app_reads) == ["fast", "slow"]
    registry.app_reads.clear()
    source.load()
    assert registry.app_reads == []  # known: not read again
    registry.apps["new"] = 4_000
    registry.links.append("new")
    assert source.load().slo_s == pytest.approx(0.002)  # a new link is read at once
    assert registry.app_reads == ["new"]
    registry.app_reads.clear()
    registry.apps["fast"] = 1_000  # deleted and added again with another SLO, linked again
    assert source.load().slo_s == pytest.approx(0.0005)  # the fourth load reads every application again
    assert sorted(registry.app_reads) == ["fast", "new", "slow"]
    registry.links = ["slow"]  # the others unlinked: forgotten, read again if linked again
    source.load()
    registry.links = ["slow", "new"]
    registry.app_reads.clear()
    source.load()
    assert registry.app_reads == ["new"]


@pytest.mark.parametrize(
    ("settings", "kind", "size"),
    [
        (BatchingSettings(), AimdController, 256),
        (BatchingSettings(controller="quantile", max_batch_size=64), QuantileController, 64),
        (BatchingSettings(controller="fixed", batch_size=8), FixedController, 8),
    ],
)
def test_the_settings_choose_the_controller(settings, kind, size):
    controller = BatcherConfig(0.01, settings).controller()
    assert isinstance(controller, kind)
    if kind is FixedController:
        assert controller.max_batch_size() == size
    else:
        assert controller.upper == size
        assert controller.slo_s == 0.01


def test_bad_settings_name_their_fields():
    assert BatchingSettings().problems() == []
    problems = BatchingSettings(controller="magic", max_batch_size=0, batch_wait_ms=-1).problems()
    assert [p.split(":")[0] for p in problems] == ["controller", "max_batch_size", "batch_wait_ms"]
    assert BatchingSettings(controller="fixed").problems()[0].startswith("batch_size")
    assert BatchingSettings(batch_size=4).problems()[0].startswith("batch_size")


class Reader:
    def receive(self, max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        return []

    def delete(self, receipt_handles: list[str]) -> None:
        return None

    def release(self, receipt_handle: str, delay_s: int) -> None:
        return None


def test_a_changed_configuration_reaches_the_driver_before_its_next_batch():
    registry = Registry()
    source = RegistryBatcherConfig(registry, "mlp", 0.5, 0.1)
    first = source.load()
    driver = LongPollDriver(Reader(), batcher=None, controller=first.controller(), batch_wait_s=0.001, idle_wait_s=0)  # type: ignore[arg-type]
    driver.controller.size = 40.0  # learned while running
    follower = ConfigFollower(source, driver, every_s=60, current=first)
    assert follower.refresh() is False  # nothing changed: nothing handed over

    registry.batching = BatchingSettings(controller="quantile", max_batch_size=128, batch_wait_ms=4)
    registry.apps["strict"] = 10_000  # a stricter application linked
    registry.links.append("strict")
    assert follower.refresh() is True
    assert isinstance(driver.controller, AimdController)  # not yet: applied between batches
    driver.collect(threading.Event())
    assert isinstance(driver.controller, QuantileController)
    assert driver.controller.slo_s == pytest.approx(0.005) and driver.controller.upper == 128
    assert driver.controller.max_batch_size() == 40  # it starts from the size learned so far
    assert driver.batch_wait_s == pytest.approx(0.0025)  # 4 ms asked, at most half the 5 ms objective

    registry.down = True  # a registry that cannot be read keeps the last configuration
    assert follower.refresh() is False
    assert follower.current is not None and follower.current.batching.controller == "quantile"
    driver.close()


def test_the_batch_wait_is_at_most_half_the_latency_objective():
    """A wait of 1 s (the Lambda batcher's batching window) held the first query of a batch past a 500 ms
    application's deadline at light load: 9 of 20 queries were defaults on the live stack."""
    registry = Registry()
    registry.apps = {"digits": 500_000}
    registry.links = ["digits"]
    registry.batching = BatchingSettings(batch_wait_ms=1000)
    config = RegistryBatcherConfig(registry, "mlp", 0.5, 0.1).load()
    assert config.slo_s == pytest.approx(0.25) and config.batch_wait_s == pytest.approx(0.125)
    assert "batch wait 1000 ms (waits 125 ms: half the latency objective)" in config.describe()
    registry.batching = BatchingSettings(batch_wait_ms=2)
    config = RegistryBatcherConfig(registry, "mlp", 0.5, 0.1).load()
    assert config.batch_wait_s == pytest.approx(0.002) and "waits" not in config.describe()
