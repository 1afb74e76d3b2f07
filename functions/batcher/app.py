"""Batcher Lambda driver: an SQS event source mapping delivers a model queue's messages in batches.

The whole event is one batch for the batcher core; the messages it could not answer are reported as
partial batch failures (the mapping's ``ReportBatchItemFailures`` response, ``{"batchItemFailures":
[{"itemIdentifier": <messageId>}]}``), so only those are retried and, after the queue's ``maxReceiveCount``,
moved to its dead-letter queue. The core already knows which messages failed, so the response is built here
rather than by Powertools' ``BatchProcessor`` (whose import, ~45 ms with the event data classes it loads, a
cold start would pay for nothing).

Observability: one log line per event (its records, answered, expired, duplicates, failed), EMF metrics (by
``model``: each batch's size and latency; by ``service``: answered, expired, duplicate and failed messages; by
``queue``: ``EndpointErrors``, the messages whose batch the endpoint failed, which the model stack's alarm
watches whatever the retry policy does with them) and, where tracing is on, the ``model`` annotation on the
handler's trace segment.

Cold start: the cyclic garbage collector is off while the composition root runs and its objects are frozen
afterwards; the S3 client (claim checks: inputs over the SQS message limit) and the SageMaker runtime client
(models served by a SageMaker endpoint) are created on their first use, once per container.
"""

from __future__ import annotations

import gc

gc.disable()

import os  # noqa: E402
from typing import Any  # noqa: E402

from aws_lambda_powertools import Logger  # noqa: E402
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit  # noqa: E402

from clipper.batching.core import BatchReport, Inbound  # noqa: E402
from clipper.frontend.observability import make_tracer  # noqa: E402
from clipper.settings import BatcherSettings  # noqa: E402
from clipper.wiring import aws_client, build_batcher, lazy_aws_client  # noqa: E402

SERVICE = "clipper-batcher"
logger = Logger(service=SERVICE)
tracer = make_tracer(SERVICE, os.environ)
# No default "service" dimension (Powertools adds POWERTOOLS_SERVICE_NAME's to every line otherwise): each line has
# exactly the dimension it names, as CloudWatch matches a metric by its whole set, and the model stack's
# EndpointFailuresAlarm names "queue" alone
metrics = EphemeralMetrics(namespace="Clipper", service="")
settings = BatcherSettings()  # type: ignore[call-arg]
batcher = build_batcher(
    settings,
    dynamodb=aws_client("dynamodb"),
    s3=lazy_aws_client("s3"),
    # two tries of half the call's timeout each, within the function's: botocore's max_attempts counts retries, and
    # 3 made a hung endpoint 4 reads of the whole timeout, past the function's; one retry still absorbs a throttle
    sagemaker=lazy_aws_client("sagemaker-runtime", read_timeout=settings.endpoint_call_timeout_s / 2, max_attempts=1),
)

gc.freeze()
gc.enable()


def flush(lines: EphemeralMetrics) -> None:
    """One EMF line; cleared even where flushing is disabled (POWERTOOLS_METRICS_DISABLED keeps them)."""
    try:
        lines.flush_metrics()
    finally:
        lines.clear_metrics()


def queue_name(records: list[dict[str, Any]]) -> str:
    """The queue of an event's records (one mapping, one queue): the last part of the source's ARN."""
    arn = str(records[0].get("eventSourceARN", "")) if records else ""
    return arn.rsplit(":", 1)[-1] or "unknown"


def emit_metrics(report: BatchReport, queue: str) -> None:
    if report.endpoint_errors:
        metrics.add_dimension("queue", queue)
        metrics.add_metric(name="EndpointErrors", unit=MetricUnit.Count, value=report.endpoint_errors)
        flush(metrics)
    for model, rows, seconds in report.batches:
        metrics.add_dimension("model", model)
        metrics.add_metric(name="BatchSize", unit=MetricUnit.Count, value=rows)
        metrics.add_metric(name="BatchLatency", unit=MetricUnit.Milliseconds, value=seconds * 1000)
        flush(metrics)
    metrics.add_dimension("service", SERVICE)
    metrics.add_metric(name="MessagesAnswered", unit=MetricUnit.Count, value=report.answered)
    metrics.add_metric(name="MessagesExpired", unit=MetricUnit.Count, value=report.expired)
    metrics.add_metric(name="MessagesDuplicate", unit=MetricUnit.Count, value=report.duplicates)
    metrics.add_metric(name="MessagesFailed", unit=MetricUnit.Count, value=len(report.failed))
    flush(metrics)


def _handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    records = event.get("Records", [])
    report = batcher.process([Inbound.from_sqs_record(r) for r in records])
    failed = set(report.failed)
    models = sorted({m for m, _, _ in report.batches})
    logger.info(
        "batch processed",
        records=len(records),
        answered=report.answered,
        expired=report.expired,
        duplicates=report.duplicates,
        failed=len(failed),
        models=models,
        batch_sizes=[rows for _, rows, _ in report.batches],
    )
    emit_metrics(report, queue_name(records))
    if tracer is not None and models:
        tracer.put_annotation("model", ",".join(models))
    # in the event's order, each failed message once (the response names the messages to retry)
    return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in records if r["messageId"] in failed]}


_traced = tracer.capture_lambda_handler(_handle) if tracer is not None else _handle
handler = logger.inject_lambda_context(_traced)
