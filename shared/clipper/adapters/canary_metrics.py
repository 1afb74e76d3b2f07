"""``CanaryDecisions`` (namespace Clipper, unit Count): one per canary decision that ended a trial, by ``model`` and
``kind`` (promote, rollback) and by ``kind`` alone (template.yaml's alarm on every rollback reads that one).

Two writers of the same metric: EMF lines on stdout for a Lambda function (CloudWatch Logs extracts them; no
call, no permission), and ``PutMetricData`` for a long-running process (the local stack's feedback worker, whose
CloudWatch is moto's). Decisions are rare (one per trial), so each is sent at once."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import orjson

from clipper.adapters.aws_errors import aws_call
from clipper.errors import ClipperError

logger = logging.getLogger(__name__)

METRIC = "CanaryDecisions"
NAMESPACE = "Clipper"


class EmfCanaryMetrics:
    """EMF lines to stdout; ``POWERTOOLS_METRICS_DISABLED`` turns them off, as it does Powertools' metrics."""

    def __init__(self, namespace: str = NAMESPACE, out: Any = None) -> None:
        self._namespace = namespace
        self._out = out
        self.enabled = os.environ.get("POWERTOOLS_METRICS_DISABLED", "").lower() not in ("1", "true")

    def decision(self, model: str, kind: str) -> None:
        if not self.enabled:
            return
        line = {
            "_aws": {
                "Timestamp": int(time.time() * 1000),
                "CloudWatchMetrics": [
                    {
                        "Namespace": self._namespace,
                        "Dimensions": [["model", "kind"], ["kind"]],
                        "Metrics": [{"Name": METRIC, "Unit": "Count"}],
                    }
                ],
            },
            "model": model,
            "kind": kind,
            METRIC: 1,
        }
        out = self._out or sys.stdout
        out.write(orjson.dumps(line).decode() + "\n")
        out.flush()


class CloudWatchCanaryMetrics:
    """``PutMetricData``, one call per decision; a failure is logged (the event in the registry stays)."""

    def __init__(self, client: Any, namespace: str = NAMESPACE) -> None:
        self._client = client
        self._namespace = namespace

    def decision(self, model: str, kind: str) -> None:
        dimension_sets = [[("model", model), ("kind", kind)], [("kind", kind)]]
        data = [
            {
                "MetricName": METRIC,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims],
                "Value": 1.0,
                "Unit": "Count",
            }
            for dims in dimension_sets
        ]
        try:
            with aws_call("cloudwatch.PutMetricData"):
                self._client.put_metric_data(Namespace=self._namespace, MetricData=data)
        except ClipperError as e:
            logger.warning("canary decision metric not sent: %s", e)
