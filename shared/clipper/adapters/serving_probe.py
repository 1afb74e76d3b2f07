"""Queue depths (SQS) and endpoint health (the server's ``/ping``, or SageMaker's endpoint status) for the
management API's ``get_state``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import urllib3

from clipper.adapters.aws_errors import aws_call


class AwsServingProbe:
    """``depths``: a queue's depth on another transport than SQS (the local stack's Redis streams), by URL."""

    def __init__(
        self,
        sqs: Any,
        sagemaker: Any | None = None,
        pool: urllib3.PoolManager | None = None,
        depths: Callable[[str], dict[str, int]] | None = None,
    ) -> None:
        self._sqs = sqs
        self._sagemaker = sagemaker
        self._pool = pool or urllib3.PoolManager(maxsize=2)
        self._depths = depths

    def queue_depth(self, queue_url: str) -> dict[str, int]:
        if self._depths is not None:
            return self._depths(queue_url)
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        with aws_call("sqs.GetQueueAttributes"):
            attrs = self._sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
        return {"waiting": int(attrs.get(names[0], 0)), "in_flight": int(attrs.get(names[1], 0))}

    def endpoint_health(self, endpoint: str) -> str:
        if endpoint.startswith("sagemaker:"):
            if self._sagemaker is None:
                return "unknown (no SageMaker client)"
            with aws_call("sagemaker.DescribeEndpoint"):
                status = self._sagemaker.describe_endpoint(EndpointName=endpoint.removeprefix("sagemaker:"))
            return str(status["EndpointStatus"])
        try:
            resp = self._pool.request(
                "GET", endpoint.rstrip("/") + "/ping", timeout=urllib3.Timeout(connect=0.5, read=2.0), retries=False
            )
        except urllib3.exceptions.HTTPError as e:
            return f"unreachable ({type(e).__name__})"
        return "healthy" if resp.status == 200 else f"unhealthy ({resp.status})"
