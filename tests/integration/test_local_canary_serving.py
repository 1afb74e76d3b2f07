"""A canary deployment on the local stack (infra/local/serving.py): the version uploaded with the promote wish false
(what ``clipper deploy --canary`` asks for) is registered, not made active even with the model's auto-promote on,
and served by processes of its own (its endpoint and batcher on its own queue), so the canary's share of the queries
reaches the new model. Under moto, with the processes recorded instead of started."""

from __future__ import annotations

from pathlib import Path

import pytest

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.models.serving import PROMOTE_METADATA
from clipper.models.updater import ServingDefaults, build_model_updater
from tests.fakes import digits_app, model_version
from tests.integration.test_local_serving import RecordingHost, serving

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(
        r"ignore:Tried to parse AWS..CloudWatch..Alarm but it's not supported by moto's CloudFormation implementation"
        ":UserWarning"
    ),
]
KEY = "models/mlp/2/model.onnx"


def test_a_canary_upload_is_served_by_its_own_processes_and_not_made_active(aws, demo_models, tmp_path):
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url), activate=True)
    registry.link("digits", "mlp")
    registry.set_model_settings("mlp", auto_promote=True)
    data = (Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx").read_bytes()
    put = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=data, Metadata={PROMOTE_METADATA: "false"})
    host = RecordingHost()
    local = serving(aws, tmp_path, host)
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, local
    )

    outcome = updater.handle_object(aws.bucket, KEY, len(data), put["ETag"], put.get("VersionId"))

    assert outcome.status == "registered" and not outcome.promoted
    assert registry.version_history("mlp").active == "1"
    assert any(name.startswith("endpoint-mlp-2") for name in host.commands), host.commands
    assert any(name.startswith("batcher-mlp-2") for name in host.commands), host.commands
    canary = registry.start_canary("mlp", "2", 0.1, 1_790_000_000.0)
    served = registry.get_version("mlp", canary.version)
    assert served.queue_url != aws.queue_url  # its own queue, which its own batcher reads
