from __future__ import annotations

import pytest

from clipper.adapters.cloudwatch_metrics import CloudWatchCounters

pytestmark = pytest.mark.integration


def test_counters_are_summed_and_sent_once_per_interval(aws):
    import boto3

    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    now = [0.0]
    counters = CloudWatchCounters(cloudwatch, "Clipper", {"queue": "clipper-model-mlp"}, 60.0, clock=lambda: now[0])
    counters.add("EndpointErrors", 3)
    counters.add("EndpointErrors", 2)
    assert cloudwatch.list_metrics(Namespace="Clipper")["Metrics"] == []  # not sent before the interval
    now[0] = 61.0
    counters.add("EndpointErrors", 1)  # due: the three adds go in one call
    (metric,) = cloudwatch.list_metrics(Namespace="Clipper")["Metrics"]
    assert metric["MetricName"] == "EndpointErrors"
    assert metric["Dimensions"] == [{"Name": "queue", "Value": "clipper-model-mlp"}]
    import datetime as dt

    stats = cloudwatch.get_metric_statistics(
        Namespace="Clipper",
        MetricName="EndpointErrors",
        Dimensions=[{"Name": "queue", "Value": "clipper-model-mlp"}],
        StartTime=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5),
        EndTime=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5),
        Period=60,
        Statistics=["Sum"],
    )
    assert sum(p["Sum"] for p in stats["Datapoints"]) == 6
    counters.flush()  # nothing left: no call, no error


def test_a_failed_send_is_logged_not_raised(caplog):
    class Down:
        def put_metric_data(self, **_):
            from botocore.exceptions import EndpointConnectionError

            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")

    counters = CloudWatchCounters(Down(), "Clipper", {"queue": "q"}, 0.0)
    counters.add("EndpointErrors", 1)
    assert "metrics not sent" in caplog.text
