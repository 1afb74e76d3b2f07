"""What a model's long-poll batcher batches by, read from the registry and followed while it runs.

    source = RegistryBatcherConfig(registry, "mlp", slo_fraction=0.5, fallback_slo_s=0.1)
    config = source.load()           # BatcherConfig(slo_s=0.01, batching=BatchingSettings(...), apps=("digits",))
    follower = ConfigFollower(source, driver, every_s=10)
    follower.start()                 # a thread: load every 10 s, and reconfigure the driver when it changed

The batch latency objective is ``slo_fraction`` of the strictest SLO among the applications linked to the model
(the rest of the SLO is for the frontend, the queue and the reply); a model linked to no application batches by
``fallback_slo_s``. The batching settings are the model's (``set_model_batching``; the defaults when never set).
A registry that cannot be read keeps the last configuration (logged), so a batcher never stops for it.

Each load reads the model's record (its settings and links: one query); an application's SLO is read when it is
first linked, and again every ``apps_every`` loads (an application's SLO never changes while it exists; a
deleted application leaves the links at the next load, and one deleted and added again under its name with the
same link within one load's interval is read again within ``apps_every`` loads). A follower refreshing a model
linked to four applications every 2 s made five registry reads each time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from clipper.batching.controller import BatchSizeController, make_controller
from clipper.core.domain import Application, BatchingSettings, ModelRecord
from clipper.errors import ClipperError, NotFound

logger = logging.getLogger(__name__)

WAIT_SHARE = 0.5  # the most of the batch latency objective a batch waits to fill
# the long-poll batcher's defaults (clipper-batcher --slo-fraction, --slo-ms): what the management API's batching
# answers say a model's batchers apply
SLO_FRACTION = 0.5
FALLBACK_SLO_MS = 100.0


class ModelRegistry(Protocol):
    def model_record(self, name: str) -> ModelRecord: ...

    def get_app(self, name: str) -> Application: ...


@dataclass(frozen=True)
class BatcherConfig:
    slo_s: float  # the batch latency objective
    batching: BatchingSettings
    apps: tuple[str, ...] = ()  # the linked applications the SLO came from

    def controller(self) -> BatchSizeController:
        b = self.batching
        return make_controller(b.controller, self.slo_s, b.batch_size, b.max_batch_size)

    @property
    def batch_wait_s(self) -> float:
        """The batch wait the long-poll driver applies: the model's, at most ``WAIT_SHARE`` of the latency
        objective. A wait set for the Lambda batcher's batching window (1 s) or for a looser application would
        otherwise hold the first query of a batch past a linked application's deadline at light load."""
        return min(self.batching.batch_wait_ms / 1000, WAIT_SHARE * self.slo_s)

    @property
    def wait_capped(self) -> bool:
        """Whether ``batch_wait_s`` is less than the model's setting (capped at ``WAIT_SHARE`` of the objective)."""
        return self.batch_wait_s < self.batching.batch_wait_ms / 1000

    def describe(self) -> str:
        b = self.batching
        size = f"size {b.batch_size}" if b.controller == "fixed" else f"at most {b.max_batch_size}"
        source = f"strictest of {', '.join(self.apps)}" if self.apps else "no linked application"
        wait = f"batch wait {b.batch_wait_ms:g} ms"
        if self.wait_capped:
            wait += f" (waits {self.batch_wait_s * 1000:g} ms: half the latency objective)"
        return f"{b.controller} ({size}), {wait}, latency objective {self.slo_s * 1000:g} ms ({source})"

    def applied(self) -> dict[str, object]:
        """What a long-poll batcher batches by, for the management API's answers: the latency objective and where
        it comes from, and the batch wait it applies (``batch_wait_s``), with a note when that is less than the
        model's setting."""
        b = self.batching
        view: dict[str, object] = {
            "latency_objective_ms": round(self.slo_s * 1000, 3),
            "objective_of": list(self.apps),  # the strictest linked applications; none: the batchers' --slo-ms
            "batch_wait_ms": round(self.batch_wait_s * 1000, 3),
        }
        if self.wait_capped:
            view["note"] = (
                f"batch_wait_ms {b.batch_wait_ms:g} is more than half the latency objective: the long-poll "
                f"batchers wait {self.batch_wait_s * 1000:g} ms (the Lambda batcher takes the setting)"
            )
        return view


class RegistryBatcherConfig:
    def __init__(
        self, registry: ModelRegistry, model: str, slo_fraction: float, fallback_slo_s: float, apps_every: int = 10
    ) -> None:
        if not 0 < slo_fraction <= 1:
            raise ValueError("slo_fraction must be in (0, 1]")
        if apps_every < 1:
            raise ValueError("apps_every must be at least 1")
        self._registry = registry
        self._model = model
        self._fraction = slo_fraction
        self._fallback = fallback_slo_s
        self._apps_every = apps_every
        self._known: dict[str, float] = {}  # linked applications' SLOs, read at most apps_every loads ago
        self._loads = 0

    def load(self) -> BatcherConfig:
        """The model's configuration now; ``ClipperError`` when the registry cannot be read, ``NotFound``
        when the model is not registered."""
        record = self._registry.model_record(self._model)
        known = self._known if self._loads % self._apps_every else {}
        self._loads += 1
        slos: dict[str, float] = {}
        for app in record.linked_apps:
            if app in known:
                slos[app] = known[app]
                continue
            try:
                slos[app] = self._registry.get_app(app).slo_seconds
            except NotFound:
                continue  # unlinked while we read
        self._known = slos  # only the linked ones: an application unlinked is read again if it is linked again
        if not slos:
            return BatcherConfig(self._fallback, record.batching)
        strictest = min(slos.values())
        apps = tuple(sorted(a for a, s in slos.items() if s == strictest))
        return BatcherConfig(strictest * self._fraction, record.batching, apps)


class Reconfigurable(Protocol):
    def reconfigure(self, controller: BatchSizeController, batch_wait_s: float) -> None: ...


class ConfigFollower:
    """Loads the configuration every ``every_s`` on a thread of its own (never on the batch path) and hands a
    changed one to the driver, which applies it between batches."""

    def __init__(
        self,
        source: RegistryBatcherConfig,
        driver: Reconfigurable,
        every_s: float,
        current: BatcherConfig | None = None,
        on_change: Callable[[BatcherConfig], None] | None = None,
    ) -> None:
        self._source = source
        self._driver = driver
        self._every = every_s
        self.current = current
        self._on_change = on_change
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clipper-batcher-config", daemon=True)

    def refresh(self) -> bool:
        """Load once; True when the configuration changed (and was handed to the driver)."""
        try:
            config = self._source.load()
        except ClipperError as e:
            logger.warning("batching configuration not refreshed (keeping %s): %s", self.current, e)
            return False
        if config == self.current:
            return False
        self.current = config
        self._driver.reconfigure(config.controller(), config.batch_wait_s)
        logger.info("batching: %s", config.describe())
        if self._on_change is not None:
            self._on_change(config)
        return True

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
