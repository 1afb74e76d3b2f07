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
from dataclasses import dataclass
from typing import Protocol

# infra/model-stack.yaml's ModelName: letters, digits and single hyphens, at most 30 characters.
_MAX_STACK_MODEL_NAME = 30


@dataclass(frozen=True)
class Serving:
    queue_url: str
    endpoint: str  # URL or sagemaker:<endpoint name>


# An uploaded model file's S3 metadata key: "false" registers it inactive, "true" activates it (get_upload_url's
# promote), over the model's auto_promote.
PROMOTE_METADATA = "clipper-promote"


class ServingStacks(Protocol):
    def create(self, model: str, version: str, artifact: str, replicas: int) -> Serving:
        """Create (or find, when it exists already) the version's serving resources; return their addresses."""
        ...

    def scale(self, model: str, version: str, replicas: int) -> None:
        """Set the number of serving instances of a version."""
        ...

    def set_batching(self, model: str, version: str, batch_size: int, window_s: int) -> bool:
        """Set a version's Lambda batcher's batch size and batching window; False when it has none."""
        ...

    def delete(self, model: str, version: str) -> None: ...


def stack_model_name(model: str, version: str) -> str:
    """The model stack's ModelName for one version: ``<model>-v<version>`` when that fits the parameter's
    pattern, else a shortened form with a hash that keeps versions apart (``1.0`` and ``1_0``)."""
    tag = re.sub(r"-+", "-", re.sub(r"[^A-Za-z0-9]", "-", version)).strip("-")
    name = f"{model}-v{tag}"
    if tag == version and len(name) <= _MAX_STACK_MODEL_NAME:
        return name
    digest = hashlib.sha256(f"{model}:{version}".encode()).hexdigest()[:8]
    head = f"{model}-v{tag}"[: _MAX_STACK_MODEL_NAME - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"
