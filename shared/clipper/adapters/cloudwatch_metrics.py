"""Counters sent to CloudWatch with ``PutMetricData``, for processes whose log lines are not read as EMF (the
long-poll batcher inside a SageMaker endpoint container: its stdout reaches CloudWatch Logs without the
embedded-metric-format header, so EMF lines there would stay text).

Counts are summed in memory and sent at most once per ``flush_every_s`` (one call for every counter), so a busy
batcher costs one request a minute, not one per batch. The send runs on a thread of its own: the batch that made it
due does not wait for CloudWatch (in a VPC without a route to it, a send waits out its connect timeouts, seconds).
``flush`` sends what is left, on the caller's thread (at stop)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from clipper.adapters.aws_errors import aws_call
from clipper.errors import ClipperError

logger = logging.getLogger(__name__)


class CloudWatchCounters:
    def __init__(
        self,
        client: Any,
        namespace: str,
        dimensions: dict[str, str],
        flush_every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._dimensions = [{"Name": k, "Value": v} for k, v in dimensions.items()]
        self._every = flush_every_s
        self._clock = clock
        self._counts: dict[str, float] = {}
        self._flushed_at = clock()
        self._lock = threading.Lock()
        self._sending: threading.Thread | None = None

    def add(self, name: str, value: float) -> None:
        """Count ``value`` more of ``name``; sends the counts when ``flush_every_s`` has passed."""
        with self._lock:
            self._counts[name] = self._counts.get(name, 0.0) + value
            due = self._clock() - self._flushed_at >= self._every
            if due and (self._sending is None or not self._sending.is_alive()):
                self._flushed_at = self._clock()  # one send at a time; the next is due an interval later
                self._sending = threading.Thread(target=self.flush, name="clipper-cloudwatch-counters", daemon=True)
                self._sending.start()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for a send in progress."""
        sending = self._sending
        if sending is not None:
            sending.join(timeout_s)

    def flush(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, {}
            self._flushed_at = self._clock()
        if not counts:
            return
        data = [
            {"MetricName": name, "Dimensions": self._dimensions, "Value": value, "Unit": "Count"}
            for name, value in sorted(counts.items())
        ]
        try:
            with aws_call("cloudwatch.PutMetricData"):
                self._client.put_metric_data(Namespace=self._namespace, MetricData=data)
        except ClipperError as e:  # a lost minute of counts is better than a batcher that stops
            logger.warning("metrics not sent: %s", e)
