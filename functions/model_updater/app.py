"""Model updater Lambda: an upload to ``models/<name>/<version>/model.onnx`` in the model bucket is validated,
registered, and promoted when the model is configured for it (``clipper.models.updater``).

Events: S3 event notifications (``ObjectCreated:*`` records) and EventBridge ``Object Created`` events from
S3, with the same outcome; objects in another bucket than ``CLIPPER_MODEL_BUCKET`` are ignored. Each object
is handled on its own: one that fails does not stop the others. Transient failures (``Unavailable``:
throttling, an unreachable table or bucket) and lost races (``Conflict``) are raised once every object has
been tried, so Lambda retries the event; the objects already handled are not handled twice, since a
redelivered upload changes nothing. Any other failure is logged with its traceback and not retried.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from urllib.parse import unquote_plus

from aws_lambda_powertools import Logger
from pydantic import AliasChoices, Field, model_validator

from clipper.adapters.clock import SystemClock
from clipper.adapters.cloudformation_stacks import build_model_stacks
from clipper.errors import ClipperError, Conflict, Unavailable
from clipper.models.isolated import default_load_limit
from clipper.models.serving import ServingStacks
from clipper.models.updater import ModelUpdater, ServingDefaults, build_model_updater
from clipper.settings import ModelStackSettings
from clipper.wiring import aws_client

VALIDATION_ROOM_S = 60.0  # of the function's timeout, beside validation and the stack's wait: S3, DynamoDB
LOAD_ROOM_MIN_S = 60.0  # of the function's timeout, at least, for the validation's start and the model's loading


class ModelUpdaterSettings(ModelStackSettings):
    # Serving resources of a model's first version ("{model}" is replaced); a later version copies the
    # active version's. Empty: a model's first version must be added with add_model, not by an upload.
    default_queue_url: str = Field(
        "", description="e.g. https://sqs.<region>.amazonaws.com/<acct>/<stack>-model-{model}"
    )
    default_endpoint: str = Field("", description="e.g. sagemaker:<stack>-{model}")
    # Larger files are rejected unread; the function's memory must hold the file and its ORT session.
    max_model_bytes: int = Field(512 * 1024**2, ge=1)
    # A file's validation runs in a child process (clipper.models.isolated); its sample run is stopped at this
    # limit, counted from the moment the model is loaded, and a model stopped there is rejected, the reason naming
    # the limit. Starting the child and loading the model have a backstop of their own
    # (validation_load_timeout_s). Both within the function's timeout (template.yaml passes it) with the stack's
    # wait and VALIDATION_ROOM_S to read and record around them.
    validation_timeout_s: float = Field(60.0, gt=0)
    function_timeout_s: float | None = Field(None, gt=0)
    # Lambda's own variable: named in the reason of a rejection whose validation process was killed for its memory
    function_memory_mb: int | None = Field(None, validation_alias=AliasChoices("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"))
    # With a service stack named (ModelStackSettings), each version gets its own serving stack
    # (infra/model-stack.yaml) before it is registered, instead of the defaults above or the active version's.

    @model_validator(mode="after")
    def _validation_fits_the_function(self) -> ModelUpdaterSettings:
        if self.function_timeout_s is None:
            return self
        stack_wait = self._stack_wait_s
        room = self.function_timeout_s - stack_wait - VALIDATION_ROOM_S - LOAD_ROOM_MIN_S
        if self.validation_timeout_s > room:
            raise ValueError(
                f"CLIPPER_VALIDATION_TIMEOUT_S ({self.validation_timeout_s:g} s) must leave the function's timeout "
                f"(CLIPPER_FUNCTION_TIMEOUT_S, {self.function_timeout_s:g} s) room for the stack's creation "
                f"(CLIPPER_MODEL_STACK_WAIT_S, {stack_wait:g} s), {LOAD_ROOM_MIN_S:g} s to start the validation and "
                f"load the model, and {VALIDATION_ROOM_S:g} s to read the file and record the outcome: "
                f"at most {max(room, 0):g} s"
            )
        return self

    @property
    def validation_load_timeout_s(self) -> float:
        """The backstop for starting the validation's process and loading the model (the sample run's limit runs
        from the load's end): with a function timeout, all it leaves beside the stack's wait, VALIDATION_ROOM_S and
        the sample run's limit (at least LOAD_ROOM_MIN_S); without one (locally), ``default_load_limit``."""
        if self.function_timeout_s is None:
            return default_load_limit(self.validation_timeout_s)
        return self.function_timeout_s - self._stack_wait_s - VALIDATION_ROOM_S - self.validation_timeout_s

    @property
    def _stack_wait_s(self) -> float:
        """What an upload waits for its version's serving stack within the function: none without stacks."""
        return self.model_stack_wait_s if self.service_stack_name else 0.0


