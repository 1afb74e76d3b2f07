"""Request bodies of the management operations: Clipper's management JSON, plus our optional fields."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from clipper.core.domain import APP_NAME_PATTERN, MAX_APP_NAME
from clipper.core.media import has_lone_surrogate
from clipper.core.validation import json_kind

# Switches are JSON's true and false (StrictBool): pydantic's lax bool took "yes", "off", 1 and 0 as well, so a
# typo'd or stringly-typed value was applied instead of refused naming the field. Likewise numbers are JSON numbers
# (Number, StrictInt): the lax ones took true as 1 and "100000" as 100000 (an application registered with an SLO
# of 1 us from one JSON slip), and an integer field takes no 2.0.
InputTypeName = Literal["integers", "bytes", "floats", "doubles", "strings"]
PolicyName = Literal["single", "epsilon_greedy", "exp3", "exp4"]


def _storable(x: float) -> float:
    """DynamoDB numbers go from 1e-130 to under 1e126: a smaller non-zero one (5e-324) or a larger one (1e200) would
    fail the write (a 503)."""
    if 0.0 < abs(x) < 1e-100:
        raise ValueError("a number of magnitude at least 1e-100, or 0 (the registry stores no smaller)")
    if abs(x) > 1e125:
        raise ValueError("a number of magnitude at most 1e125 (the registry stores no larger)")
    return x


Number = Annotated[float, Strict(), AfterValidator(_storable)]

# A string field's bound where its own is not given: every such field is a name, an address or a label, and the
# registry (DynamoDB: 400 KB an item, 2 KB a key) refused larger ones with a ValidationException, answered 503
MAX_TEXT_CHARS = 2_048
MAX_DEFAULT_CHARS = 65_536
MAX_DEFAULT_DEPTH = 64  # the answer's JSON encoder stops at 254 levels: a deeper default was a 500 at each default
MAX_LABELS_BYTES = 128 * 1024
MAX_DIMENSIONS = 32
MAX_DIMENSION = 2**31 - 1


def _shape(shape: list[int] | None) -> list[int] | None:
    if shape is not None and (
        not shape or len(shape) > MAX_DIMENSIONS or any(d <= 0 or d > MAX_DIMENSION for d in shape)
    ):
        raise ValueError(f"a list of 1 to {MAX_DIMENSIONS} positive dimensions, each at most {MAX_DIMENSION}")
    return shape


def _model_shape(shape: list[int] | None) -> list[int] | None:
    """A model's: ``[]`` is no fixed shape, as ``get_model`` answers one (an application's ``[]`` is refused)."""
    return _shape(shape) if shape else shape


def _depth(value: Any) -> int:
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, list | dict):
            deepest = max(deepest, level)
            todo.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _answerable(text: str) -> str:
    """A default output is answered as the JSON it spells (``clipper.frontend.query.default_value``)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text  # answered as the string
    if _depth(value) > MAX_DEFAULT_DEPTH:
        raise ValueError(f"JSON nested at most {MAX_DEFAULT_DEPTH} levels deep (it is answered as that JSON)")
    return text


def _labels(labels: list[str]) -> list[str]:
    if sum(len(label.encode("utf-8", "surrogatepass")) for label in labels) > MAX_LABELS_BYTES:
        raise ValueError(f"labels of at most {MAX_LABELS_BYTES} bytes in all (UTF-8)")
    return labels


