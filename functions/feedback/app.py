"""Feedback Lambda: consumes the feedback queue (SQS event source mapping) and applies each message to
the bandit state; a message that fails is reported alone (partial batch response), retried, and after
the queue's maxReceiveCount moved to its dead-letter queue. At the end of each batch, the models whose canary
evidence it grew are reviewed (``clipper.canary.review``: promote or roll back; ``CanaryDecisions`` as EMF);
functions/canary_review reviews every canary each minute besides.

Cold start: the cyclic garbage collector is off while the composition root runs; its objects are frozen
afterwards (see functions/frontend/app.py)."""

from __future__ import annotations

import gc

gc.disable()

from typing import Any  # noqa: E402

from aws_lambda_powertools import Logger  # noqa: E402
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers  # noqa: E402
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response  # noqa: E402
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord  # noqa: E402

from clipper.adapters.canary_metrics import EmfCanaryMetrics  # noqa: E402
from clipper.feedback import FeedbackMessage  # noqa: E402
from clipper.settings import CommonSettings  # noqa: E402
from clipper.wiring import aws_client, build_canary_reviewer, build_feedback_processor  # noqa: E402

logger = Logger(service="clipper-feedback")
copy_config_to_registered_loggers(source_logger=logger, include={"clipper"})
settings = CommonSettings()  # type: ignore[call-arg]
dynamodb = aws_client("dynamodb")
feedback = build_feedback_processor(settings, dynamodb)
reviewer = build_canary_reviewer(settings, dynamodb, EmfCanaryMetrics())
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)

gc.freeze()
gc.enable()


def record_handler(record: SQSRecord) -> str:
    message = FeedbackMessage.from_json(record.body)
    # the feedback id (the client got it when the frontend accepted the feedback) correlates the record's lines
    logger.set_correlation_id(message.feedback_id)
    outcome = feedback.process(message)
    logger.info("feedback processed", outcome=outcome, app=message.app, message_id=record.message_id)
    return outcome


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    response = process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
    reviewer.review_many(feedback.take_touched())  # failures are logged: the batch's response stands
    return response