logger = Logger(service="clipper-model-updater")
settings = ModelUpdaterSettings()  # type: ignore[call-arg]


def build(
    config: ModelUpdaterSettings, dynamodb: Any, s3: Any, cfn: Any = None, stacks: ServingStacks | None = None
) -> ModelUpdater:
    """The updater over these clients (the handler's graph; tests pass moto's). ``stacks`` replaces the
    CloudFormation stacks the settings name (the local stack passes its process-starting one)."""
    defaults = ServingDefaults(config.default_queue_url, config.default_endpoint)
    if stacks is None and cfn is not None:
        stacks = build_model_stacks(cfn, config)
    return build_model_updater(
        dynamodb,
        s3,
        config.registry_table,
        SystemClock(),
        defaults,
        config.max_model_bytes,
        stacks,
        config.validation_timeout_s,
        config.validation_load_timeout_s,
        config.function_memory_mb,
    )


updater = build(
    settings,
    aws_client("dynamodb"),
    aws_client("s3", read_timeout=60),
    aws_client("cloudformation") if settings.service_stack_name else None,
)


def uploads(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The created objects an event names: ``bucket``, ``key``, ``size``, ``etag``, ``version_id``."""
    if event.get("source") == "aws.s3" and event.get("detail-type") == "Object Created":
        detail = event.get("detail", {})
        obj = detail.get("object", {})
        return [
            {
                "bucket": detail.get("bucket", {}).get("name", ""),
                "key": unquote_plus(obj.get("key", "")),
                "size": int(obj.get("size", 0)),
                "etag": obj.get("etag") or obj.get("eTag", ""),  # moto's EventBridge events spell it eTag
                "version_id": _pinning(obj.get("version-id")),
            }
        ]
    found = []
    for record in event.get("Records", []):
        if record.get("eventSource") != "aws:s3" or not record.get("eventName", "").startswith("ObjectCreated:"):
            continue
        s3 = record.get("s3", {})
        obj = s3.get("object", {})
        found.append(
            {
                "bucket": s3.get("bucket", {}).get("name", ""),
                "key": unquote_plus(obj.get("key", "")),  # S3 notifications URL-encode keys
                "size": int(obj.get("size", 0)),
                "etag": obj.get("eTag", ""),
                "version_id": _pinning(obj.get("versionId")),
            }
        )
    return found


def _pinning(version_id: str | None) -> str | None:
    """The S3 version id that pins the uploaded object, or None. "null" is the version id of an object in an
    unversioned bucket: every upload of the key has it, so it pins nothing (the ETag does)."""
    return None if version_id in (None, "", "null") else version_id


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return handle_event(updater, event, settings.model_bucket)


def handle_event(updater: ModelUpdater, event: dict[str, Any], bucket: str) -> dict[str, Any]:
    """The handler's work with a given updater (the local stack's dispatcher calls it with its own)."""
    outcomes: list[dict[str, Any]] = []
    retry: list[ClipperError] = []
    for obj in uploads(event):
        if bucket and obj["bucket"] != bucket:
            logger.warning("object outside the model bucket ignored", bucket=obj["bucket"], key=obj["key"])
            outcomes.append({"status": "ignored", "key": obj["key"], "reasons": [f"not in {bucket}"]})
            continue
        try:
            outcome = updater.handle_object(**obj)
        except (Unavailable, Conflict) as e:
            logger.warning("model upload deferred", bucket=obj["bucket"], key=obj["key"], error=str(e))
            outcomes.append({"status": "retry", "key": obj["key"], "reasons": [str(e)]})
            retry.append(e)
            continue
        except Exception as e:  # a defect: a retry would fail the same way; the traceback is logged
            logger.exception("model upload failed", bucket=obj["bucket"], key=obj["key"])
            outcomes.append({"status": "failed", "key": obj["key"], "reasons": [f"{type(e).__name__}: {e}"]})
            continue
        logger.info(
            "model upload handled",
            status=outcome.status,
            bucket=obj["bucket"],
            key=outcome.key,
            model=outcome.model,
            version=outcome.version,
            promoted=outcome.promoted,
            reasons=list(outcome.reasons),
        )
        outcomes.append(asdict(outcome) | {"reasons": list(outcome.reasons)})
    if retry:
        raise retry[0]
    return {"outcomes": outcomes}
