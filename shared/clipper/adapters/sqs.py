"""SQS adapters: the frontend's request queue and the long-poll driver's queue reader."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from clipper.adapters.aws_errors import aws_call
from clipper.core.messages import sqs_text
from clipper.errors import ClipperError, Unavailable
from clipper.ports import ReceivedMessage

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
else:
    SQSClient = Any


class SqsRequestQueue:
    """Sends with the client's own timeouts (``timeout`` is not passed on: botocore has no per-call timeout; the
    frontend's watchdog bounds the answer). An ensemble's messages go to their queues concurrently."""

    def __init__(self, client: SQSClient) -> None:
        self._client = client
        self._pool: Any = None

    def send(self, queue_url: str, body: str, timeout: float | None = None) -> None:
        """``body`` is a JSON message (a query's, a feedback's), sent as SQS takes it (``sqs_text``)."""
        with aws_call("sqs.SendMessage"):
            self._client.send_message(QueueUrl=queue_url, MessageBody=sqs_text(body))

    def send_many(self, messages: Sequence[tuple[str, str]], timeout: float | None = None) -> list[Exception | None]:
        if len(messages) == 1:
            return [self._try(*messages[0])]
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="clipper-sqs-send")
        return list(self._pool.map(lambda m: self._try(*m), messages))

    def _try(self, queue_url: str, body: str) -> Exception | None:
        try:
            self.send(queue_url, body)
        except ClipperError as e:
            return e
        return None


class SqsQueueReader:
    """Receive, delete and release messages of one queue (the long-poll driver's side)."""

    def __init__(self, client: SQSClient, queue_url: str) -> None:
        self._client = client
        self.queue_url = queue_url

    def receive(self, max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        with aws_call("sqs.ReceiveMessage"):
            resp = self._client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=max(1, min(10, max_messages)),
                WaitTimeSeconds=max(0, min(20, int(wait_s))),
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
        received_ms = time.time() * 1000
        return [
            ReceivedMessage(
                m["MessageId"],
                m["ReceiptHandle"],
                m["Body"],
                int(m.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
                received_ms,
            )
            for m in resp.get("Messages", [])
        ]

    def delete(self, receipt_handles: list[str]) -> None:
        """Delete in calls of 10. ``DeleteMessageBatch`` answers each entry's failure (a stale receipt handle:
        ``ReceiptHandleIsInvalid``) in ``Failed`` without raising: those are raised as Unavailable once every
        call was made, so the acknowledger logs and counts them (the messages come back after their visibility
        timeout, and are answered once)."""
        failed: list[str] = []
        for start in range(0, len(receipt_handles), 10):
            chunk = receipt_handles[start : start + 10]
            entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(chunk)]
            with aws_call("sqs.DeleteMessageBatch"):
                resp = self._client.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            failed += [f.get("Code", "?") for f in resp.get("Failed", [])]
        if failed:
            codes = ", ".join(sorted(set(failed)))
            raise Unavailable(f"sqs.DeleteMessageBatch: {len(failed)} of {len(receipt_handles)} not deleted ({codes})")

    def release(self, receipt_handle: str, delay_s: int) -> None:
        """Make a failed message visible again after ``delay_s`` (the retry back-off)."""
        with aws_call("sqs.ChangeMessageVisibility"):
            self._client.change_message_visibility(
                QueueUrl=self.queue_url, ReceiptHandle=receipt_handle, VisibilityTimeout=delay_s
            )
