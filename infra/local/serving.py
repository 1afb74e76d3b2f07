"""The local stack's stand-ins for what AWS runs per model version, and its S3 -> model updater dispatch.

``LocalModelServing`` is the updater's ``ServingStacks`` locally: a version's stack (infra/model-stack.yaml) is
created in moto's CloudFormation by the same adapter the functions use on AWS (its queue and dead-letter queue are
real moto queues), and where AWS would start the SageMaker endpoint's instances, it starts ``replicas`` pairs of
processes: the ONNX Runtime server over the version's own model file (the object version the updater validated,
downloaded from the model bucket; the server checks its sha256) and a long-poll batcher on the version's queue,
beside it - what one endpoint instance's container runs. ``reconcile`` follows the registry: a changed replica count
(``set_num_replicas``, which also updates the stack) starts or stops pairs; a deleted version's processes stop. The
processes are the local stack's supervised children (``infra/local/supervisor.py``): one that dies is started again
on its port. After a restart of the stack, ``restore`` serves every uploaded version of the restored registry again;
after a restart of moto, ``recreate_stacks`` creates their stacks again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import ClientError

from clipper.adapters.cloudformation_stacks import CloudFormationModelStacks
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.errors import ClipperError, NotFound, Unavailable
from clipper.models.serving import ModelArtifact, ServerDidNotStart, Serving
from clipper.models.updater import validated_key
from infra.local.supervisor import Child, Stage

logger = logging.getLogger("clipper.local")

# The long-poll batcher's entry point (``python -m``), the same for the demo models and the uploaded versions.
BATCHER_MODULE = "clipper.entrypoints.batcher"


class ProcessHost(Protocol):
    """What the local stack lends LocalModelServing: supervised processes and their ports."""

    def spawn(self, name: str, cmd: list[str], stage: Stage) -> Child: ...

    def stop_children(self, names: list[str]) -> None: ...

    def port(self, name: str) -> int: ...

    def wait_ready(self, url: str, child: Child, what: str) -> None: ...

    def is_stopping(self) -> bool: ...


def batcher_command(queue_url: str, endpoint_url: str, slo_ms: float, model: str, version: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        BATCHER_MODULE,
        "--queue-url",
        queue_url,
        "--endpoint-url",
        endpoint_url,
        "--slo-ms",
        str(slo_ms / 2),
        "--batch-wait-ms",
        "1",
        "--model",
        model,
        "--version",
        version,
    ]


def endpoint_command(model_path: Path | str, port: int, sha256: str = "") -> list[str]:
    server = [sys.executable, "-m", "clipper_endpoint", "--model-path", str(model_path)]
    return [*server, "--host", "127.0.0.1", "--port", str(port), *(["--sha256", sha256] if sha256 else [])]


@dataclass
class Replica:
    endpoint: str  # process names
    batcher: str
    url: str


@dataclass
class Served:
    queue_url: str
    model_path: Path
    artifact: ModelArtifact
    replicas: list[Replica] = field(default_factory=list)
    registered: bool = False  # seen in the registry (created before the updater registers it)
    gone_since: float | None = None  # when reconcile first found it deleted (its processes stop a grace later)
    adopted: bool = False  # started by the stack itself (a demo model): its stack is deployed with the service's


# How long a deleted version's processes still answer: a frontend's registry copy may route a query to it for up to
# its TTL plus its staleness bound (2 + 2 s) after a switch away from it and its delete.
STOP_GRACE_S = 5.0


class LocalModelServing:
    def __init__(
        self,
        stacks: CloudFormationModelStacks,
        s3: Any,
        registry: DynamoDBRegistry,
        artifacts_dir: Path,
        host: ProcessHost,
        slo_ms: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._stacks, self._s3, self._registry = stacks, s3, registry
        self._dir = artifacts_dir
        self._host = host
        self._slo_ms = slo_ms
        self._served: dict[tuple[str, str], Served] = {}
        self._lock = threading.RLock()

    # -- ServingStacks ---------------------------------------------------------------------------------
    def create(
        self, model: str, version: str, artifact: ModelArtifact, replicas: int, batching: tuple[int, int] | None = None
    ) -> Serving:
        """The model updater's: a new version's stack and processes. A server that does not start (it exits, or
        does not answer in time) leaves nothing of the version and raises ``ServerDidNotStart`` (the upload is
        rejected with why), unless the stack is stopping (then the upload is handled again after the restart)."""
        return self._create(model, version, artifact, replicas, batching, reject=True)

    def _create(
        self,
        model: str,
        version: str,
        artifact: ModelArtifact,
        replicas: int,
        batching: tuple[int, int] | None = None,
        reject: bool = False,
    ) -> Serving:
        with self._lock:
            serving = self._stacks.create(model, version, artifact, replicas, batching)
            served = self._served.get((model, version))
            if served is not None and not served.adopted and served.artifact.sha256 != artifact.sha256:
                # a version deleted and uploaded again with another file while its processes' grace ran: they
                # serve the old file, and its queue may be another stack's now
                self._stop(model, version)
                served = None
            if served is None:
                served = Served(serving.queue_url, self._download(model, version, artifact), artifact)
                self._served[(model, version)] = served
                try:
                    self._scale_processes(model, version, served, replicas)
                except (RuntimeError, TimeoutError) as e:
                    if not reject or self._host.is_stopping():
                        raise  # a restored version (reconcile starts it again), or the stack stopping: not its fault
                    self._stop(model, version)  # nothing of it stays: the upload is rejected with why
                    with contextlib.suppress(ClipperError):
                        self._stacks.delete(model, version)
                    raise ServerDidNotStart(f"{model}:{version}'s model server did not start: {e}") from e
            else:
                self._scale_processes(model, version, served, replicas)
            return Serving(serving.queue_url, served.replicas[0].url)

    def busy(self, model: str, version: str) -> str | None:
        return self._stacks.busy(model, version)

    def scale(self, model: str, version: str, replicas: int) -> None:
        with self._lock:
            self._stacks.scale(model, version, replicas)
            served = self._served.get((model, version))
            if served is not None:
                self._scale_processes(model, version, served, replicas)

    def set_batching(self, model: str, version: str, batch_size: int, window_s: int) -> bool:
        # the local stack runs long-poll batchers, which read the model's settings from the registry themselves
        return self._stacks.set_batching(model, version, batch_size, window_s)

    def delete(self, model: str, version: str) -> None:
        with self._lock:
            self._stacks.delete(model, version)
            self._stop(model, version)

    def adopt(self, model: str, version: str, queue_url: str, model_path: Path, replica: Replica) -> None:
        """A version whose processes the stack started itself (a demo model, registered by the stack): followed as
        an uploaded one is (stopped a grace after its delete, its replica count the registry's); its stack is
        deployed with the service's, so ``recreate_stacks`` leaves it to that."""
        with self._lock:
            self._served[(model, version)] = Served(
                queue_url, model_path, ModelArtifact("", "", ""), [replica], registered=True, adopted=True
            )

    # -- following the registry ------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Apply what the management API changed since: replica counts, deleted versions. Skipped while an upload's
        or a scale's processes are starting (their health checks may take a minute): the caller's thread also
        copies moto's state out, which must not wait that long (the next round, 2 s later, applies it)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._reconcile()
        finally:
            self._lock.release()

    def _reconcile(self) -> None:
        with self._lock:
            for model in sorted({m for m, _ in self._served}):
                try:
                    record = self._registry.model_record(model)
                except NotFound:
                    record = None
                except ClipperError as e:
                    logger.warning("registry not read for %s: %s", model, e)
                    continue
                for (m, version), served in list(self._served.items()):
                    if m != model:
                        continue
                    if record is None or version not in record.versions:
                        # deleted since (a rejected one's processes stay until exit), unless a version that stays
                        # is served through its queue (added without resources: the admin keeps the stack too)
                        sharing = record is not None and any(
                            v.queue_url == served.queue_url for v in record.versions.values()
                        )
                        if served.registered and not sharing:
                            now = self._clock()
                            if served.gone_since is None:
                                served.gone_since = now
                            if now - served.gone_since >= STOP_GRACE_S:  # the frontends route no query to it
                                self._stop(model, version)
                        continue
                    served.registered, served.gone_since = True, None
                    if len(served.replicas) != record.replicas:
                        self._scale_processes(model, version, served, record.replicas)

    def restore(self) -> list[str]:
        """Serve every version of the registry that came from an upload (its stack in moto, its processes), as
        after a restart of the stack; returns them as ``model:version``. A version added with the resources of
        another (``add_model``) has no stack of its own and needs nothing."""
        restored = []
        for model in self._registry.model_names():
            record = self._registry.model_record(model)
            for version in record.versions:
                recorded = record.artifacts.get(version, {})
                if not recorded.get("artifact"):
                    continue
                uploaded = ModelArtifact(
                    str(recorded["artifact"]),
                    str(recorded.get("artifact_version_id", "")),
                    str(recorded.get("sha256", "")),
                )
                bucket = uploaded.uri.removeprefix("s3://").partition("/")[0]
                # the copy the updater served it from (nothing replaces it), else the upload (registered before)
                kept = ModelArtifact(
                    f"s3://{bucket}/{validated_key(model, version, uploaded.sha256)}", "", uploaded.sha256
                )
                try:
                    try:
                        self._create(model, version, kept if uploaded.sha256 else uploaded, record.replicas)
                    except ClientError:
                        self._create(model, version, uploaded, record.replicas)
                except Exception as e:  # one version that cannot be served does not stop the others
                    logger.warning("%s:%s not served again: %s", model, version, e)
                    continue
                with self._lock:
                    self._served[(model, version)].registered = True
                restored.append(f"{model}:{version}")
        return restored

    def recreate_stacks(self) -> None:
        """Create the served versions' stacks again in a moto that restarted empty (the processes still run)."""
        with self._lock:
            for (model, version), served in self._served.items():
                if served.adopted:
                    continue
                try:
                    self._stacks.create(model, version, served.artifact, max(1, len(served.replicas)))
                except ClipperError as e:
                    logger.warning("stack of %s:%s not created again: %s", model, version, e)

    def replicas(self, model: str, version: str) -> list[str]:
        """The endpoint URLs of a version's running replicas."""
        with self._lock:
            served = self._served.get((model, version))
            return [r.url for r in served.replicas] if served else []

    def stop_all(self) -> None:
        with self._lock:
            for model, version in list(self._served):
                self._stop(model, version)

    # -- processes -------------------------------------------------------------------------------------
    def _download(self, model: str, version: str, artifact: ModelArtifact) -> Path:
        """The object version the updater validated (not whatever is at the key now: the upload URL may have been
        used again since). The local stack's saved state puts objects back into a fresh moto under new version ids:
        when the recorded one is gone, the object at the key is served if its sha256 is the validated one."""
        path = self._dir / model / version / "model.onnx"
        if artifact.sha256 and path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == artifact.sha256:
            return path  # downloaded before (the state folder keeps it): the key may hold another PUT's bytes now
        bucket, _, key = artifact.uri.removeprefix("s3://").partition("/")
        try:
            pin = {"VersionId": artifact.version_id} if artifact.version_id else {}
            data: bytes = self._s3.get_object(Bucket=bucket, Key=key, **pin)["Body"].read()
        except ClientError:
            if not artifact.version_id or not artifact.sha256:
                raise
            data = self._s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        if artifact.sha256 and hashlib.sha256(data).hexdigest() != artifact.sha256:
            raise Unavailable(f"{artifact.uri} is no longer the file validated for {model}:{version}: not served")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def _scale_processes(self, model: str, version: str, served: Served, replicas: int) -> None:
        while len(served.replicas) < replicas:
            served.replicas.append(self._start_replica(model, version, served, len(served.replicas)))
        while len(served.replicas) > max(replicas, 1):
            replica = served.replicas.pop()
            self._stop_replicas([replica])
        logger.info("%s:%s runs %d replica(s)", model, version, len(served.replicas))

    def _start_replica(self, model: str, version: str, served: Served, index: int) -> Replica:
        name = f"{model}-{version}-{index}"
        port = self._host.port(f"endpoint-{name}")
        url = f"http://127.0.0.1:{port}"
        command = endpoint_command(served.model_path, port, served.artifact.sha256)
        endpoint = self._host.spawn(f"endpoint-{name}", command, Stage.SERVERS)
        try:
            self._host.wait_ready(url + "/ping", endpoint, f"endpoint server for {model}:{version}")
        except (RuntimeError, TimeoutError):
            self._host.stop_children([endpoint.name])
            raise
        batcher_cmd = batcher_command(served.queue_url, url, self._slo_ms, model, version)
        batcher = self._host.spawn(f"batcher-{name}", batcher_cmd, Stage.BATCHERS)
        return Replica(endpoint.name, batcher.name, url)

    def _stop(self, model: str, version: str) -> None:
        served = self._served.pop((model, version), None)
        if served:
            self._stop_replicas(served.replicas)
            logger.info("%s:%s stopped", model, version)

    def _stop_replicas(self, replicas: list[Replica]) -> None:
        """The batchers first, then their model servers: a batcher finishes the batch it holds (SIGTERM), which
        its server answers; stopped together, a scale-down's last batches met a server already gone."""
        self._host.stop_children([r.batcher for r in replicas])
        self._host.stop_children([r.endpoint for r in replicas])


def local_serving(
    stack: str, outputs: dict[str, str], artifacts_dir: Path, host: ProcessHost, slo_ms: float
) -> LocalModelServing:
    import boto3

    from infra.local.cfn import MODEL_STACK_TEMPLATE, REPO_ROOT

    stacks = CloudFormationModelStacks(
        boto3.client("cloudformation"), stack, (REPO_ROOT / MODEL_STACK_TEMPLATE).read_text(), poll_s=0.05
    )
    registry = DynamoDBRegistry(boto3.client("dynamodb"), outputs["RegistryTableName"])
    return LocalModelServing(stacks, boto3.client("s3"), registry, artifacts_dir, host, slo_ms)
