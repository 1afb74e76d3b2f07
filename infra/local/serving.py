"""The local stack's stand-ins for what AWS runs per model version, and its S3 -> model updater dispatch.

``LocalModelServing`` is the updater's ``ServingStacks`` locally: a version's stack (infra/model-stack.yaml)
is created in moto's CloudFormation by the same adapter the functions use on AWS (its queue and dead-letter
queue are real moto queues), and where AWS would start the SageMaker endpoint's instances, it starts
``replicas`` pairs of processes: the ONNX Runtime server over the version's own model file (downloaded from
the model bucket) and a long-poll batcher on the version's queue, beside it - what one endpoint instance's
container runs. ``reconcile`` follows the registry: a changed replica count (``set_num_replicas``, which also
updates the stack) starts or stops pairs; a deleted version's processes stop.

``UploadDispatcher`` is the local end of the model bucket's EventBridge rule (the one template.yaml declares for
the ModelUpdater function): moto cannot invoke a Lambda function without Docker, so the local stack adds an SQS
queue as a second target of that rule, and this thread hands each event, as EventBridge delivered it, to the
model updater's own handler code (``functions.model_updater.app.handle_event``). A failed event becomes visible
again and is retried, as Lambda retries an asynchronous invocation.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clipper.adapters.cloudformation_stacks import CloudFormationModelStacks
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.errors import ClipperError, NotFound
from clipper.models.serving import Serving

logger = logging.getLogger("clipper.local")

Spawn = Callable[[str, list[str]], subprocess.Popen[bytes]]
WaitReady = Callable[[str, subprocess.Popen[bytes], str], None]


@dataclass
class Replica:
    endpoint: subprocess.Popen[bytes]
    batcher: subprocess.Popen[bytes]
    url: str


@dataclass
class Served:
    queue_url: str
    model_path: Path
    replicas: list[Replica] = field(default_factory=list)
    registered: bool = False  # seen in the registry (created before the updater registers it)


class LocalModelServing:
    def __init__(
        self,
        stacks: CloudFormationModelStacks,
        s3: Any,
        registry: DynamoDBRegistry,
        artifacts_dir: Path,
        spawn: Spawn,
        wait_ready: WaitReady,
        free_port: Callable[[], int],
        slo_ms: float,
    ) -> None:
        self._stacks, self._s3, self._registry = stacks, s3, registry
        self._dir = artifacts_dir
        self._spawn, self._wait_ready, self._free_port = spawn, wait_ready, free_port
        self._slo_ms = slo_ms
        self._served: dict[tuple[str, str], Served] = {}
        self._lock = threading.RLock()

    # -- ServingStacks ---------------------------------------------------------------------------------
    def create(self, model: str, version: str, artifact: str, replicas: int) -> Serving:
        with self._lock:
            serving = self._stacks.create(model, version, artifact, replicas)
            served = self._served.get((model, version))
            if served is None:
                served = Served(serving.queue_url, self._download(model, version, artifact))
                self._served[(model, version)] = served
            self._scale_processes(model, version, served, replicas)
            return Serving(serving.queue_url, served.replicas[0].url)

    def scale(self, model: str, version: str, replicas: int) -> None:
        with self._lock:
            self._stacks.scale(model, version, replicas)
            served = self._served.get((model, version))
            if served is not None:
                self._scale_processes(model, version, served, replicas)

    def delete(self, model: str, version: str) -> None:
        with self._lock:
            self._stacks.delete(model, version)
            self._stop(model, version)

    # -- following the registry ------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Apply what the management API changed since: replica counts, deleted versions."""
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
                        if served.registered:  # deleted since (a rejected one's processes stay until exit)
                            self._stop(model, version)
                        continue
                    served.registered = True
                    if len(served.replicas) != record.replicas:
                        self._scale_processes(model, version, served, record.replicas)

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
    def _download(self, model: str, version: str, artifact: str) -> Path:
        bucket, _, key = artifact.removeprefix("s3://").partition("/")
        path = self._dir / model / version / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self._s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        return path

    def _scale_processes(self, model: str, version: str, served: Served, replicas: int) -> None:
        while len(served.replicas) < replicas:
            served.replicas.append(self._start_replica(model, version, served, len(served.replicas)))
        while len(served.replicas) > max(replicas, 1):
            _terminate(served.replicas.pop())
        logger.info("%s:%s runs %d replica(s)", model, version, len(served.replicas))

    def _start_replica(self, model: str, version: str, served: Served, index: int) -> Replica:
        port = self._free_port()
        url = f"http://127.0.0.1:{port}"
        name = f"{model}-{version}-{index}"
        server = [sys.executable, "-m", "clipper_endpoint", "--model-path", str(served.model_path)]
        endpoint = self._spawn(f"endpoint-{name}", [*server, "--host", "127.0.0.1", "--port", str(port)])
        self._wait_ready(url + "/ping", endpoint, f"endpoint server for {model}:{version}")
        batcher = self._spawn(
            f"batcher-{name}",
            [
                sys.executable,
                "-m",
                "clipper.batching.longpoll",
                "--queue-url",
                served.queue_url,
                "--endpoint-url",
                url,
                "--slo-ms",
                str(self._slo_ms / 2),
                "--batch-wait-ms",
                "1",
                "--model",
                model,
                "--version",
                version,
            ],
        )
        return Replica(endpoint, batcher, url)

    def _stop(self, model: str, version: str) -> None:
        served = self._served.pop((model, version), None)
        for replica in served.replicas if served else []:
            _terminate(replica)
        if served:
            logger.info("%s:%s stopped", model, version)


