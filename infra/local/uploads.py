"""The local end of the model bucket's EventBridge rule (the one template.yaml declares for the ModelUpdater
function): moto cannot invoke a Lambda function without Docker, so the local stack adds an SQS queue as a target
of that rule, and ``UploadDispatcher`` (a thread) hands each event, as EventBridge delivered it, to the model
updater's own handler code (``functions.model_updater.app.handle_event``), with ``LocalModelServing`` as its
``ServingStacks``. A failed event becomes visible again and is retried, as Lambda retries an asynchronous
invocation.

The dispatcher long-polls (20 s, SQS's longest: on an idle stack three receives a minute, not sixty) and hands each
event to its upload's lane: the events of one ``models/<name>/<version>/model.onnx`` are handled one after the
other, in the order received, on a thread of that lane's own (``upload-lane``), while other versions' go on beside
them, up to ``workers`` handled at once. So a model whose validation takes its whole time limit
(``CLIPPER_VALIDATION_TIMEOUT_S``) holds only the uploads of its own version, as on AWS, where each upload is its
own invocation of the function. It receives only while there is room: while it has fewer lanes (versions with events
waiting or in hand) than ``workers``, and no more events than that room at once (a batch of 10 received whatever the
workers held would wait in memory while its visibility timeout ran, and could come back and be handled twice; a
version's own backlog counts once, so it does not keep other versions' uploads from being received). An event stays
invisible in the queue while it is handled (``VISIBILITY_S``, the function's timeout), so a long one is not received
again meanwhile. A stop waits for the events being handled, not for a receive that is waiting for one, and starts
none of those still waiting in a lane (their uploads are found again at the next start, below).

The queue's events live in moto's memory, which the state folder does not keep: an upload made just before a stop
(its object copied, its event not yet handled) would come back without its event and never be registered. So at
each start, after the bucket is restored, ``lost_uploads`` finds the model files that no upload was handled for
(the version neither registered nor rejected for those bytes) and the dispatcher's ``replay_lost`` queues for each
the event its upload sent; the updater takes one it has seen as a duplicate.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from infra.local.serving import LocalModelServing
from infra.local.supervisor import lower_thread_priority

logger = logging.getLogger("clipper.local")

VISIBILITY_S = 900  # an event in hand stays the dispatcher's this long: the ModelUpdater function's Timeout


class UploadDispatcher(threading.Thread):
    """Long-polls the queue the model bucket's EventBridge rule delivers to and runs the updater's handler."""

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        handle: Callable[[dict[str, Any]], dict[str, Any]],
        wait_s: int = 20,
        nice: int = 0,
        find_lost: Callable[[], list[dict[str, Any]]] | None = None,
        bucket: str = "",
        workers: int = 4,
    ) -> None:
        """``wait_s``: each receive's long poll; ``nice``: added to this thread's CPU niceness when it starts (no
        query waits for it; its lanes' threads, and the validation processes they start, inherit it);
        ``find_lost``: the uploads of ``bucket`` whose events were lost (``lost_uploads``); ``workers``: events
        handled at once, of as many versions."""
        super().__init__(name="upload-dispatcher", daemon=True)
        self._sqs, self._queue_url, self._handle = sqs, queue_url, handle
        self._wait_s, self._nice = wait_s, nice
        self._find_lost, self._bucket = find_lost, bucket
        self.halt = threading.Event()
        self._lanes: dict[str, deque[dict[str, Any]]] = {}  # by upload key: its events not handled yet
        self._changed = threading.Condition()  # guards _lanes and _in_hand
        self._in_hand = 0  # events being handled now
        self._workers = workers
        self._slots = threading.BoundedSemaphore(workers)
        self._failing = False

    def run(self) -> None:
        lower_thread_priority(self._nice, "upload-dispatch")
        while not self.halt.is_set():
            room = self._room()
            if not room:
                continue  # halted, or still full after a second: looks again
            try:
                got = self._sqs.receive_message(
                    QueueUrl=self._queue_url, MaxNumberOfMessages=min(10, room), WaitTimeSeconds=self._wait_s
                )
            except Exception as e:  # moto restarting, or a transient error: said once, not every second
                if not self._failing and not self.halt.is_set():
                    logger.warning("upload events not received (retrying every second): %s", e)
                self._failing = True
                self.halt.wait(1.0)
                continue
            if self._failing and not self.halt.is_set():
                logger.info("upload events received again")
            self._failing = False
            for message in got.get("Messages", []):
                self._queue(message)

    def _room(self) -> int:
        """How many events it may receive now: ``workers`` less its lanes (a version's lane counts once, however many
        of its events wait: a backlog of one version's uploads must not keep other versions' from being received).
        Waits (up to a second, or until halted) while there is none."""
        with self._changed:
            self._changed.wait_for(lambda: self._held() < self._workers or self.halt.is_set(), timeout=1.0)
            return 0 if self.halt.is_set() else max(0, self._workers - self._held())

    def _held(self) -> int:
        """Its lanes, each with events waiting or in hand (under ``_changed``)."""
        return len(self._lanes)

    def _queue(self, message: dict[str, Any]) -> None:
        """Into its upload's lane, behind that upload's earlier events; a lane with none starts its thread."""
        lane = lane_of(message)
        with self._changed:
            waiting = self._lanes.get(lane)
            if waiting is not None:  # its thread is on it: it takes this one after the others
                waiting.append(message)
                return
            self._lanes[lane] = deque([message])
        threading.Thread(target=self._drain, args=(lane,), name="upload-lane", daemon=True).start()

    def _drain(self, lane: str) -> None:
        """A lane's thread: handle its events in order until none is left (or the dispatcher halts)."""
        lower_thread_priority(0, "upload-lane")  # the dispatcher's niceness is inherited; the name is its own
        while True:
            with self._slots:  # at most ``workers`` events handled at once
                with self._changed:
                    waiting = self._lanes[lane]
                    if not waiting or self.halt.is_set():  # halted: none starts (found again at the next start)
                        del self._lanes[lane]
                        self._changed.notify_all()  # room for another version's events
                        return
                    message = waiting.popleft()
                    self._in_hand += 1
                try:
                    self.dispatch(message)
                except Exception as e:  # the event's settling failed (moto restarting between the receive and the
                    # delete): it comes back after its visibility timeout, and the updater takes a repeat as a
                    # duplicate. The lane goes on: it ending would leave this upload's later events unhandled.
                    logger.warning("model upload event not settled (it comes back): %s", e)
                finally:
                    with self._changed:
                        self._in_hand -= 1
                        self._changed.notify_all()

    def finish(self, timeout_s: float = 10.0) -> bool:
        """After ``halt``: wait for the events in hand (up to ``timeout_s``), not for a receive that waits for
        one (the threads are daemons) nor for those still waiting in a lane (none starts from now on); False if
        some were still being handled."""
        self.halt.set()
        with self._changed:
            self._changed.notify_all()  # a receive waiting for room gives up
            return self._changed.wait_for(lambda: self._in_hand == 0, timeout=timeout_s)

    def replay_lost(self) -> list[str]:
        """Queue, for each upload whose event was lost (``find_lost``), the event its upload sent; returns their
        keys. Called once the versions registered before are served again, so that what it hands over is only
        what they are not."""
        lost = self._find_lost() if self._find_lost is not None else []
        for obj in lost:
            self._sqs.send_message(QueueUrl=self._queue_url, MessageBody=json.dumps(upload_event(self._bucket, obj)))
        return [o["key"] for o in lost]

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
            reasons = "; ".join(outcome.get("reasons", []))
            logger.info(
                "upload %s: %s%s (%.1f s)",
                outcome.get("key"),
                outcome.get("status"),
                f" {reasons}" if reasons else "",
                time.monotonic() - started,
            )


def lane_of(message: dict[str, Any]) -> str:
    """The lane of an event: the object key it names (EventBridge's, or an S3 notification's first record), ""
    for one that names none (handled in a lane of their own)."""
    try:
        event = json.loads(message["Body"])
        if "detail" in event:
            return str(event["detail"]["object"]["key"])
        return str(event["Records"][0]["s3"]["object"]["key"])
    except (ValueError, KeyError, IndexError, TypeError):
        return ""


def connect_uploads(stack: str, bucket: str) -> str:
    """Make the model bucket emit EventBridge events and keep versions (moto's CloudFormation drops the template's
    EventBridgeConfiguration and VersioningConfiguration) and add a local SQS queue as a target of template.yaml's
    ModelUpload rule; return the queue's URL. Run again after moto restarted."""
    import boto3

    from infra.local.cfn import stack_resources

    cfn, s3, sqs, events = (boto3.client(s) for s in ("cloudformation", "s3", "sqs", "events"))
    rule = stack_resources(cfn, stack)["ModelUpdaterFunctionModelUpload"]
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={"EventBridgeConfiguration": {}})
    # ... and its VersioningConfiguration: with it, each upload's event names its version id, which the updater
    # reads the object by and records (artifact_version_id), as on AWS
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    queue_url: str = sqs.create_queue(QueueName=f"{stack}-local-model-uploads")["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"VisibilityTimeout": str(VISIBILITY_S)})
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    # moto delivers to a rule's targets in order and stops at the first it cannot serve (a Lambda function),
    # so the local queue goes first and the template's own target (the ModelUpdater function) after it.
    declared = [t for t in events.list_targets_by_rule(Rule=rule)["Targets"] if t["Id"] != "local-upload-dispatcher"]
    if declared:
        events.remove_targets(Rule=rule, Ids=[t["Id"] for t in declared])
    events.put_targets(Rule=rule, Targets=[{"Id": "local-upload-dispatcher", "Arn": arn}, *declared])
    return queue_url


def lost_uploads(s3: Any, bucket: str, registry: Any) -> list[dict[str, Any]]:
    """The model files in ``bucket`` (``models/<name>/<version>/model.onnx``) that no upload was handled for:
    their version is not registered, not rejected for these bytes (a rejection records the file's SHA-256 when
    it read the file), and not deleted after it was registered from these bytes (``DELETED#<v>``: the restored
    bucket's objects have new version ids, so the bytes tell; the same bytes uploaded again while the stack was
    down are taken for the deleted upload). ``registry``: the updater's (``model_view``). Each as ``key``,
    ``size``, ``etag``."""
    from clipper.models.updater import MODEL_KEY

    lost = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="models/"):
        for obj in page.get("Contents", []):
            match = MODEL_KEY.fullmatch(obj["Key"])
            if match is None:
                continue
            view = registry.model_view(match["model"], match["version"])
            if view.registered is not None:
                continue
            if view.rejected is not None and not view.rejected.sha256:
                continue  # rejected without being read (its size): it would be again
            seen = {s.sha256 for s in (view.rejected, view.deleted) if s is not None and s.sha256}
            if seen:
                data = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
                if hashlib.sha256(data).hexdigest() in seen:
                    continue
            lost.append({"key": obj["Key"], "size": int(obj["Size"]), "etag": str(obj["ETag"]).strip('"')})
    return lost


