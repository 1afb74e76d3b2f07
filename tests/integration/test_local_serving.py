"""The local stack's serving of uploaded versions (infra/local/serving.py) loads exactly the file the model updater
validated: the S3 object version it read, checked by its sha256 in the model server, even when the same key was
written again since (a second PUT with the same presigned URL). Under moto, with the processes recorded instead of
started."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from clipper.adapters.clock import SystemClock
from clipper.adapters.cloudformation_stacks import CloudFormationModelStacks
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.errors import NotFound
from clipper.models.updater import ServingDefaults, build_model_updater
from infra.local.serving import STOP_GRACE_S, LocalModelServing
from infra.local.supervisor import Child, ChildSpec, Stage
from tests.fakes import FakeClock, digits_app, model_version

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings(
        r"ignore:Tried to parse AWS..CloudWatch..Alarm but it's not supported by moto's CloudFormation implementation"
        ":UserWarning"
    ),
]
TEMPLATE = (Path(__file__).resolve().parents[2] / "infra" / "model-stack.yaml").read_text()
KEY = "models/mlp/2/model.onnx"


class RecordingHost:
    """The local stack's process host, recording the commands instead of starting them."""

    def __init__(self) -> None:
        self.commands: dict[str, list[str]] = {}
        self.stops: list[list[str]] = []  # each stop_children call, in order

    def spawn(self, name: str, cmd: list[str], stage: Stage) -> Child:
        self.commands[name] = cmd
        return Child(ChildSpec(name, cmd, {}, stage), Path("/dev/null"))

    def stop_children(self, names: list[str]) -> None:
        self.stops.append(list(names))
        for name in names:
            self.commands.pop(name, None)

    def port(self, name: str) -> int:
        return 20000 + len(self.commands)

    def wait_ready(self, url: str, child: Child, what: str) -> None:
        return None

    def is_stopping(self) -> bool:
        return self.stopping

    stopping = False


def serving(aws: Any, tmp_path: Path, host: RecordingHost, clock: Any = None) -> LocalModelServing:
    stacks = CloudFormationModelStacks(boto3.client("cloudformation"), "clipper", TEMPLATE, poll_s=0.05)
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    return LocalModelServing(
        stacks, aws.s3, registry, tmp_path, host, slo_ms=100, **({"clock": clock} if clock else {})
    )


def test_the_validated_object_version_is_served_not_a_later_put_to_its_key(aws, demo_models, tmp_path):
    aws.s3.put_bucket_versioning(Bucket=aws.bucket, VersioningConfiguration={"Status": "Enabled"})
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url), activate=True)
    registry.link("digits", "mlp")
    demo = Path(demo_models["out_dir"])
    validated, later = ((demo / m / "1" / "model.onnx").read_bytes() for m in ("mlp", "logreg"))
    first = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=validated)
    aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=later)  # the same URL used again, before the event is handled
    host = RecordingHost()
    local = serving(aws, tmp_path, host)
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, local
    )

    outcome = updater.handle_object(aws.bucket, KEY, len(validated), first["ETag"], first["VersionId"])

    assert outcome.status == "registered"
    digest = hashlib.sha256(validated).hexdigest()
    served = tmp_path / "mlp" / "2" / "model.onnx"
    assert served.read_bytes() == validated
    (endpoint,) = [cmd for name, cmd in host.commands.items() if name.startswith("endpoint-mlp-2")]
    assert endpoint[endpoint.index("--sha256") + 1] == digest  # the server refuses any other file

    # after a restart of the stack, the registry's record pins the same object version
    served.unlink()
    again = RecordingHost()
    assert serving(aws, tmp_path, again).restore() == ["mlp:2"]
    assert served.read_bytes() == validated
    (endpoint,) = [cmd for name, cmd in again.commands.items() if name.startswith("endpoint-mlp-2")]
    assert endpoint[endpoint.index("--sha256") + 1] == digest

    # the local stack's saved state restores objects under new version ids: the copy the updater served it from
    # (validated/<model>/<version>/<sha256>/, which no upload URL names) serves; without it (a version registered
    # before the copies) the object at the upload's key serves if it is the validated file, and is refused if not
    aws.s3.delete_object(Bucket=aws.bucket, Key=KEY, VersionId=first["VersionId"])  # now the key holds `later`
    served.unlink()
    assert serving(aws, tmp_path, RecordingHost()).restore() == ["mlp:2"]
    assert served.read_bytes() == validated
    aws.s3.delete_object(Bucket=aws.bucket, Key=f"validated/mlp/2/{digest}/model.onnx")
    served.unlink()
    assert serving(aws, tmp_path, RecordingHost()).restore() == []
    assert not served.exists()
    aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=validated)
    assert serving(aws, tmp_path, RecordingHost()).restore() == ["mlp:2"]
    assert served.read_bytes() == validated