def _terminate(replica: Replica) -> None:
    for proc in (replica.batcher, replica.endpoint):
        if proc.poll() is None:
            proc.terminate()
    for proc in (replica.batcher, replica.endpoint):
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class UploadDispatcher(threading.Thread):
    """Long-polls the queue the model bucket's EventBridge rule delivers to and runs the updater's handler."""

    def __init__(self, sqs: Any, queue_url: str, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        super().__init__(name="upload-dispatcher", daemon=True)
        self._sqs, self._queue_url, self._handle = sqs, queue_url, handle
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                got = self._sqs.receive_message(QueueUrl=self._queue_url, MaxNumberOfMessages=1, WaitTimeSeconds=1)
            except Exception as e:  # the moto server going away at shutdown, or a transient error
                logger.warning("upload events not received: %s", e)
                self.halt.wait(1.0)
                continue
            for message in got.get("Messages", []):
                self.dispatch(message)

    def dispatch(self, message: dict[str, Any]) -> None:
        event = json.loads(message["Body"])
        started = time.monotonic()
        try:
            result = self._handle(event)
        except Exception as e:  # retried (the handler raises what a retry can fix): visible again in 2 s
            logger.warning("model upload event failed, retried: %s", e)
            self._sqs.change_message_visibility(
                QueueUrl=self._queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=2
            )
            return
        self._sqs.delete_message(QueueUrl=self._queue_url, ReceiptHandle=message["ReceiptHandle"])
        for outcome in result.get("outcomes", []):
            logger.info(
                "upload %s: %s %s (%.1f s)",
                outcome.get("key"),
                outcome.get("status"),
                "; ".join(outcome.get("reasons", [])),
                time.monotonic() - started,
            )


def connect_uploads(cfn: Any, s3: Any, sqs: Any, events: Any, stack: str, bucket: str) -> str:
    """Make the model bucket emit EventBridge events (moto's CloudFormation drops the template's
    EventBridgeConfiguration) and add a local SQS queue as a target of template.yaml's ModelUpload rule;
    return the queue's URL."""
    from infra.local.cfn import stack_resources

    rule = stack_resources(cfn, stack)["ModelUpdaterFunctionModelUpload"]
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={"EventBridgeConfiguration": {}})
    queue_url: str = sqs.create_queue(QueueName=f"{stack}-local-model-uploads")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    # moto delivers to a rule's targets in order and stops at the first it cannot serve (a Lambda function),
    # so the local queue goes first and the template's own target (the ModelUpdater function) after it.
    declared = events.list_targets_by_rule(Rule=rule)["Targets"]
    if declared:
        events.remove_targets(Rule=rule, Ids=[t["Id"] for t in declared])
    events.put_targets(Rule=rule, Targets=[{"Id": "local-upload-dispatcher", "Arn": arn}, *declared])
    return queue_url


def start_uploads(
    stack: str,
    outputs: dict[str, str],
    artifacts_dir: Path,
    spawn: Spawn,
    wait_ready: WaitReady,
    free_port: Callable[[], int],
    slo_ms: float,
) -> tuple[LocalModelServing, UploadDispatcher]:
    """Connect the bucket's rule to a local queue and start the dispatcher over the updater's handler, with
    ``LocalModelServing`` as the updater's ``ServingStacks``. The handler module reads its settings from this
    process's environment (the caller sets it)."""
    import boto3

    from functions.model_updater import app as updater_app
    from infra.local.cfn import MODEL_STACK_TEMPLATE, REPO_ROOT

    cfn, s3, sqs = boto3.client("cloudformation"), boto3.client("s3"), boto3.client("sqs")
    bucket = outputs["ModelBucketName"]
    queue_url = connect_uploads(cfn, s3, sqs, boto3.client("events"), stack, bucket)
    stacks = CloudFormationModelStacks(cfn, stack, (REPO_ROOT / MODEL_STACK_TEMPLATE).read_text(), poll_s=0.05)
    serving = LocalModelServing(
        stacks,
        s3,
        DynamoDBRegistry(boto3.client("dynamodb"), outputs["RegistryTableName"]),
        artifacts_dir,
        spawn,
        wait_ready,
        free_port,
        slo_ms,
    )
    updater = updater_app.build(updater_app.settings, boto3.client("dynamodb"), s3, stacks=serving)
    dispatcher = UploadDispatcher(sqs, queue_url, lambda event: updater_app.handle_event(updater, event, bucket))
    dispatcher.start()
    return serving, dispatcher