Shape = Annotated[list[StrictInt] | None, AfterValidator(_shape)]
ModelShape = Annotated[list[StrictInt] | None, AfterValidator(_model_shape)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _text(cls, value: Any, info: ValidationInfo) -> Any:
        """Every string field: no lone surrogate, and at most MAX_TEXT_CHARS unless the field sets its own."""
        if has_lone_surrogate(value):
            raise ValueError("text without a lone surrogate escape (\\ud800-\\udfff alone; no UTF-8 carries it)")
        if info.field_name not in _OWN_BOUND and _longest_text(value) > MAX_TEXT_CHARS:
            raise ValueError(f"text of at most {MAX_TEXT_CHARS} characters")
        return value


_OWN_BOUND = {"default_output", "labels"}


def _longest_text(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return max((_longest_text(v) for v in value), default=0)
    return 0


class ErrorBody(BaseModel):
    """Every refusal: what kind, and the cause naming the field or the thing."""

    error: str
    cause: str


# An answer goes from the frontend through a request queue, a batcher and a model server and back: below a
# millisecond every query of the application would be its default (a 1 us SLO was registered, and answered so).
MIN_SLO_MICROS = 1_000


# /admin/... is the admin API's (API Gateway routes POST /admin/{operation} to it): an application named admin could
# be registered and never queried, its POST /admin/predict answered 404 "no such operation" (a user's review)
RESERVED_APP_NAMES = frozenset({"admin"})


def _not_reserved(name: str) -> str:
    if name in RESERVED_APP_NAMES:
        raise ValueError(f"the name {name!r} is reserved (POST /{name}/... is the admin API's)")
    return name


class AddApp(Body):
    name: Annotated[str, AfterValidator(_not_reserved)] = Field(
        min_length=1, max_length=MAX_APP_NAME, pattern=APP_NAME_PATTERN
    )
    input_type: InputTypeName
    default_output: Annotated[str, AfterValidator(_answerable)] = Field(
        max_length=MAX_DEFAULT_CHARS, description="answered as the JSON it spells (else as the string)"
    )
    latency_slo_micros: StrictInt = Field(
        ge=MIN_SLO_MICROS,
        le=30_000_000,
        description="1 ms (a queue, a batcher and a model between) to 30 s (API Gateway's limit)",
    )
    input_shape: Shape = Field(None, description="fixed input shape, e.g. [64]; omit for any length")
    policy: PolicyName = "single"
    confidence_threshold: Number = Field(0.0, ge=0.0, le=1.0)
    default_when_unsure: StrictBool = False


class SetPolicy(Body):
    name: str
    policy: PolicyName
    confidence_threshold: Number | None = Field(None, ge=0.0, le=1.0)
    default_when_unsure: StrictBool | None = None


class SetPolicyParams(Body):
    """An application's policy parameters: a value sets one, null returns it to the policy's default, an omitted
    one keeps its value. Each policy takes its own: epsilon_greedy epsilon; exp3 gamma and eta; exp4 eta and k; every
    policy loss_scale."""

    name: str
    eta: Number | None = Field(None, gt=0.0, allow_inf_nan=False, description="Exp3's and Exp4's learning rate")
    gamma: Number | None = Field(None, gt=0.0, le=1.0, description="Exp3's exploration: each model gets gamma / K")
    epsilon: Number | None = Field(None, gt=0.0, le=1.0, description="epsilon-greedy's share of random choices")
    k: StrictInt | None = Field(None, ge=1, description="Exp4: how many of the heaviest models answer (null: all)")
    loss_scale: Number | None = Field(
        None,
        gt=0.0,
        allow_inf_nan=False,
        description="every policy: the absolute error of a score (a regression output) that feedback counts as a "
        "whole loss (losses are in [0, 1]; null: 1), and the unit of Exp4's agreement tolerance (0.1 of it)",
    )


class Name(Body):
    name: str


class AppName(Body):
    app_name: str


class Links(Body):
    app_name: str
    model_names: list[str] = Field(min_length=1)


class ModelRef(Body):
    model_name: str
    model_version: str


class ModelName(Body):
    model_name: str


class AddModel(Body):
    model_name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")
    model_version: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    input_type: InputTypeName
    input_shape: ModelShape = None
    queue_url: str | None = Field(None, description="the model's request queue; default: the active version's")
    endpoint: str | None = Field(None, description="URL or sagemaker:<name>; default: the active version's")
    labels: Annotated[list[str], AfterValidator(_labels)] = Field(default_factory=list)
    activate: StrictBool = Field(True, description="make this the active version (Clipper's behaviour)")
    auto_promote: StrictBool | None = Field(
        None, description="make each version registered from an upload active (unset: leave the setting as is)"
    )
    # Clipper's add_model fields (clipper_admin's register_model sends them): accepted; container_name is answered
    # back, batch_size > 0 fixes the model's batch size (set_model_batching), -1 leaves the model's batching as
    # it is (clipper_admin sends -1 by default: a register_model must not undo a size set before).
    container_name: str | None = Field(None, description="Clipper's model container image (recorded, not run)")
    model_data_path: str | None = Field(None, description="Clipper's (deprecated there too): ignored")
    batch_size: StrictInt | None = Field(
        None,
        ge=-1,
        description="Clipper's: > 0 fixes the model's batch size; -1 (clipper_admin's default) or unset leaves the "
        "model's batching as it is (adaptive unless fixed before: set_model_batching changes it)",
    )


class AutoPromote(Body):
    model_name: str
    auto_promote: StrictBool


class Replicas(Body):
    model_name: str
    num_replicas: StrictInt = Field(ge=1, le=100, description="serving instances of each of the model's versions")


class UploadTarget(Body):
    model_name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")
    model_version: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    promote: StrictBool | None = Field(
        None,
        description="false: register the upload without making it active, whatever the model's auto_promote; "
        "true: make it active; unset: the model's auto_promote decides. The PUT must send the answer's headers",
    )


class Verbose(Body):
    verbose: StrictBool = False


class Replica(Body):
    model_name: str
    model_version: str
    replica_id: StrictInt = Field(ge=0)


class ModelBatching(Body):
    model_name: str
    controller: Literal["aimd", "quantile", "fixed"] = "aimd"
    batch_size: StrictInt = Field(0, ge=0, description="the fixed controller's size (0 otherwise)")
    max_batch_size: StrictInt = Field(256, ge=1, le=10_000, description="the adaptive size's upper bound")
    batch_wait_ms: Number = Field(1.0, ge=0, le=1_000, description="how long a batch waits for more after its first")


class CanaryParamsBody(Body):
    """How the automatic decision judges a canary (``clipper.canary.CanaryParams``); an omitted one: the default."""

    alpha: Number | None = Field(None, gt=0.0, lt=0.5, description="chance of rolling back a canary as good (5%)")
    beta: Number | None = Field(None, gt=0.0, lt=0.5, description="chance of promoting one worse by margin (10%)")
    margin: Number | None = Field(None, gt=0.0, le=1.0, description="the loss-rate difference called worse (0.05)")
    # counts at most a billion, the guards' ratio at most a million: the registry stores numbers of 38 digits and
    # reads them back as doubles (a count of 10**40 came back changed; past 1e125 DynamoDB refuses it: a 503)
    min_feedback: StrictInt | None = Field(
        None, ge=1, le=10**9, description="labels each version needs before the test (50)"
    )
    max_feedback: StrictInt | None = Field(
        None, ge=1, le=10**9, description="canary labels after which the lean decides (5000)"
    )
    guard_alpha: Number | None = Field(None, gt=0.0, lt=0.5, description="level of the error and SLO guards")
    guard_ratio: Number | None = Field(
        None, gt=1.0, le=1e6, allow_inf_nan=False, description="rate ratio the guards detect"
    )
    guard_min_events: StrictInt | None = Field(
        None, ge=1, le=10**9, description="errors (or misses) before a guard speaks"
    )


class StartCanary(Body):
    model_name: str
    model_version: str = Field(description="a registered version, not the active one")
    share_percent: Number = Field(
        gt=0.0, lt=100.0, allow_inf_nan=False, description="the canary's share of the model's queries, in percent"
    )
    params: CanaryParamsBody | None = None


class CanaryRef(Body):
    model_name: str
    events: StrictInt = Field(10, ge=0, le=100, description="how many of the last canary events to answer")


_EXPECTED = {"bool_type": "true or false", "int_type": "an integer", "float_type": "a number"}


def error_message(errors: Sequence[Any]) -> str:
    """The first of a body's validation errors (pydantic's ``errors()``) as the admin API's cause: the field and
    what it expected."""
    first = errors[0]
    if first.get("type") == "json_invalid":  # its loc is the character offset: the field is the body
        detail = (first.get("ctx") or {}).get("error", "")
        return f"body: not valid JSON ({detail} at character {first['loc'][-1]})"
    field = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
    message = first["msg"].removeprefix("Value error, ")
    if first.get("type") == "int_parsing_size":  # pydantic's words for 1e30 speak of an "input string"
        message = f"Input should be a valid integer, got {first.get('input')!r}, far out of range"
    elif first.get("type") in _EXPECTED:  # a switch (StrictBool), a number or an integer (Strict): JSON's own
        got = first.get("input")
        shown = f" {json.dumps(got)}" if isinstance(got, str | int | float) and len(json.dumps(got)) <= 40 else ""
        kind = json_kind(got)
        if first["type"] == "float_type" and isinstance(got, int) and not isinstance(got, bool):
            kind, shown = "an integer out of a number's range", ""  # JSON's integer past a double's
        message = f"expected {_EXPECTED[first['type']]}, got {kind}{shown}"
    return f"{field}: {message}"


def refusal(model: type[Body], values: dict[str, Any]) -> str | None:
    """What the admin API would answer a body of ``values`` for ``model`` (its 400's cause), or None when it takes
    it: a client checks before it does what cannot be undone (an upload before starting a canary)."""
    try:
        model.model_validate(values)
    except ValidationError as e:
        return error_message(e.errors())
    return None