def test_after_a_restart_the_validated_file_the_state_folder_kept_is_served_when_the_key_holds_another(
    aws, demo_models, tmp_path
):
    """The saved state copies the newest object at each key only: after a second PUT to a registered version's key
    and a restart, the validated bytes were gone from the bucket and the version was not served again. The state
    folder keeps the file served before: it is served when its sha256 is the validated one. Found by a review
    helper."""
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url), activate=True)
    registry.link("digits", "mlp")
    demo = Path(demo_models["out_dir"])
    validated, later = ((demo / m / "1" / "model.onnx").read_bytes() for m in ("mlp", "logreg"))
    first = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=validated)
    local = serving(aws, tmp_path, RecordingHost())
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, local
    )
    assert updater.handle_object(aws.bucket, KEY, len(validated), first["ETag"], None).status == "registered"
    aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=later)  # unversioned: the validated bytes are gone
    again = RecordingHost()
    assert serving(aws, tmp_path, again).restore() == ["mlp:2"]
    assert (tmp_path / "mlp" / "2" / "model.onnx").read_bytes() == validated


def test_a_deleted_versions_processes_stay_while_a_version_that_stays_is_served_through_its_queue(
    aws, demo_models, tmp_path
):
    """A version added without resources of its own is served by the active version's queue and endpoint; the
    admin keeps a deleted version's stack that serves one that stays, but the local stack stopped its processes,
    and the active version answered only defaults (timeouts). Found by a review helper."""
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url), activate=True)
    registry.link("digits", "mlp")
    data = (Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx").read_bytes()
    put = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=data)
    host, clock = RecordingHost(), FakeClock(0.0)
    local = serving(aws, tmp_path, host, clock.now)
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, local
    )
    assert updater.handle_object(aws.bucket, KEY, len(data), put["ETag"], None).status == "registered"
    local.reconcile()  # as every 2 s: seen registered
    registry.set_active_version("mlp", "2")
    v2 = registry.get_version("mlp", "2")
    registry.put_version(model_version("mlp", "3", queue_url=v2.queue_url, endpoint=v2.endpoint), activate=True)
    registry.delete_version("mlp", "2")
    local.reconcile()
    assert any(name.startswith("endpoint-mlp-2") for name in host.commands)  # version 3's queries go there
    registry.delete_version("mlp", "1")
    registry.set_active_version("mlp", "3")
    registry.put_version(model_version("mlp", "4", queue_url=aws.queue_url), activate=True)
    registry.delete_version("mlp", "3")  # no version uses the queue any more: stopped once the frontends follow
    local.reconcile()
    assert any(name.startswith("endpoint-mlp-2") for name in host.commands)  # a stale copy may still route there
    clock.advance(STOP_GRACE_S)
    local.reconcile()
    assert not any(name.startswith("endpoint-mlp-2") for name in host.commands)


def test_a_deleted_version_answers_for_a_grace_while_the_frontends_registry_copies_catch_up(aws, demo_models, tmp_path):
    """A frontend's registry copy may send a query to a version up to 4 s after a switch away from it: deleted at
    once after the switch, its processes stopped within 2 s and those queries timed out with the default (from the
    model lifecycle review). They stop STOP_GRACE_S after reconcile found it deleted."""
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url), activate=True)
    registry.link("digits", "mlp")
    data = (Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx").read_bytes()
    put = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=data)
    host, clock = RecordingHost(), FakeClock(0.0)
    local = serving(aws, tmp_path, host, clock.now)
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, local
    )
    assert updater.handle_object(aws.bucket, KEY, len(data), put["ETag"], None).status == "registered"
    local.reconcile()
    registry.delete_version("mlp", "2")
    for _ in range(2):  # every 2 s, within the grace
        local.reconcile()
        clock.advance(2.0)
        assert any(name.startswith("batcher-mlp-2") for name in host.commands)
    clock.advance(STOP_GRACE_S - 4.0)
    local.reconcile()
    assert host.commands == {}