def upload_event(bucket: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The EventBridge event an upload of ``obj`` (``lost_uploads``'s) sends (what the rule delivers)."""
    detail = {"bucket": {"name": bucket}, "object": {"key": obj["key"], "size": obj["size"], "etag": obj["etag"]}}
    return {"source": "aws.s3", "detail-type": "Object Created", "detail": detail}


def start_uploads(stack: str, outputs: dict[str, str], serving: LocalModelServing, nice: int = 0) -> UploadDispatcher:
    """Connect the bucket's rule to a local queue and start the dispatcher over the updater's handler, with
    ``serving`` as the updater's ``ServingStacks``, its thread ``nice`` steps nicer than the caller's. The
    handler module reads its settings from this process's environment (the caller sets it)."""
    import boto3

    from clipper.models.updater import DynamoDBUpdaterRegistry
    from functions.model_updater import app as updater_app

    bucket = outputs["ModelBucketName"]
    queue_url = connect_uploads(stack, bucket)
    dynamodb, s3 = boto3.client("dynamodb"), boto3.client("s3")
    updater = updater_app.build(updater_app.settings, dynamodb, s3, stacks=serving)
    registry = DynamoDBUpdaterRegistry(dynamodb, updater_app.settings.registry_table)
    dispatcher = UploadDispatcher(
        boto3.client("sqs"),
        queue_url,
        lambda event: updater_app.handle_event(updater, event, bucket),
        nice=nice,
        find_lost=lambda: lost_uploads(s3, bucket, registry),
        bucket=bucket,
    )
    dispatcher.start()
    return dispatcher
