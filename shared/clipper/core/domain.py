"""Applications, models and their versions: the values the registry stores."""

from __future__ import annotations

import enum
import re
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

from clipper.canary.decision import CanaryParams
from clipper.selection.params import PolicyParams


class InputType(enum.StrEnum):
    """Clipper's input types."""

    INTEGERS = "integers"
    FLOATS = "floats"
    DOUBLES = "doubles"
    BYTES = "bytes"
    STRINGS = "strings"

    @property
    def numeric(self) -> bool:
        return self in (InputType.INTEGERS, InputType.FLOATS, InputType.DOUBLES)

    @property
    def numpy_dtype(self) -> str:
        """The dtype a numeric input travels in (strings and bytes travel as JSON)."""
        return {
            InputType.INTEGERS: "int32",
            InputType.FLOATS: "float32",
            InputType.DOUBLES: "float64",
        }.get(self, "object")


# An application's name, as add_app takes it: a frontend answers a URL naming anything else 404 without a registry
# read (a made-up name of thousands of bytes was a read DynamoDB refuses, its key past 2,048 bytes)
APP_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
MAX_APP_NAME = 100
_APP_NAME = re.compile(APP_NAME_PATTERN)


def possible_app_name(name: str) -> bool:
    """Whether ``name`` could name an application (``add_app`` refuses every other)."""
    return 0 < len(name) <= MAX_APP_NAME and _APP_NAME.fullmatch(name) is not None


def new_incarnation() -> int:
    """A new application's ``incarnation``: random, never 0 (the incarnation of applications added before
    incarnations existed)."""
    return secrets.randbits(62) | 1


@dataclass(frozen=True)
class Application:
    """A registered application: what it accepts, how fast it must answer, what it answers by default."""

    name: str
    input_type: InputType
    default_output: str
    latency_slo_micros: int
    input_shape: tuple[int, ...] | None = None
    policy: str = "single"
    # Exp4: under this confidence the response says so; with default_when_unsure it carries the default.
    confidence_threshold: float = 0.0
    default_when_unsure: bool = False
    # eta, gamma, epsilon, Exp4's k, loss_scale (set_policy_params); unset ones are the policy's defaults
    policy_params: PolicyParams = field(default_factory=PolicyParams)
    # Which registration of the name this is (random, set when the application is added; 0 for one registered
    # before it existed): an application deleted and added again under the same name is a new one, so bandit
    # states learned for the old one (the application's and its users') are not used for it.
    incarnation: int = 0
    # How many times the stored application was changed (0 as added): a change made from a read is written only
    # over the revision it read, so two changes made at once never lose one of them.
    revision: int = 0

    @property
    def slo_seconds(self) -> float:
        return self.latency_slo_micros / 1_000_000


@dataclass(frozen=True)
class ModelVersion:
    """One deployed version of a model, with where its queries go and who answers them."""

    name: str
    version: str
    input_type: InputType
    queue_url: str
    endpoint: str
    input_shape: tuple[int, ...] | None = None
    labels: tuple[str, ...] = field(default_factory=tuple)
    # When the registry registered it (epoch seconds; 0: not read from a registry that records it). A version
    # deleted and registered again (another upload under its name) is another model: its predictions are cached
    # under other keys (``cache_version``), so the deleted one's are never answered for it.
    created_at: int = 0

    @property
    def cache_version(self) -> str:
        """The version as the prediction cache's keys name it."""
        return self.version if not self.created_at else f"{self.version}\x00{self.created_at}"


@dataclass(frozen=True)
class Canary:
    """A version of a model taking ``share`` of the model's queries (0 < share < 1) beside the active version,
    until live evidence promotes it or rolls it back. A version canaried twice is two trials: evidence is kept
    per ``trial`` (the version and the moment the canary started), so an earlier trial's counts never mix in."""

    version: str
    share: float
    started_at: float  # seconds since the epoch
    params: CanaryParams = field(default_factory=CanaryParams)  # how the decision judges this trial

    @property
    def trial(self) -> str:
        return f"{self.version}@{int(self.started_at * 1000)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "share": self.share,
            "started_at": self.started_at,
            "trial": self.trial,
            "params": asdict(self.params),
        }


@dataclass(frozen=True)
class Model:
    """A model name with its active version, and its canary while one runs."""

    name: str
    active_version: str
    canary: Canary | None = None


CONTROLLERS = ("aimd", "quantile", "fixed")


@dataclass(frozen=True)
class BatchingSettings:
    """How a model's batcher cuts batches (``set_model_batching``): the controller (Clipper's AIMD, the quantile
    regression of p99 latency on batch size, or a fixed size), the fixed size, the adaptive size's upper bound,
    and the batch wait T (how long a batch waits for more queries after its first)."""

    controller: str = "aimd"
    batch_size: int = 0  # the fixed controller's size
    max_batch_size: int = 256
    batch_wait_ms: float = 1.0

    def problems(self) -> list[str]:
        """What is wrong with these settings, one line per field (empty when they are valid)."""
        out = []
        if self.controller not in CONTROLLERS:
            out.append(f"controller: one of {', '.join(CONTROLLERS)}, got {self.controller!r}")
        if self.controller == "fixed" and not 1 <= self.batch_size <= self.max_batch_size:
            out.append(f"batch_size: 1 to max_batch_size ({self.max_batch_size}) with the fixed controller")
        if self.controller != "fixed" and self.batch_size != 0:
            out.append('batch_size: only with the fixed controller (controller "fixed"; 0 otherwise)')
        if not 1 <= self.max_batch_size <= 10_000:
            out.append(f"max_batch_size: 1 to 10000, got {self.max_batch_size}")
        if not 0 <= self.batch_wait_ms <= 1_000:
            out.append(f"batch_wait_ms: 0 to 1000, got {self.batch_wait_ms}")
        return out

    @property
    def largest_batch(self) -> int:
        """The most rows a batch may take: the fixed size, or the adaptive size's bound."""
        return self.batch_size if self.controller == "fixed" else self.max_batch_size

    @property
    def clipper_batch_size(self) -> int:
        """Clipper's ``batch_size`` field: the fixed size, or -1 when the size adapts."""
        return self.batch_size if self.controller == "fixed" else -1

    def to_dict(self) -> dict[str, Any]:
        return {
            "controller": self.controller,
            "batch_size": self.batch_size,
            "max_batch_size": self.max_batch_size,
            "batch_wait_ms": self.batch_wait_ms,
        }


@dataclass(frozen=True)
class ModelRecord:
    """Everything the registry holds about one model, for the management API."""

    head: Model
    versions: dict[str, ModelVersion]
    auto_promote: bool = False
    replicas: int = 1
    # per version: artifact, sha256, created_at... of registered versions; reasons... of rejected uploads
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    rejected: dict[str, dict[str, Any]] = field(default_factory=dict)
    linked_apps: list[str] = field(default_factory=list)
    batching: BatchingSettings = field(default_factory=BatchingSettings)
