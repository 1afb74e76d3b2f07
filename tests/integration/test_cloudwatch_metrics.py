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
    counters.add("EndpointErrors", 1)  # due: the three adds go in one call, sent on a thread of its own
    counters.join(10)
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
    counters.join(10)
    assert "metrics not sent" in caplog.text


def test_a_slow_send_does_not_hold_the_batch_that_made_it_due():
    import threading
    import time

    release = threading.Event()
    sent: list[list] = []

    class Stalled:  # CloudWatch unreachable from a VPC: the send waits out its connect timeouts
        def put_metric_data(self, MetricData, **_):
            release.wait(10)
            sent.append(MetricData)

    counters = CloudWatchCounters(Stalled(), "Clipper", {"queue": "q"}, 0.0)
    started = time.monotonic()
    counters.add("EndpointErrors", 1)
    counters.add("EndpointErrors", 2)  # while the first send waits: in it, or kept for the next
    assert time.monotonic() - started < 1.0
    release.set()
    counters.join(10)
    counters.flush()
    assert sum(d["Value"] for batch in sent for d in batch) == 3  # nothing lost


def test_the_batcher_process_counts_its_endpoint_errors_in_cloudwatch(aws, monkeypatch):
    """The long-poll batcher with CLIPPER_CLOUDWATCH_METRICS (as in the SageMaker container): a batch its
    endpoint fails shows in EndpointErrors by queue name, the metric EndpointFailuresAlarm watches."""
    import datetime as dt
    import threading
    import time

    import boto3

    from clipper.entrypoints.batcher import build_driver, endpoint_error_counters, parse_args
    from clipper.settings import BatcherSettings
    from tests.unit.test_batcher_core import message, one_hot

    class WallClock:
        def now(self) -> float:
            return time.time()

    settings = BatcherSettings(
        registry_table=aws.registry_table,
        replies_table=aws.replies_table,
        cache_enabled=False,
        queue_transport="sqs",
        cloudwatch_metrics=True,
    )
    # nothing listens on port 9: every batch is an endpoint error
    args = parse_args(["--queue-url", aws.queue_url, "--endpoint-url", "http://127.0.0.1:9", "--poll-wait-s", "0"])
    counters = endpoint_error_counters(settings, args.queue_url)
    assert counters is not None
    assert endpoint_error_counters(settings.model_copy(update={"cloudwatch_metrics": False}), aws.queue_url) is None
    driver = build_driver(args, settings, counters)
    for qid in (1, 2):
        aws.sqs.send_message(QueueUrl=aws.queue_url, MessageBody=message(qid, one_hot(qid), WallClock(), 30).body)
    stop = threading.Event()
    failed = 0
    deadline = time.monotonic() + 15  # until both came (the receives run ahead on threads of their own)
    while failed < 2 and time.monotonic() < deadline:
        batch = driver.collect(stop)
        if batch:
            failed += len(driver.handle(batch).failed)
        else:
            time.sleep(0.01)
    driver.close()
    counters.flush()
    assert failed == 2
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    stats = cloudwatch.get_metric_statistics(
        Namespace="Clipper",
        MetricName="EndpointErrors",
        Dimensions=[{"Name": "queue", "Value": "clipper-model-mlp"}],
        StartTime=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5),
        EndTime=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5),
        Period=60,
        Statistics=["Sum"],
    )
    assert sum(p["Sum"] for p in stats["Datapoints"]) == 2