def test_a_demo_versions_processes_stop_after_its_delete_and_follow_its_replica_count(aws, tmp_path):
    """The demo models' servers and batchers are started by the stack itself, not by an upload: deleted (after a
    second version of the model), they ran on until the stack stopped (a review helper); now adopted, they stop a
    grace after the delete as an upload's do, and scale with the registry's replica count."""
    from infra.local.serving import Replica

    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_version(model_version("tree", "1", queue_url=aws.queue_url), activate=True)
    host, clock = RecordingHost(), FakeClock(0.0)
    host.commands |= {"endpoint-tree": ["server"], "batcher-tree": ["batcher"]}  # as demo.start_models spawns them
    local = serving(aws, tmp_path, host, clock.now)
    local.adopt("tree", "1", aws.queue_url, tmp_path / "tree.onnx", Replica("endpoint-tree", "batcher-tree", "u"))
    local.recreate_stacks()  # after a moto restart: the demo's stacks come back with the service's, not here
    assert boto3.client("cloudformation").list_stacks()["StackSummaries"] == []
    registry.set_model_settings("tree", replicas=2)
    local.reconcile()
    assert {"endpoint-tree", "batcher-tree", "endpoint-tree-1-1", "batcher-tree-1-1"} <= set(host.commands)
    assert aws.queue_url in host.commands["batcher-tree-1-1"]
    registry.put_version(model_version("tree", "2", queue_url=aws.queue_url + "-2"), activate=True)
    registry.delete_version("tree", "1")
    local.reconcile()
    assert "endpoint-tree" in host.commands  # a stale registry copy may still route there
    clock.advance(STOP_GRACE_S)
    local.reconcile()
    assert not any("tree" in name for name in host.commands), host.commands


def test_a_version_deleted_and_uploaded_again_within_the_grace_serves_the_new_file(aws, demo_models, tmp_path):
    """Deleted, then uploaded again with another file before its processes' grace ran out, a version was
    registered for the new file while the old processes (and the old file) answered its queries (a fault hunt)."""
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url), activate=True)
    registry.link("digits", "mlp")
    demo = Path(demo_models["out_dir"])
    first, second = ((demo / m / "1" / "model.onnx").read_bytes() for m in ("mlp", "logreg"))
    host, clock = RecordingHost(), FakeClock(0.0)
    local = serving(aws, tmp_path, host, clock.now)
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, local
    )
    put = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=first)
    assert updater.handle_object(aws.bucket, KEY, len(first), put["ETag"], None).status == "registered"
    local.reconcile()
    registry.delete_version("mlp", "2")  # the admin's delete, in the frontend's process: its stack too
    CloudFormationModelStacks(boto3.client("cloudformation"), "clipper", TEMPLATE, poll_s=0.05).delete("mlp", "2")
    local.reconcile()  # within the grace: the processes still answer
    put = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=second)

    assert updater.handle_object(aws.bucket, KEY, len(second), put["ETag"], None).status == "registered"

    (endpoint,) = [cmd for name, cmd in host.commands.items() if name.startswith("endpoint-mlp-2")]
    assert endpoint[endpoint.index("--sha256") + 1] == hashlib.sha256(second).hexdigest()
    assert (tmp_path / "mlp" / "2" / "model.onnx").read_bytes() == second
    local.reconcile()
    clock.advance(STOP_GRACE_S + 1)
    local.reconcile()  # registered again: served on
    assert any(name.startswith("endpoint-mlp-2") for name in host.commands)


class SlowHost(RecordingHost):
    """A host whose model servers never answer their health check (a model slow to load)."""

    def wait_ready(self, url: str, child: Child, what: str) -> None:
        raise TimeoutError(f"{what} did not answer {url} within 60 s")


