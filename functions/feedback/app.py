"""Feedback Lambda: consumes the feedback queue (SQS event source mapping) and applies each message to
the bandit state; a message that fails is reported alone (partial batch response), retried, and after
the queue's maxReceiveCount moved to its dead-letter queue."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from clipper.feedback import FeedbackMessage
from clipper.settings import CommonSettings
from clipper.wiring import aws_client, build_feedback_processor

logger = Logger(service="clipper-feedback")
settings = CommonSettings()  # type: ignore[call-arg]
feedback = build_feedback_processor(settings, aws_client("dynamodb"))
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)


def record_handler(record: SQSRecord) -> str:
    outcome = feedback.process(FeedbackMessage.from_json(record.body))
    logger.info("feedback processed", outcome=outcome, message_id=record.message_id)
    return outcome


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
