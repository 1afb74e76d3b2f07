"""The model updater Lambda (functions/model_updater) under moto: real S3 event payloads for real uploads."""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pytest

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.errors import Conflict, NotFound, Unavailable
from clipper.models.updater import (
    Artifact,
    DynamoDBUpdaterRegistry,
    ModelArtifact,
    ModelUpdater,
    ModelView,
    S3ArtifactStore,
    Upload,
)
from tests.events import EVENTS, LambdaContext
from tests.fakes import InMemoryServingStacks, digits_app, model_version
from tests.integration.conftest import AwsWorld
from tests.slow_models import looping_model

pytestmark = pytest.mark.integration

KEY = "models/mlp/2/model.onnx"


def fresh_import(name: str) -> Any:
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@dataclass
class World:
    aws: AwsWorld
    app: Any  # the handler module
    registry: DynamoDBRegistry
    demo: Path
    stacks: InMemoryServingStacks | None

    def serve_with(self, stacks: InMemoryServingStacks | None) -> None:
        """The handler's updater with these serving stacks (None: a deployment with ModelStacks off)."""
        self.stacks = stacks
        self.app.updater = self.app.build(self.app.settings, self.aws.dynamodb, self.aws.s3, stacks=stacks)

    def reload(self) -> None:
        """The handler module imported again (for changed settings), with the same serving stacks."""
        self.app = fresh_import("functions.model_updater.app")
        self.serve_with(self.stacks)

    def upload(self, key: str, data: bytes) -> dict[str, Any]:
        """Put ``data`` at ``key`` and answer the S3 notification that upload sends (events/s3-model-upload.json)."""
        put = self.aws.s3.put_object(Bucket=self.aws.bucket, Key=key, Body=data)
        event: dict[str, Any] = json.loads((EVENTS / "s3-model-upload.json").read_text())
        s3 = event["Records"][0]["s3"]
        s3["bucket"].update({"name": self.aws.bucket, "arn": f"arn:aws:s3:::{self.aws.bucket}"})
        s3["object"].update({"key": quote_plus(key, safe="/"), "size": len(data), "eTag": put["ETag"].strip('"')})
        if put.get("VersionId"):
            s3["object"]["versionId"] = put["VersionId"]
        else:
            s3["object"].pop("versionId")
        return event

    def handle(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        response = self.app.handler(event, LambdaContext(function_name="model-updater"))
        outcomes: list[dict[str, Any]] = response["outcomes"]
        return outcomes

    def model_bytes(self, name: str = "mlp") -> bytes:
        return (self.demo / name / "1" / "model.onnx").read_bytes()

    def item(self, sk: str, model: str = "mlp") -> dict[str, Any] | None:
        key = {"pk": {"S": f"MODEL#{model}"}, "sk": {"S": sk}}
        item: dict[str, Any] | None = self.aws.dynamodb.get_item(TableName=self.aws.registry_table, Key=key).get("Item")
        return item

    def table(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.aws.dynamodb.scan(TableName=self.aws.registry_table)["Items"]
        return sorted(items, key=lambda i: (i["pk"]["S"], i["sk"]["S"]))

    def auto_promote(self, on: bool) -> None:
        self.aws.dynamodb.update_item(
            TableName=self.aws.registry_table,
            Key={"pk": {"S": "MODEL#mlp"}, "sk": {"S": "MODEL"}},
            UpdateExpression="SET auto_promote = :on",
            ExpressionAttributeValues={":on": {"BOOL": on}},
        )

    def active(self, model: str = "mlp") -> str:
        return self.registry.model_and_versions(model)[0].active_version


@pytest.fixture
def world(aws: AwsWorld, demo_models: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("CLIPPER_REGISTRY_TABLE", aws.registry_table)
    monkeypatch.setenv("CLIPPER_REPLIES_TABLE", aws.replies_table)
    monkeypatch.setenv("CLIPPER_MODEL_BUCKET", aws.bucket)
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url, labels=("0", "1")), activate=True)
    registry.link("digits", "mlp")
    world = World(aws, fresh_import("functions.model_updater.app"), registry, Path(demo_models["out_dir"]), None)
    world.serve_with(InMemoryServingStacks())
    yield world
    sys.modules.pop("functions.model_updater.app", None)


# --- registration and promotion ------------------------------------------------------------------------------


def test_an_uploaded_model_is_registered_with_its_own_serving_resources_and_left_inactive(world: World) -> None:
    data = world.model_bytes()
    event = world.upload(KEY, data)

    (outcome,) = world.handle(event)

    assert outcome["status"] == "registered" and not outcome["promoted"]
    assert world.active() == "1"
    served = world.registry.get_version("mlp", "2")  # what the batcher and frontend read
    v1 = world.registry.get_version("mlp", "1")
    # its own queue and endpoint, which serve exactly the object version validated here (never v1's)
    assert served.queue_url != v1.queue_url and served.endpoint != v1.endpoint and served.labels == v1.labels
    assert (served.queue_url, served.endpoint) == ("https://sqs.local/queue-mlp-v2", "http://endpoint.local/mlp/2")
    assert world.stacks is not None
    artifact, _ = world.stacks.served[("mlp", "2")]
    # served from a copy of exactly the validated object under a key no upload URL names (a second PUT to the
    # upload's key, or a SageMaker instance started later, can never change what the version serves)
    digest = hashlib.sha256(data).hexdigest()
    assert (artifact.uri, artifact.sha256) == (f"s3://{world.aws.bucket}/validated/mlp/2/{digest}/model.onnx", digest)
    kept = world.aws.s3.get_object(Bucket=world.aws.bucket, Key=artifact.uri.split("/", 3)[3])["Body"].read()
    assert kept == data
    assert served.input_shape == (64,) and served.input_type is v1.input_type
    item = world.item("VERSION#2")
    assert item is not None
    assert item["status"]["S"] == "registered"
    assert item["artifact"]["S"] == f"s3://{world.aws.bucket}/{KEY}"
    assert item["size"]["N"] == str(len(data))
    assert item["etag"]["S"] == event["Records"][0]["s3"]["object"]["eTag"]
    assert int(item["created_at"]["N"]) > 0 and "promoted_at" not in item
    signature = json.loads(item["signature"]["S"])
    assert signature["input"] == {"name": "input", "element_type": "float32", "shape": [None, 64]}
    assert world.item("REJECTED#2") is None


def test_auto_promote_makes_the_new_version_active_and_keeps_the_old_one_for_rollback(world: World) -> None:
    world.auto_promote(True)

    (outcome,) = world.handle(world.upload(KEY, world.model_bytes("logreg")))

    assert outcome["status"] == "registered" and outcome["promoted"]
    assert world.active() == "2"
    assert world.registry.previous_version("mlp") == "1"
    assert world.registry.get_version("mlp", "1").version == "1"  # queries in flight on 1 still resolve it
    item = world.item("VERSION#2")
    assert item is not None and "promoted_at" in item


def test_while_a_canary_runs_an_auto_promoted_upload_is_registered_but_not_made_active(world: World) -> None:
    """The live evidence decides while a canary runs: an upload with auto-promote on does not switch under it."""
    world.registry.put_version(model_version("mlp", "c", queue_url=world.aws.queue_url), activate=False)
    world.registry.start_canary("mlp", "c", 0.2, 1_700_000_000.0)
    world.auto_promote(True)

    (outcome,) = world.handle(world.upload(KEY, world.model_bytes("logreg")))

    assert outcome["status"] == "registered" and not outcome["promoted"]
    assert world.active() == "1"
    canary = world.registry.canary("mlp")
    assert canary is not None and canary.version == "c"


def test_auto_promote_false_leaves_the_active_version(world: World) -> None:
    world.auto_promote(False)

    (outcome,) = world.handle(world.upload(KEY, world.model_bytes()))

    assert outcome["status"] == "registered" and not outcome["promoted"]
    assert world.active() == "1"


def test_without_serving_stacks_a_later_version_is_refused_never_active_while_the_old_model_answers(
    world: World,
) -> None:
    """ModelStacks off (AWS's default): nothing would load the file, and taking v1's queue and endpoint would
    report v2 active while v1's model answers. Refused with the reason, even with auto-promote on."""
    world.serve_with(None)
    world.auto_promote(True)

    (outcome,) = world.handle(world.upload(KEY, world.model_bytes("logreg")))

    assert (outcome["status"], outcome["promoted"]) == ("rejected", False)
    (reason,) = outcome["reasons"]
    assert "mlp:2 would have no serving resources of its own" in reason and "ModelStacks" in reason
    assert "add_model" in reason
    assert world.active() == "1" and world.item("VERSION#2") is None
    rejected = world.item("REJECTED#2")
    assert rejected is not None and rejected["reasons"]["L"] == [{"S": reason}]


# --- rejection -----------------------------------------------------------------------------------------------


def test_a_bad_file_is_recorded_as_rejected_and_never_becomes_active(world: World) -> None:
    world.auto_promote(True)

    (outcome,) = world.handle(world.upload(KEY, b"this is not an onnx model"))

    assert outcome["status"] == "rejected"
    assert "not a loadable ONNX model" in outcome["reasons"][0]
    assert world.active() == "1"
    with pytest.raises(NotFound):
        world.registry.get_version("mlp", "2")
    assert "2" not in world.registry.model_and_versions("mlp")[1]
    rejected = world.item("REJECTED#2")
    assert rejected is not None
    assert rejected["status"]["S"] == "rejected"
    assert "not a loadable ONNX model" in rejected["reasons"]["L"][0]["S"]
    assert rejected["artifact"]["S"] == f"s3://{world.aws.bucket}/{KEY}" and rejected["signature"]["S"] == ""


def test_a_model_that_does_not_fit_the_linked_application_is_rejected_naming_it(world: World) -> None:
    world.auto_promote(True)
    from infra.demo.cnn_model import ensure_cnn

    cnn = ensure_cnn(world.demo)  # a real model of another shape (3x32x32 images): built once, then reused

    (outcome,) = world.handle(world.upload(KEY, cnn.read_bytes()))

    assert outcome["status"] == "rejected"
    assert any("application 'digits'" in r and "[64]" in r for r in outcome["reasons"])
    assert world.active() == "1"
    rejected = world.item("REJECTED#2")
    assert rejected is not None and json.loads(rejected["signature"]["S"])["input"]["shape"] == ["N", 3, 32, 32]


def test_a_fixed_upload_after_a_rejection_registers_and_clears_the_rejection(world: World) -> None:
    world.handle(world.upload(KEY, b"garbage"))

    (outcome,) = world.handle(world.upload(KEY, world.model_bytes()))

    assert outcome["status"] == "registered"
    assert world.item("REJECTED#2") is None and world.item("VERSION#2") is not None


def test_other_bytes_for_a_registered_version_are_rejected_and_the_version_is_untouched(world: World) -> None:
    world.handle(world.upload(KEY, world.model_bytes("mlp")))
    before = world.item("VERSION#2")

    (outcome,) = world.handle(world.upload(KEY, world.model_bytes("logreg")))

    assert outcome["status"] == "rejected" and "immutable" in outcome["reasons"][0]
    assert world.item("VERSION#2") == before


# --- at-least-once delivery, and what is not a model ---------------------------------------------------------


@pytest.mark.parametrize("good", [True, False])
def test_a_duplicate_event_changes_nothing(world: World, good: bool) -> None:
    world.auto_promote(True)
    event = world.upload(KEY, world.model_bytes() if good else b"garbage")
    (first,) = world.handle(event)
    table = world.table()

    (again,) = world.handle(event)

    assert first["status"] == ("registered" if good else "rejected")
    assert again["status"] == "duplicate"
    assert world.table() == table


def test_the_same_bytes_uploaded_again_change_nothing(world: World) -> None:
    world.aws.s3.put_bucket_versioning(Bucket=world.aws.bucket, VersioningConfiguration={"Status": "Enabled"})
    world.handle(world.upload(KEY, world.model_bytes()))
    table = world.table()

    (again,) = world.handle(world.upload(KEY, world.model_bytes()))  # a new S3 version, the same bytes

    assert again["status"] == "duplicate"
    assert world.table() == table


def test_a_versioned_upload_is_read_at_its_version_even_after_an_overwrite(world: World) -> None:
    world.aws.s3.put_bucket_versioning(Bucket=world.aws.bucket, VersioningConfiguration={"Status": "Enabled"})
    event = world.upload(KEY, world.model_bytes())
    world.aws.s3.put_object(Bucket=world.aws.bucket, Key=KEY, Body=b"overwritten before the event arrived")

    (outcome,) = world.handle(event)

    assert outcome["status"] == "registered"
    item = world.item("VERSION#2")
    assert item is not None
    assert item["artifact_version_id"]["S"] == event["Records"][0]["s3"]["object"]["versionId"]


def test_an_event_for_an_object_replaced_since_is_ignored_in_an_unversioned_bucket(world: World) -> None:
    event = world.upload(KEY, world.model_bytes())
    world.aws.s3.put_object(Bucket=world.aws.bucket, Key=KEY, Body=b"the newer upload has its own event")

    (outcome,) = world.handle(event)

    assert outcome["status"] == "ignored"
    assert world.item("VERSION#2") is None and world.item("REJECTED#2") is None


@pytest.mark.parametrize(
    "key", ["claims/abc123", "models/mlp/2/notes.txt", "models/MLP/2/model.onnx", "models/mlp/model.onnx"]
)
def test_an_unrelated_key_is_ignored(world: World, key: str) -> None:
    table = world.table()

    (outcome,) = world.handle(world.upload(key, world.model_bytes()))

    assert outcome["status"] == "ignored" and outcome["reasons"]
    assert world.table() == table


def test_events_other_than_object_created_are_skipped(world: World) -> None:
    event = world.upload(KEY, world.model_bytes())
    event["Records"][0]["eventName"] = "ObjectRemoved:Delete"

    assert world.handle(event) == []
    assert world.item("VERSION#2") is None


def test_an_eventbridge_object_created_event_has_the_same_outcome(world: World) -> None:
    world.auto_promote(True)
    data = world.model_bytes()
    put = world.aws.s3.put_object(Bucket=world.aws.bucket, Key=KEY, Body=data)
    event = json.loads((EVENTS / "eventbridge-model-upload.json").read_text())
    event["detail"]["bucket"]["name"] = world.aws.bucket
    event["detail"]["object"].update({"key": KEY, "size": len(data), "etag": put["ETag"].strip('"')})
    del event["detail"]["object"]["version-id"]  # an unversioned bucket

    (outcome,) = world.handle(event)
    (again,) = world.handle(event)

    assert (outcome["status"], outcome["promoted"], again["status"]) == ("registered", True, "duplicate")
    assert world.active() == "2"


def test_the_null_version_id_of_an_unversioned_bucket_pins_nothing(world: World) -> None:
    """moto (and S3 for objects written while versioning was off) name the version "null": every upload of the
    key has it, so a fixed file after a rejection must not pass for a redelivery of the rejected one."""

    def event_for(data: bytes) -> dict[str, Any]:
        put = world.aws.s3.put_object(Bucket=world.aws.bucket, Key=KEY, Body=data)
        event = json.loads((EVENTS / "eventbridge-model-upload.json").read_text())
        event["detail"]["bucket"]["name"] = world.aws.bucket
        obj = {"key": KEY, "size": len(data), "etag": put["ETag"].strip('"'), "version-id": "null"}
        event["detail"]["object"].update(obj)
        return event

    (rejected,) = world.handle(event_for(b"garbage"))
    (fixed,) = world.handle(event_for(world.model_bytes()))

    assert (rejected["status"], fixed["status"]) == ("rejected", "registered")
    assert world.item("VERSION#2")["artifact_version_id"] == {"S": ""}


# --- one record at a time; retries ---------------------------------------------------------------------------


class FlakyStore:
    """S3, except that one key cannot be read."""

    def __init__(self, inner: S3ArtifactStore, failing_key: str, error: Exception) -> None:
        self.inner, self.failing_key, self.error = inner, failing_key, error

    def read(self, upload: Upload) -> Artifact:
        if upload.key == self.failing_key:
            raise self.error
        return self.inner.read(upload)


def test_a_transient_failure_is_raised_for_a_retry_after_the_other_records_are_handled(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = "models/logreg/7/model.onnx"
    registry = DynamoDBUpdaterRegistry(world.aws.dynamodb, world.aws.registry_table)
    store = FlakyStore(S3ArtifactStore(world.aws.s3), failing, Unavailable("s3.GetObject(model): SlowDown"))
    flaky = ModelUpdater(registry, store, SystemClock(), stacks=world.stacks)
    monkeypatch.setattr(world.app, "updater", flaky)
    first, second = world.upload(failing, world.model_bytes()), world.upload(KEY, world.model_bytes())
    event = {"Records": first["Records"] + second["Records"]}

    with pytest.raises(Unavailable):
        world.handle(event)

    assert world.item("VERSION#2") is not None  # the other record was handled
    store = S3ArtifactStore(world.aws.s3)
    monkeypatch.setattr(world.app, "updater", ModelUpdater(registry, store, SystemClock(), stacks=world.stacks))
    outcomes = world.handle(event)  # Lambda's retry of the whole event
    assert [o["status"] for o in outcomes] == ["registered", "duplicate"]


def test_a_defect_on_one_record_is_logged_and_the_others_are_handled(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = "models/logreg/7/model.onnx"
    registry = DynamoDBUpdaterRegistry(world.aws.dynamodb, world.aws.registry_table)
    store = FlakyStore(S3ArtifactStore(world.aws.s3), failing, RuntimeError("a bug"))
    monkeypatch.setattr(world.app, "updater", ModelUpdater(registry, store, SystemClock(), stacks=world.stacks))
    first, second = world.upload(failing, world.model_bytes()), world.upload(KEY, world.model_bytes())

    outcomes = world.handle({"Records": first["Records"] + second["Records"]})

    assert [o["status"] for o in outcomes] == ["failed", "registered"]
    assert "RuntimeError: a bug" in outcomes[0]["reasons"][0]


def test_an_object_in_another_bucket_is_ignored(world: World) -> None:
    world.aws.s3.create_bucket(Bucket="someone-elses-models")
    event = world.upload(KEY, world.model_bytes())
    event["Records"][0]["s3"]["bucket"]["name"] = "someone-elses-models"

    (outcome,) = world.handle(event)

    assert outcome["status"] == "ignored"
    assert world.item("VERSION#2") is None and world.item("REJECTED#2") is None


def test_a_file_over_the_size_limit_is_rejected_unread(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLIPPER_MAX_MODEL_BYTES", "1000")
    world.reload()

    (outcome,) = world.handle(world.upload(KEY, world.model_bytes()))

    assert outcome["status"] == "rejected" and "over the limit of 1000" in outcome["reasons"][0]
    rejected = world.item("REJECTED#2")
    assert rejected is not None and rejected["sha256"]["S"] == ""


def test_a_model_whose_sample_run_never_ends_is_rejected_at_the_time_limit_and_not_tried_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sample run had no limit: such a model held the Lambda function to its timeout, and the upload was
    retried, again and again (and locally held every other upload behind it)."""
    monkeypatch.setenv("CLIPPER_VALIDATION_TIMEOUT_S", "2")
    world.reload()
    world.auto_promote(True)
    event = world.upload(KEY, looping_model())
    started = time.monotonic()

    (outcome,) = world.handle(event)

    assert time.monotonic() - started < 60.0  # the limit, after the child's start and the load: not retried
    assert outcome["status"] == "rejected"
    (reason,) = outcome["reasons"]
    assert "did not finish within the validation time limit of 2 s: stopped after " in reason
    rejected = world.item("REJECTED#2")  # where get_model, get_state and `clipper model` / `deploy` read it
    assert rejected is not None and [r["S"] for r in rejected["reasons"]["L"]] == [reason]
    assert json.loads(rejected["signature"]["S"])["input"]["shape"] == ["N", 64]
    assert world.active() == "1" and world.item("VERSION#2") is None
    # a redelivery is not validated again
    assert [o["status"] for o in world.handle(event)] == ["duplicate"]


def test_the_validation_limit_must_leave_the_function_room_to_record_the_outcome(world: World) -> None:
    settings = world.app.ModelUpdaterSettings
    # template.yaml's: 900 s function, 600 s stack wait, the 60 s default limit
    fits = settings(function_timeout_s=900, service_stack_name="clipper", model_stack_wait_s=600)
    assert fits.validation_timeout_s == 60
    # the sample run's limit runs from the model's loading; starting and loading get what the function leaves
    assert fits.validation_load_timeout_s == 900 - 600 - 60 - 60
    with pytest.raises(ValueError, match=r"CLIPPER_VALIDATION_TIMEOUT_S \(300 s\) .* 60 s to start .* at most 180 s"):
        settings(function_timeout_s=900, service_stack_name="clipper", validation_timeout_s=300)
    no_stacks = settings(function_timeout_s=900, validation_timeout_s=300)  # no stack wait
    assert (no_stacks.validation_timeout_s, no_stacks.validation_load_timeout_s) == (300, 540)
    assert settings().validation_load_timeout_s == 240  # no function timeout (locally): four times the limit


def test_the_functions_memory_is_named_when_the_validation_process_is_killed_for_it(
    world: World, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Lambda's AWS_LAMBDA_FUNCTION_MEMORY_SIZE reaches the rejection of a model whose validation was OOM-killed."""
    monkeypatch.setenv("CLIPPER_VALIDATION_TIMEOUT_S", "10")
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "3072")
    world.reload()
    oom = tmp_path / "oom"
    oom.write_text("#!/bin/sh\nkill -9 $$\n")
    oom.chmod(0o755)
    validator = world.app.updater._validator
    monkeypatch.setattr(validator, "_python", str(oom))

    (outcome,) = world.handle(world.upload(KEY, world.model_bytes()))

    assert outcome["status"] == "rejected"
    assert "most likely out of memory (the function's memory: 3072 MB)" in outcome["reasons"][0]


class StaleFirstView:
    """The registry, except that its first model_view answers what was true before a concurrent delivery."""

    def __init__(self, inner: DynamoDBUpdaterRegistry, stale: ModelView) -> None:
        self.inner, self.stale = inner, [stale]

    def model_view(self, model: str, version: str) -> ModelView:
        return self.stale.pop() if self.stale else self.inner.model_view(model, version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize(("model", "expected"), [("mlp", "duplicate"), ("logreg", "rejected")])
def test_a_delivery_that_loses_a_race_looks_again(world: World, model: str, expected: str) -> None:
    world.auto_promote(True)
    registry = DynamoDBUpdaterRegistry(world.aws.dynamodb, world.aws.registry_table)
    before = registry.model_view("mlp", "2")
    world.handle(world.upload(KEY, world.model_bytes()))  # the concurrent delivery that won
    table = world.table()
    put = world.aws.s3.put_object(Bucket=world.aws.bucket, Key=KEY, Body=world.model_bytes(model))
    store = S3ArtifactStore(world.aws.s3)
    late = ModelUpdater(StaleFirstView(registry, before), store, SystemClock(), stacks=world.stacks)

    outcome = late.handle_object(world.aws.bucket, KEY, 0, put["ETag"])

    assert outcome.status == expected
    assert world.item("VERSION#2") == next(i for i in table if i["sk"]["S"] == "VERSION#2")
    assert world.active() == "2" and world.registry.previous_version("mlp") == "1"


# --- a model's first version ---------------------------------------------------------------------------------


def test_without_serving_stacks_a_new_models_first_version_needs_serving_defaults(world: World) -> None:
    world.serve_with(None)

    (outcome,) = world.handle(world.upload("models/digits-lr/1/model.onnx", world.model_bytes("logreg")))

    assert outcome["status"] == "rejected" and "sets no serving defaults" in outcome["reasons"][0]
    with pytest.raises(NotFound):
        world.registry.model_and_versions("digits-lr")


def test_a_new_models_first_version_takes_the_defaults_and_becomes_active(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "CLIPPER_DEFAULT_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/clipper-model-{model}"
    )
    monkeypatch.setenv("CLIPPER_DEFAULT_ENDPOINT", "sagemaker:clipper-{model}")
    world.stacks = None  # a deployment with ModelStacks off
    world.reload()

    (outcome,) = world.handle(world.upload("models/digits-lr/1/model.onnx", world.model_bytes("logreg")))

    assert outcome["status"] == "registered" and outcome["promoted"]
    mv = world.registry.active_version("digits-lr")
    assert mv.queue_url.endswith("/clipper-model-digits-lr") and mv.endpoint == "sagemaker:clipper-digits-lr"
    assert mv.input_type.value == "floats" and mv.input_shape == (64,)


# --- uploads whose events were lost (the local stack's restart) ----------------------------------------------


def test_the_uploads_no_event_was_handled_for_are_found_and_their_events_register_them(world: World) -> None:
    """The local stack keeps the bucket's objects across a restart but not the queue of their events: an upload
    made as it stopped comes back without its event. ``lost_uploads`` finds such files (the version neither
    registered nor rejected for these bytes), and the event ``upload_event`` makes for one is handled as the
    upload's own."""
    from infra.local.uploads import lost_uploads, upload_event

    bucket, good, bad = world.aws.bucket, world.model_bytes(), b"not an onnx model"
    statuses = [
        world.handle(world.upload(f"models/mlp/{v}/model.onnx", d))[0]["status"] for v, d in (("2", good), ("3", bad))
    ]
    assert statuses == ["registered", "rejected"]
    for version, data in (("4", good), ("5", bad), ("3", bad)):  # uploaded, their events lost (3: the same bytes)
        world.aws.s3.put_object(Bucket=bucket, Key=f"models/mlp/{version}/model.onnx", Body=data)
    world.aws.s3.put_object(Bucket=bucket, Key="models/mlp/6/weights.bin", Body=b"x")  # not a model file
    registry = DynamoDBUpdaterRegistry(world.aws.dynamodb, world.aws.registry_table)

    lost = lost_uploads(world.aws.s3, bucket, registry)

    assert [o["key"] for o in lost] == ["models/mlp/4/model.onnx", "models/mlp/5/model.onnx"]
    outcomes = [world.handle(upload_event(bucket, o))[0] for o in lost]
    assert [o["status"] for o in outcomes] == ["registered", "rejected"]
    assert world.registry.get_version("mlp", "4").endpoint == "http://endpoint.local/mlp/4"
    assert lost_uploads(world.aws.s3, bucket, registry) == []  # each handled once
    world.aws.s3.put_object(Bucket=bucket, Key="models/mlp/5/model.onnx", Body=good)  # 5 fixed, its event lost too
    assert [o["key"] for o in lost_uploads(world.aws.s3, bucket, registry)] == ["models/mlp/5/model.onnx"]


def test_locally_another_models_upload_registers_while_a_slow_models_is_still_being_validated(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local stack's dispatcher handled every upload on one thread: a model whose sample run took its whole
    limit held every other upload behind it. Here the real updater, a real never-ending ONNX Loop, moto's SQS."""
    from infra.local.uploads import UploadDispatcher

    limit = 6.0
    monkeypatch.setenv("CLIPPER_VALIDATION_TIMEOUT_S", str(limit))
    world.reload()
    queue_url = world.aws.sqs.create_queue(QueueName="local-model-uploads")["QueueUrl"]
    slow, fine = "models/slow/1/model.onnx", "models/other/1/model.onnx"
    for key, data in ((slow, looping_model()), (fine, world.model_bytes("logreg"))):
        world.aws.sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(world.upload(key, data)))
    dispatcher = UploadDispatcher(
        world.aws.sqs, queue_url, lambda event: world.app.handle_event(world.app.updater, event, world.aws.bucket), 1
    )
    started = time.monotonic()
    dispatcher.start()
    try:
        while world.item("VERSION#1", model="other") is None and time.monotonic() - started < limit:
            time.sleep(0.05)
        registered_after = time.monotonic() - started
        # registered, and the slow model's validation is still running: neither registered nor rejected yet
        assert world.item("VERSION#1", model="other") is not None and registered_after < limit - 1
        assert world.item("REJECTED#1", model="slow") is None and world.item("VERSION#1", model="slow") is None
        while world.item("REJECTED#1", model="slow") is None and time.monotonic() - started < limit + 10:
            time.sleep(0.1)
        rejected = world.item("REJECTED#1", model="slow")
        assert rejected is not None and "validation time limit of 6 s" in rejected["reasons"]["L"][0]["S"]
    finally:
        assert dispatcher.finish(timeout_s=limit + 10)
        dispatcher.join(5)  # its last receive (1 s) ends in moto, not after the test's mock


def test_a_deleted_version_is_not_registered_again_from_the_upload_it_came_from(world: World) -> None:
    """Deleting a version leaves its file in the bucket (the user's artifact). The same upload's event delivered
    again, or the local stack's next start finding the file (its restored copy has a new version id: the bytes
    tell), must not bring the version back; a new upload of the version registers it."""
    from infra.local.uploads import lost_uploads

    bucket, good = world.aws.bucket, world.model_bytes()
    event = world.upload("models/mlp/2/model.onnx", good)
    assert world.handle(event)[0]["status"] == "registered"
    assert world.registry.delete_version("mlp", "2") is None
    if world.stacks is not None:  # as delete_versioned_model does after the registry's delete
        world.stacks.delete("mlp", "2")
    assert world.item("DELETED#2") is not None

    again = world.handle(event)[0]  # the event delivered again
    assert again["status"] == "ignored" and "deleted since" in again["reasons"][0], again
    registry = DynamoDBUpdaterRegistry(world.aws.dynamodb, world.aws.registry_table)
    assert lost_uploads(world.aws.s3, bucket, registry) == []
    world.aws.s3.put_object(Bucket=bucket, Key="models/mlp/2/model.onnx", Body=good)  # restored: a new version id
    assert lost_uploads(world.aws.s3, bucket, registry) == []
    assert "2" not in world.registry.model_and_versions("mlp")[1]

    fixed = world.model_bytes("logreg")
    assert world.handle(world.upload("models/mlp/2/model.onnx", fixed))[0]["status"] == "registered"
    assert "2" in world.registry.model_and_versions("mlp")[1]


def _free_rows_model() -> bytes:
    """y = 2x over rows of any length: input [N, None]."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", None])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", None])
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["input", "two"], ["output"])], "g", [x], [y], [two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    return data


def test_a_model_of_free_row_size_linked_to_apps_of_two_shapes_is_recorded_without_one(world: World) -> None:
    """Recorded with the first linked application's shape, the version was then refused for the other by the
    registry's own check (no switching back to it, no canary), though the upload itself had made it active."""
    from dataclasses import replace

    world.registry.put_app(replace(digits_app(), name="wide", input_shape=(100,)))
    world.registry.link("wide", "mlp")
    (outcome,) = world.handle(world.upload(KEY, _free_rows_model()))
    assert outcome["status"] == "registered", outcome
    assert world.registry.get_version("mlp", "2").input_shape is None


def test_of_two_uploads_of_one_version_at_once_the_one_whose_stack_serves_registers(world: World) -> None:
    """Two PUTs of one key are two events, handled at once. The second's stack create found the first's stack and
    took it over, then registered first: the registry described the second file while the stack served the first
    (on SageMaker the endpoint refused the other bytes, or queries shaped for one model went to the other). Now
    the second waits for the stack's own upload: deferred (its event retried), then refused as other bytes."""
    from clipper.models.serving import StackServesAnotherFile

    stacks = InMemoryServingStacks()
    world.serve_with(stacks)
    versioning = {"Status": "Enabled"}  # as the template's model bucket: each PUT an object version of its own
    world.aws.s3.put_bucket_versioning(Bucket=world.aws.bucket, VersioningConfiguration=versioning)
    first = world.upload("models/mlp/2/model.onnx", world.model_bytes("mlp"))
    second = world.upload("models/mlp/2/model.onnx", world.model_bytes("logreg"))
    real_create, seen = stacks.create, []

    def create(*args: Any, **kwargs: Any) -> Any:  # the second upload's whole delivery lands after the first's
        serving = real_create(*args, **kwargs)
        if not seen:
            with pytest.raises(Conflict, match="kept changing") as deferred:  # raised: Lambda delivers it again
                world.handle(second)
            seen.append(deferred.value)
        return serving

    stacks.create = create  # type: ignore[method-assign]
    assert world.handle(first)[0]["status"] == "registered" and seen
    again = world.handle(second)[0]
    assert again["status"] == "rejected" and "already registered with other bytes" in again["reasons"][0], again
    served, _ = stacks.served[("mlp", "2")]
    version = world.item("VERSION#2")
    assert version is not None
    assert served.sha256 == version["sha256"]["S"] == hashlib.sha256(world.model_bytes("mlp")).hexdigest()
    assert version["artifact_version_id"]["S"] == first["Records"][0]["s3"]["object"]["versionId"]  # the first's
    with pytest.raises(StackServesAnotherFile):
        real_create("mlp", "2", ModelArtifact("s3://x", "y", "0" * 64), 1)


def test_an_upload_of_a_deleted_version_whose_stack_is_still_there_is_rejected_with_the_reason(world: World) -> None:
    """A deleted version's stack can stay (another version, added without resources, uses its queue; or its
    delete failed). Since 67cfcf5 a new upload of that version with other bytes is not served from it, but it
    was deferred on every delivery and never registered nor rejected (the event dropped after its retries, or
    replayed every 2 s locally). No registration can come, so it is rejected, saying why. Found by a review
    helper."""
    world.serve_with(InMemoryServingStacks())
    assert world.handle(world.upload("models/mlp/2/model.onnx", world.model_bytes()))[0]["status"] == "registered"
    v2 = world.registry.get_version("mlp", "2")
    world.registry.put_version(model_version("mlp", "3", queue_url=v2.queue_url, endpoint=v2.endpoint), activate=True)
    world.registry.delete_version("mlp", "2")  # its stack kept: version 3 uses its queue
    outcome = world.handle(world.upload("models/mlp/2/model.onnx", world.model_bytes("logreg")))[0]
    assert outcome["status"] == "rejected" and "still serves the file of the deleted version" in outcome["reasons"][0]
    assert world.item("VERSION#2") is None and world.item("REJECTED#2") is not None