def test_a_version_whose_server_does_not_start_is_rejected_and_leaves_nothing(aws, demo_models, tmp_path):
    """A model server that did not answer in time failed the upload with nothing recorded and its stack left
    behind; the event was retried forever and every later upload of the version waited on that stack (a fault
    hunt: 'the registry kept changing', every 2 s). Now the upload is rejected with the reason, its processes and
    stack are gone, and another file can be uploaded as the version."""
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url), activate=True)
    registry.link("digits", "mlp")
    data = (Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx").read_bytes()
    put = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=data)
    host = SlowHost()
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, serving(aws, tmp_path, host)
    )

    outcome = updater.handle_object(aws.bucket, KEY, len(data), put["ETag"], None)

    assert outcome.status == "rejected"
    assert "mlp:2's model server did not start: endpoint server for mlp:2 did not answer" in outcome.reasons[0]
    assert host.commands == {}
    stacks = CloudFormationModelStacks(boto3.client("cloudformation"), "clipper", TEMPLATE, poll_s=0.05)
    with pytest.raises(NotFound):
        stacks.replicas("mlp", "2")  # no stack left
    other = (Path(demo_models["out_dir"]) / "logreg" / "1" / "model.onnx").read_bytes()
    put = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=other)
    fine = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8,
        serving(aws, tmp_path, RecordingHost()),
    )  # fmt: skip
    assert fine.handle_object(aws.bucket, KEY, len(other), put["ETag"], None).status == "registered"


def test_a_scale_down_stops_the_batcher_before_its_model_server(aws, demo_models, tmp_path):
    """Stopped together, a batcher finishing its last batch met its server gone: 2 of 150 queries got their default
    (endpoint unreachable) during a scale-down in a fault hunt."""
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url), activate=True)
    registry.link("digits", "mlp")
    data = (Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx").read_bytes()
    put = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=data)
    host = RecordingHost()
    local = serving(aws, tmp_path, host)
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, local
    )
    assert updater.handle_object(aws.bucket, KEY, len(data), put["ETag"], None).status == "registered"
    local.scale("mlp", "2", 2)
    host.stops.clear()

    local.scale("mlp", "2", 1)

    assert host.stops == [["batcher-mlp-2-1"], ["endpoint-mlp-2-1"]]


def test_a_server_stopped_with_the_stack_or_on_restore_is_not_a_rejection(aws, demo_models, tmp_path):
    """Only an upload's own server failing rejects it: stopped because the stack stops (Ctrl-C during an upload), the
    upload stays to be handled after the restart; a registered version restored at start whose server is slow keeps
    its stack and is started again by reconcile (a review found both rejected or torn down)."""
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1", queue_url=aws.queue_url), activate=True)
    registry.link("digits", "mlp")
    data = (Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx").read_bytes()
    put = aws.s3.put_object(Bucket=aws.bucket, Key=KEY, Body=data)
    host = SlowHost()
    host.stopping = True
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, serving(aws, tmp_path, host)
    )
    with pytest.raises(TimeoutError):
        updater.handle_object(aws.bucket, KEY, len(data), put["ETag"], None)  # the event is handled again later
    assert registry.rejected_uploads("mlp") == {}

    ok = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8,
        serving(aws, tmp_path, RecordingHost()),
    )  # fmt: skip
    assert ok.handle_object(aws.bucket, KEY, len(data), put["ETag"], None).status == "registered"
    slow = SlowHost()
    assert serving(aws, tmp_path, slow).restore() == []  # not served now...
    stacks = CloudFormationModelStacks(boto3.client("cloudformation"), "clipper", TEMPLATE, poll_s=0.05)
    assert stacks.replicas("mlp", "2") == 1  # ...but its stack stays, for reconcile to start it again


def test_reconcile_does_not_wait_for_processes_being_started(aws, tmp_path):
    """The stack's follow thread reconciles, then copies moto's state out: a model server taking a minute to answer
    its health check (an upload's) held the lock reconcile waited on, and no copy was written meanwhile (an
    application created then was lost with a kill -9, a fault hunt found)."""
    local = serving(aws, tmp_path, RecordingHost())
    held, release = threading.Event(), threading.Event()

    def starting() -> None:
        with local._lock:  # as create() holds it through the health checks
            held.set()
            release.wait(10)

    thread = threading.Thread(target=starting)
    thread.start()
    try:
        assert held.wait(5)
        began = time.monotonic()
        local.reconcile()
        assert time.monotonic() - began < 1.0
    finally:
        release.set()
        thread.join()
