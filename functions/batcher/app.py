"""Batcher Lambda driver: an SQS event source mapping delivers a model queue's messages in batches.

The whole event is one batch for the batcher core; the messages it could not answer are reported as
partial batch failures (Powertools ``BatchProcessor``), so only those are retried and, after the queue's
``maxReceiveCount``, moved to its dead-letter queue.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from clipper.batching.core import Inbound
from clipper.errors import ClipperError
from clipper.settings import BatcherSettings
from clipper.wiring import aws_client, build_batcher

logger = Logger(service="clipper-batcher")
settings = BatcherSettings()  # type: ignore[call-arg]
batcher = build_batcher(
    settings,
    dynamodb=aws_client("dynamodb"),
    s3=aws_client("s3"),
    sagemaker=aws_client("sagemaker-runtime", read_timeout=int(settings.endpoint_timeout_s) + 5),
)
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)


class MessageFailed(ClipperError):
    """Marks one record failed for the partial batch response."""


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    records = event.get("Records", [])
    report = batcher.process([Inbound(r["messageId"], r["body"]) for r in records])
    failed = set(report.failed)
    logger.info(
        "batch processed",
        records=len(records),
        answered=report.answered,
        expired=report.expired,
        duplicates=report.duplicates,
        failed=len(failed),
    )

    def record_handler(record: SQSRecord) -> None:
        if record.message_id in failed:
            raise MessageFailed(f"message {record.message_id} not answered")

    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
