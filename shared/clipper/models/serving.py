"""The serving resources of a model version: its request queue (with dead-letter queue), the batcher that
consumes it and the endpoint that answers, created from the per-model-version stack (infra/model-stack.yaml).

Each version gets its own resources, so a version switch is a registry write (every frontend follows within
its config refresh interval) and a query in flight finishes on the version whose queue accepted it.
``replicas`` is the number of serving instances: the SageMaker endpoint's instance count (each instance runs
the model server and a long-poll batcher), the Lambda batcher's maximum concurrency, or, in the local stack,
model-server + batcher process pairs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from clipper.core.domain import BatchingSettings
from clipper.errors import ClipperError, Conflict, NotFound

# infra/model-stack.yaml's ModelName: letters, digits and hyphens (not first or last), at most 30 characters.
_MAX_STACK_MODEL_NAME = 30
_PARAMETER = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")  # the parameter's AllowedPattern
_PLAIN_VERSION = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Serving:
    queue_url: str
    endpoint: str  # URL or sagemaker:<endpoint name>


@dataclass(frozen=True)
class ModelArtifact:
    """The model file a version serves, as the updater validated it: its ``s3://`` address, the S3 object version
    it read (empty in an unversioned bucket) and its sha256. The serving resources load that object version, and
    the endpoint refuses a file with another sha256 (a later PUT to the same key, which no one validated)."""

    uri: str
    version_id: str = ""
    sha256: str = ""


class StackServesAnotherFile(Conflict):
    """A version's serving stack exists and serves another file than the one asked for (``sha256``): another
    upload of the version made it (two uploads at once: the one that made it registers), or the stack of a deleted
    version is still there. Never served from a stack made for other bytes."""

    def __init__(self, message: str, sha256: str = "") -> None:
        super().__init__(message)
        self.sha256 = sha256


class ServerDidNotStart(ClipperError):
    """The version's model server exited or did not answer its health check in time (the local stack's own
    servers): nothing of the version is left running or stacked, and the upload is rejected with this reason (it
    was retried as a failure, its stack left behind, and every later upload of the version waited on that stack)."""


SHA256_TAG = "clipper:sha256"  # the file a version's stack serves, as a tag of the stack


# An uploaded model file's S3 metadata key: "false" registers it inactive, "true" activates it (get_upload_url's
# promote), over the model's auto_promote.
PROMOTE_METADATA = "clipper-promote"


class ServingStacks(Protocol):
    def create(
        self, model: str, version: str, artifact: ModelArtifact, replicas: int, batching: tuple[int, int] | None = None
    ) -> Serving:
        """Create (or find, when it exists already) the version's serving resources, serving exactly ``artifact``;
        return their addresses. ``batching``: its Lambda batcher's (BatchSize, MaximumBatchingWindowInSeconds),
        ``lambda_mapping`` of the model's settings (the template's defaults when None)."""
        ...

    def scale(self, model: str, version: str, replicas: int) -> None:
        """Set the number of serving instances of a version."""
        ...

    def busy(self, model: str, version: str) -> str | None:
        """What the version's serving resources are doing when they cannot take a change now (a stack update in
        progress: ``UPDATE_IN_PROGRESS``), else None; ``NotFound`` when the version has none of its own."""
        ...

    def set_batching(self, model: str, version: str, batch_size: int, window_s: int) -> bool:
        """Set a version's Lambda batcher's batch size and batching window; False when it has none."""
        ...

    def delete(self, model: str, version: str) -> None: ...


def lambda_mapping(settings: BatchingSettings) -> tuple[int, int]:
    """What a model's batching settings become on a version's Lambda batcher: the event source mapping's
    BatchSize and MaximumBatchingWindowInSeconds. The window is whole seconds (1 from a wait of a second, else 0),
    and SQS takes a BatchSize over 10 only with a window of at least 1 s."""
    window = 1 if settings.batch_wait_ms >= 1000 else 0
    return min(settings.largest_batch, 10_000 if window else 10), window


def check_idle(stacks: ServingStacks, model: str, versions: Iterable[str]) -> None:
    """``Conflict`` naming the first of ``versions`` whose serving stack is changing (an update takes minutes and
    CloudFormation queues none): checked before a change is recorded, so a 409 means nothing was changed."""
    for version in versions:
        try:
            status = stacks.busy(model, version)
        except NotFound:  # no stack of its own: nothing to change there
            continue
        if status:
            raise Conflict(
                f"the serving stack of {model}:{version} is {status}; nothing was changed, try again when that ends"
            )


def unserved_reason(model: str, version: str, active: str | None) -> str:
    """Why an uploaded version is refused where no serving stacks are made for uploads (ModelStacks off): nothing
    would load its file, and taking the active version's queue and endpoint would report it active while the
    active version's model answers."""
    what = f"{model}:{version} would have no serving resources of its own: this deployment creates none for uploads"
    if active:
        why = f"(ModelStacks is off), and sharing {model}:{active}'s queue and endpoint would leave {active} answering"
    else:
        why = "(ModelStacks is off) and sets no serving defaults for a new model"
    how = "serve the file yourself and register it with add_model, its queue_url and endpoint"
    return f"{what} {why}. To serve it, deploy with ModelStacks=on, or {how}"


def stack_model_name(model: str, version: str) -> str:
    """The model stack's ModelName for one version, unique per (model, version).

    The readable ``<model>-v<version>`` when the version is lowercase letters and digits only (no hyphen) and the
    whole fits the parameter's pattern and length: the last ``-v`` then splits it back into (model, version), so
    two such names never meet. (With hyphens in versions, ``a-v1``:``2`` and ``a``:``1-v2`` both read
    ``a-v1-v2``.) Any other version gets a shortened form ending in ``-<8 hex of sha256(model:version)>``: a hyphen
    after its last ``-v``, which a readable name never has, so the two forms never meet either. Lowercase only,
    since some of the names made from it (SageMaker's) compare without case."""
    name = f"{model}-v{version}"
    if _PLAIN_VERSION.fullmatch(version) and _PARAMETER.fullmatch(name) and len(name) <= _MAX_STACK_MODEL_NAME:
        return name
    digest = hashlib.sha256(f"{model}:{version}".encode()).hexdigest()[:8]
    tag = re.sub(r"[^a-z0-9]+", "-", f"{model}-v{version}".lower()).strip("-")
    head = tag[: _MAX_STACK_MODEL_NAME - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"
