"""``CanaryDecisions``: the PutMetricData writer against moto's CloudWatch, and the EMF line's shape."""

from __future__ import annotations

import io
import json

import boto3
import pytest

from clipper.adapters.canary_metrics import CloudWatchCanaryMetrics, EmfCanaryMetrics

pytestmark = pytest.mark.integration


def test_put_metric_data_by_model_and_kind_and_by_kind(aws):
    cloudwatch = boto3.client("cloudwatch")
    CloudWatchCanaryMetrics(cloudwatch).decision("mlp", "rollback")
    metrics = cloudwatch.list_metrics(Namespace="Clipper", MetricName="CanaryDecisions")["Metrics"]
    dims = sorted(sorted((d["Name"], d["Value"]) for d in m["Dimensions"]) for m in metrics)
    assert dims == [[("kind", "rollback")], [("kind", "rollback"), ("model", "mlp")]]


def test_a_failed_put_is_logged_not_raised(aws, caplog):
    class Down:
        def put_metric_data(self, **kwargs):
            from botocore.exceptions import EndpointConnectionError

            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")

    CloudWatchCanaryMetrics(Down()).decision("mlp", "promote")
    assert "not sent" in caplog.text


def test_emf_line(monkeypatch):
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    out = io.StringIO()
    EmfCanaryMetrics(out=out).decision("mlp", "rollback")
    line = json.loads(out.getvalue())
    (directive,) = line["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "Clipper" and directive["Dimensions"] == [["model", "kind"], ["kind"]]
    assert (line["model"], line["kind"], line["CanaryDecisions"]) == ("mlp", "rollback", 1)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    quiet = io.StringIO()
    EmfCanaryMetrics(out=quiet).decision("mlp", "rollback")
    assert quiet.getvalue() == ""
