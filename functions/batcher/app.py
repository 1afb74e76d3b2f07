"""Batcher Lambda driver: an SQS event source mapping delivers a model queue's messages in batches.

The whole event is one batch for the batcher core; the messages it could not answer are reported as
partial batch failures (the mapping's ``ReportBatchItemFailures`` response, ``{"batchItemFailures":
[{"itemIdentifier": <messageId>}]}``), so only those are retried and, after the queue's ``maxReceiveCount``,
moved to its dead-letter queue. The core already knows which messages failed, so the response is built here
rather than by Powertools' ``BatchProcessor`` (whose import, ~45 ms with the event data classes it loads, a
cold start would pay for nothing).

Cold start: the cyclic garbage collector is off while the composition root runs and its objects are frozen
afterwards; the S3 client (claim checks: inputs over the SQS message limit) and the SageMaker runtime client
(models served by a SageMaker endpoint) are created on their first use, once per container.
"""

from __future__ import annotations

import gc

gc.disable()

from typing import Any  # noqa: E402

from aws_lambda_powertools import Logger  # noqa: E402

from clipper.batching.core import Inbound  # noqa: E402
from clipper.settings import BatcherSettings  # noqa: E402
from clipper.wiring import aws_client, build_batcher, lazy_aws_client  # noqa: E402

logger = Logger(service="clipper-batcher")
settings = BatcherSettings()  # type: ignore[call-arg]
batcher = build_batcher(
    settings,
    dynamodb=aws_client("dynamodb"),
    s3=lazy_aws_client("s3"),
    sagemaker=lazy_aws_client("sagemaker-runtime", read_timeout=int(settings.endpoint_timeout_s) + 5),
)

gc.freeze()
gc.enable()


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
    # in the event's order, each failed message once (the response names the messages to retry)
    return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in records if r["messageId"] in failed]}
