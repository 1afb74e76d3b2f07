"""Model settings, upload URLs, rejections and per-version serving stacks under moto: the CloudFormation
adapter creating infra/model-stack.yaml in moto's CloudFormation, the admin operations that scale and retire
those stacks, and the updater giving each uploaded version its own stack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
from fastapi.testclient import TestClient

from clipper.adapters.clock import SystemClock
from clipper.adapters.cloudformation_stacks import CloudFormationModelStacks
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.adapters.s3_uploads import S3ModelUploads
from clipper.admin.api import create_admin_app
from clipper.admin.service import AdminService
from clipper.errors import NotFound
from clipper.models.serving import ModelArtifact, stack_model_name
from clipper.models.updater import ServingDefaults, build_model_updater
from tests.fakes import digits_app

pytestmark = [
    pytest.mark.integration,
    # moto's CloudFormation skips the stack's CloudWatch alarm (it exists on AWS only) with a warning
    pytest.mark.filterwarnings(
        r"ignore:Tried to parse AWS..CloudWatch..Alarm but it's not supported by moto's CloudFormation implementation"
        ":UserWarning"
    ),
]

TEMPLATE = (Path(__file__).resolve().parents[2] / "infra" / "model-stack.yaml").read_text()
TOKEN = "s3cret"


@pytest.fixture
def stacks(aws) -> CloudFormationModelStacks:
    return CloudFormationModelStacks(
        boto3.client("cloudformation"),
        "clipper",
        TEMPLATE,
        endpoint="http://models.local/{model}/{version}",
        poll_s=0.05,
    )


@pytest.fixture
def world(aws, stacks, demo_models):
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app())
    service = AdminService(registry, None, S3ModelUploads(aws.s3, aws.bucket), stacks)
    client = TestClient(create_admin_app(service, "token", TOKEN))
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    updater = build_model_updater(
        aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8, stacks
    )
    return {"aws": aws, "registry": registry, "admin": client, "updater": updater, "demo": Path(demo_models["out_dir"])}


def upload(world: dict[str, Any], model: str, version: str, data: bytes) -> Any:
    aws = world["aws"]
    key = f"models/{model}/{version}/model.onnx"
    put = aws.s3.put_object(Bucket=aws.bucket, Key=key, Body=data)
    return world["updater"].handle_object(aws.bucket, key, len(data), put["ETag"], put.get("VersionId"))


def ok(resp, status=200):
    assert resp.status_code == status, resp.text
    return resp.json()


def test_stack_model_names_fit_the_template_and_keep_versions_apart():
    assert stack_model_name("mlp", "2") == "mlp-v2"
    assert stack_model_name("mlp", "1.0") != stack_model_name("mlp", "1_0")
    long = stack_model_name("a-very-long-model-name-for-this", "2024-01-01.rc1")
    assert len(long) <= 30 and long[0].isalnum() and long[-1].isalnum() and "--" not in long


def test_a_version_stack_is_created_once_scaled_and_deleted(aws, stacks):
    serving = stacks.create("mlp", "2", ModelArtifact("s3://clipper-models/models/mlp/2/model.onnx"), replicas=1)
    attrs = aws.sqs.get_queue_attributes(QueueUrl=serving.queue_url, AttributeNames=["RedrivePolicy"])
    assert "clipper-model-mlp-v2-dlq" in attrs["Attributes"]["RedrivePolicy"]  # its own dead-letter queue
    assert serving.endpoint == "http://models.local/mlp/2"
    assert (
        stacks.create("mlp", "2", ModelArtifact("s3://clipper-models/models/mlp/2/model.onnx"), replicas=1) == serving
    )

    stacks.scale("mlp", "2", 3)
    assert stacks.replicas("mlp", "2") == 3
    stacks.scale("mlp", "2", 3)  # nothing to change: no update is asked for
    stacks.delete("mlp", "2")
    with pytest.raises(NotFound):
        stacks.replicas("mlp", "2")


def test_each_uploaded_version_gets_its_own_serving_stack(world):
    demo = world["demo"]
    first = upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    second = upload(world, "mlp", "2", (demo / "logreg" / "1" / "model.onnx").read_bytes())
    assert (first.status, first.promoted, second.status, second.promoted) == ("registered", True, "registered", False)
    head, versions = world["registry"].model_and_versions("mlp")
    assert head.active_version == "1"
    assert versions["1"].queue_url != versions["2"].queue_url
    assert versions["2"].queue_url.endswith("clipper-model-mlp-v2") and versions["2"].endpoint.endswith("/mlp/2")


def test_replicas_are_recorded_and_applied_to_each_version_stack(world, stacks):
    demo = world["demo"]
    admin = world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    assert ok(admin.post("/admin/get_num_replicas", json={"model_name": "mlp"}))["num_replicas"] == 1
    done = ok(admin.post("/admin/set_num_replicas", json={"model_name": "mlp", "num_replicas": 2}))
    assert done["scaled_versions"] == ["1"] and done["unmanaged_versions"] == []
    assert stacks.replicas("mlp", "1") == 2
    assert ok(admin.post("/admin/get_num_replicas", json={"model_name": "mlp"}))["num_replicas"] == 2
    upload(world, "mlp", "2", (demo / "logreg" / "1" / "model.onnx").read_bytes())
    assert stacks.replicas("mlp", "2") == 2  # a later version is created with the model's replicas
    assert ok(admin.post("/admin/get_state", json={}))["models"]["mlp"]["num_replicas"] == 2

    assert admin.post("/admin/set_num_replicas", json={"model_name": "mlp", "num_replicas": 0}).status_code == 400
    assert admin.post("/admin/set_num_replicas", json={"model_name": "nope", "num_replicas": 2}).status_code == 404


def test_a_change_refused_while_a_version_stack_updates_changes_nothing(world, stacks, monkeypatch):
    """An update takes minutes and CloudFormation queues none: a 409 then, and the model's replicas and batching
    as they were (the registry used to say the new count while some versions' stacks kept the old one)."""
    demo, admin = world["demo"], world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    upload(world, "mlp", "2", (demo / "logreg" / "1" / "model.onnx").read_bytes())
    describe = stacks._describe
    updating = stacks.stack_name("mlp", "2")

    def mid_update(name):
        stack = describe(name)
        return {**stack, "StackStatus": "UPDATE_IN_PROGRESS"} if name == updating else stack

    monkeypatch.setattr(stacks, "_describe", mid_update)
    refused = admin.post("/admin/set_num_replicas", json={"model_name": "mlp", "num_replicas": 3})
    assert refused.status_code == 409 and "mlp:2 is UPDATE_IN_PROGRESS; nothing was changed" in refused.text
    assert ok(admin.post("/admin/get_num_replicas", json={"model_name": "mlp"}))["num_replicas"] == 1
    assert (stacks.replicas("mlp", "1"), stacks.replicas("mlp", "2")) == (1, 1)
    before = ok(admin.post("/admin/get_model_batching", json={"model_name": "mlp"}))["batching"]
    batching = {"model_name": "mlp", "controller": "fixed", "batch_size": 4}
    assert admin.post("/admin/set_model_batching", json=batching).status_code == 409
    assert ok(admin.post("/admin/get_model_batching", json={"model_name": "mlp"}))["batching"] == before

    monkeypatch.setattr(stacks, "_describe", describe)  # the update ended
    done = ok(admin.post("/admin/set_num_replicas", json={"model_name": "mlp", "num_replicas": 3}))
    assert done["scaled_versions"] == ["1", "2"]
    assert (stacks.replicas("mlp", "1"), stacks.replicas("mlp", "2")) == (3, 3)


def test_a_version_uploaded_after_set_model_batching_gets_the_models_lambda_mapping(world, stacks):
    """set_model_batching maps the model's settings onto its versions' Lambda batchers; a version uploaded later
    is created with them too, not with the template's defaults (BatchSize 10, no window)."""
    from clipper.adapters.cloudformation_stacks import _parameters

    demo, admin = world["demo"], world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    first = _parameters(stacks._describe(stacks.stack_name("mlp", "1")))
    assert first.get("BatchSize", "10") == "10"  # never set: the template's default
    body = {"model_name": "mlp", "controller": "fixed", "batch_size": 64, "batch_wait_ms": 1000}
    ok(admin.post("/admin/set_model_batching", json=body))
    upload(world, "mlp", "2", (demo / "logreg" / "1" / "model.onnx").read_bytes())
    second = _parameters(stacks._describe(stacks.stack_name("mlp", "2")))
    assert (second["BatchSize"], second["MaximumBatchingWindowInSeconds"]) == ("64", "1")


def test_deleting_a_version_deletes_its_stack(world, stacks):
    demo = world["demo"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    upload(world, "mlp", "2", (demo / "logreg" / "1" / "model.onnx").read_bytes())
    ok(world["admin"].post("/admin/stop_inactive_model_versions", json={"model_name": "mlp"}))
    with pytest.raises(NotFound):
        stacks.replicas("mlp", "2")
    assert stacks.replicas("mlp", "1") == 1


def test_auto_promote_is_a_model_setting(world):
    demo, admin = world["demo"], world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    assert ok(admin.post("/admin/set_auto_promote", json={"model_name": "mlp", "auto_promote": True}))["auto_promote"]
    outcome = upload(world, "mlp", "2", (demo / "logreg" / "1" / "model.onnx").read_bytes())
    assert outcome.promoted and ok(admin.post("/admin/get_state", json={}))["models"]["mlp"]["auto_promote"] is True
    assert ok(admin.post("/admin/get_model", json={"model_name": "mlp", "model_version": "2"}))["is_current_version"]
    assert ok(admin.post("/admin/rollback_model", json={"model_name": "mlp"}))["active_version"] == "1"
    bad = admin.post("/admin/set_auto_promote", json={"model_name": "nope", "auto_promote": True})
    assert bad.status_code == 404


def test_a_rejected_upload_is_visible_in_get_model_and_get_state(world):
    demo, admin = world["demo"], world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    outcome = upload(world, "mlp", "3", b"not an onnx file")
    assert outcome.status == "rejected"
    info = ok(admin.post("/admin/get_model", json={"model_name": "mlp", "model_version": "3"}))
    assert info["status"] == "rejected" and "not a loadable ONNX model" in info["reasons"][0]
    state = ok(admin.post("/admin/get_state", json={}))["models"]["mlp"]
    assert state["rejected"]["3"]["reasons"] == info["reasons"] and "3" not in state["versions"]
    registered = ok(admin.post("/admin/get_model", json={"model_name": "mlp", "model_version": "1"}))
    assert (
        registered["status"] == "registered" and registered["artifact"] == "s3://clipper-models/models/mlp/1/model.onnx"
    )
    assert admin.post("/admin/get_model", json={"model_name": "mlp", "model_version": "9"}).status_code == 404
    # switching to it, trying it as a canary or deleting it: a 404 that says it was rejected, and why
    for op, body in (
        ("set_model_version", {"model_name": "mlp", "model_version": "3"}),
        ("start_canary", {"model_name": "mlp", "model_version": "3", "share_percent": 10}),
        ("delete_versioned_model", {"model_name": "mlp", "model_version": "3"}),
    ):
        refused = admin.post(f"/admin/{op}", json=body)
        cause = refused.json()["cause"]
        assert refused.status_code == 404 and "mlp:3' does not exist (its upload was rejected: the file is not" in cause
    never = admin.post("/admin/set_model_version", json={"model_name": "mlp", "model_version": "9"})
    assert never.status_code == 404 and never.json()["cause"] == "model version 'mlp:9' does not exist"
    # a new model's first upload rejected: no model item, yet get_model says why (found by a new user: a 404, and
    # a deploy waited its whole timeout to say "not registered (is the model updater running?)")
    assert upload(world, "fresh", "1", b"not an onnx file").status == "rejected"
    first = ok(admin.post("/admin/get_model", json={"model_name": "fresh", "model_version": "1"}))
    assert first["status"] == "rejected" and "not a loadable ONNX model" in first["reasons"][0]
    assert admin.post("/admin/get_model", json={"model_name": "fresh", "model_version": "2"}).status_code == 404


def test_an_upload_url_puts_the_model_where_the_updater_reads_it(world):
    aws, admin = world["aws"], world["admin"]
    target = ok(admin.post("/admin/get_upload_url", json={"model_name": "mlp", "model_version": "7"}))
    assert target["key"] == "models/mlp/7/model.onnx" and target["method"] == "PUT"
    data = (world["demo"] / "mlp" / "1" / "model.onnx").read_bytes()
    assert requests.put(target["url"], data=data, timeout=10).status_code == 200
    assert aws.s3.get_object(Bucket=aws.bucket, Key=target["key"])["Body"].read() == data
    bad = admin.post("/admin/get_upload_url", json={"model_name": "../x", "model_version": "7"})
    assert bad.status_code == 400 and "model_name" in bad.json()["cause"]


def test_the_reverse_links_follow_link_unlink_and_app_deletion(world):
    registry = world["registry"]
    demo = world["demo"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    registry.link("digits", "mlp")
    assert registry.apps_linked_to("mlp") == ["digits"] and registry.model_record("mlp").linked_apps == ["digits"]
    registry.unlink("digits", "mlp")
    assert registry.apps_linked_to("mlp") == []
    registry.link("digits", "mlp")
    registry.delete_app("digits")
    assert registry.apps_linked_to("mlp") == []


def test_stacks_are_created_and_updated_with_the_service_role_when_given(aws):
    cfn = boto3.client("cloudformation")
    role = "arn:aws:iam::123456789012:role/clipper-model-stacks"
    stacks = CloudFormationModelStacks(cfn, "clipper", TEMPLATE, poll_s=0.05, role_arn=role)
    stacks.create("mlp", "2", ModelArtifact("s3://clipper-models/models/mlp/2/model.onnx"), replicas=1)
    assert cfn.describe_stacks(StackName=stacks.stack_name("mlp", "2"))["Stacks"][0]["RoleARN"] == role
    stacks.scale("mlp", "2", 2)
    stack = cfn.describe_stacks(StackName=stacks.stack_name("mlp", "2"))["Stacks"][0]
    assert stack["RoleARN"] == role and stacks.replicas("mlp", "2") == 2


def test_a_stack_that_still_serves_a_kept_version_is_not_deleted(world, stacks):
    # v2 is added without resources of its own: it is served by v1's stack (queue, endpoint)
    demo, admin = world["demo"], world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    body = {"model_name": "mlp", "model_version": "2", "input_type": "floats", "input_shape": [64]}
    ok(admin.post("/admin/add_model", json=body))
    _, versions = world["registry"].model_and_versions("mlp")
    assert versions["2"].queue_url == versions["1"].queue_url

    ok(admin.post("/admin/delete_versioned_model", json={"model_name": "mlp", "model_version": "1"}))

    assert stacks.replicas("mlp", "1") == 1  # still there: the active version's queries go through it
    world["aws"].sqs.get_queue_attributes(QueueUrl=versions["2"].queue_url)


def test_scaling_changes_the_replicas_and_nothing_else(aws, stacks):
    stacks.create("mlp", "1", ModelArtifact("s3://clipper-models/models/mlp/1/model.onnx"), replicas=1)
    # the functions' shared parameters changed since (a new deployment of the service stack)
    later = CloudFormationModelStacks(
        boto3.client("cloudformation"), "clipper", TEMPLATE, {"MaxReceiveCount": "7"}, poll_s=0.05
    )

    later.scale("mlp", "1", 2)

    (stack,) = boto3.client("cloudformation").describe_stacks(StackName=stacks.stack_name("mlp", "1"))["Stacks"]
    values = {p["ParameterKey"]: p["ParameterValue"] for p in stack["Parameters"]}
    assert values["InitialInstanceCount"] == "2"
    assert values["MaxReceiveCount"] == "5"  # what the version was created with (the template's default)


def test_upload_urls_without_a_model_bucket_are_unavailable_not_a_bad_request(world, stacks):
    service = AdminService(world["registry"], None, None, stacks)
    admin = TestClient(create_admin_app(service, "token", TOKEN))
    admin.headers["Authorization"] = f"Bearer {TOKEN}"

    resp = admin.post("/admin/get_upload_url", json={"model_name": "mlp", "model_version": "7"})

    assert resp.status_code == 503 and "CLIPPER_MODEL_BUCKET" in resp.text


def test_an_explicit_promote_of_the_uploader_wins_over_auto_promote(world):
    """deploy --no-promote / promote=False: the upload URL signs the wish in as object metadata, and the updater
    follows it over the model's auto_promote (and promote=True activates without auto_promote)."""
    demo, admin, aws = world["demo"], world["admin"], world["aws"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    ok(admin.post("/admin/set_auto_promote", json={"model_name": "mlp", "auto_promote": True}))
    target = ok(admin.post("/admin/get_upload_url", json={"model_name": "mlp", "model_version": "2", "promote": False}))
    octets = {"Content-Type": "application/octet-stream"}  # the PUT's: another hung the local stack's S3
    assert target["headers"] == {**octets, "x-amz-meta-clipper-promote": "false"}
    assert "x-amz-meta-clipper-promote" in target["url"]  # signed in: a PUT without the header is refused by S3

    def put(version: str, wish: str, source: str) -> Any:
        key = f"models/mlp/{version}/model.onnx"
        data = (demo / source / "1" / "model.onnx").read_bytes()
        done = aws.s3.put_object(Bucket=aws.bucket, Key=key, Body=data, Metadata={"clipper-promote": wish})
        return world["updater"].handle_object(aws.bucket, key, len(data), done["ETag"], done.get("VersionId"))

    assert put("2", "false", "logreg").promoted is False
    assert world["registry"].model_and_versions("mlp")[0].active_version == "1"
    ok(admin.post("/admin/set_auto_promote", json={"model_name": "mlp", "auto_promote": False}))
    assert put("3", "true", "logreg").promoted is True
    assert world["registry"].model_and_versions("mlp")[0].active_version == "3"
    plain = ok(admin.post("/admin/get_upload_url", json={"model_name": "mlp", "model_version": "4"}))
    assert plain["headers"] == octets


def test_an_upload_url_to_make_a_version_active_is_refused_while_a_canary_runs(world):
    """The version would be registered and left inactive (the canary's evidence decides meanwhile): the API said
    200 where the client's deploy said 409. An upload that asks for no activation is served."""
    demo, admin = world["demo"], world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    ok(admin.post("/admin/set_auto_promote", json={"model_name": "mlp", "auto_promote": False}))
    upload(world, "mlp", "2", (demo / "logreg" / "1" / "model.onnx").read_bytes())
    ok(admin.post("/admin/start_canary", json={"model_name": "mlp", "model_version": "2", "share_percent": 10}))

    def url(**extra: Any) -> Any:
        return admin.post("/admin/get_upload_url", json={"model_name": "mlp", "model_version": "3", **extra})

    refused = ok(url(promote=True), 409)
    assert "canary running (mlp:2" in refused["cause"] and "promote false" in refused["cause"]
    ok(url(promote=False))
    ok(url())  # not asked, and auto_promote off: it stays inactive as asked
    ok(admin.post("/admin/set_auto_promote", json={"model_name": "mlp", "auto_promote": True}))
    assert "canary running" in ok(url(), 409)["cause"]  # auto_promote would make it active
    ok(url(promote=False))
    ok(admin.post("/admin/abort_canary", json={"model_name": "mlp"}))
    ok(url(promote=True))


def _validated(world: dict[str, Any], model: str, version: str) -> list[str]:
    aws = world["aws"]
    listed = aws.s3.list_objects_v2(Bucket=aws.bucket, Prefix=f"validated/{model}/{version}/")
    return [o["Key"] for o in listed.get("Contents", [])]


def test_a_deleted_versions_validated_copy_goes_with_its_stack(world, stacks):
    """The copy of the file a version's stack served (the model updater's, under validated/) is storage no one
    reads once the version and its stack are deleted; the kept version's copy stays."""
    demo, admin = world["demo"], world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    upload(world, "mlp", "2", (demo / "logreg" / "1" / "model.onnx").read_bytes())
    upload(world, "mlp", "3", (demo / "tree" / "1" / "model.onnx").read_bytes())
    assert all(_validated(world, "mlp", v) for v in ("1", "2", "3"))
    ok(admin.post("/admin/delete_versioned_model", json={"model_name": "mlp", "model_version": "2"}))
    assert _validated(world, "mlp", "2") == [] and _validated(world, "mlp", "1") and _validated(world, "mlp", "3")
    ok(admin.post("/admin/stop_inactive_model_versions", json={"model_name": "mlp"}))
    assert _validated(world, "mlp", "3") == [] and _validated(world, "mlp", "1")
    # the version uploaded again (another file: this test bucket is not versioned, so the same bytes would be
    # the deleted upload's ETag, which the updater ignores) is validated and copied anew
    assert upload(world, "mlp", "2", (demo / "tree" / "1" / "model.onnx").read_bytes()).status == "registered"
    assert _validated(world, "mlp", "2")


def test_a_stack_kept_for_another_version_keeps_its_validated_copy(world, stacks):
    demo, admin = world["demo"], world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    body = {"model_name": "mlp", "model_version": "2", "input_type": "floats", "input_shape": [64]}
    ok(admin.post("/admin/add_model", json=body))  # served by v1's stack, which serves v1's file
    ok(admin.post("/admin/delete_versioned_model", json={"model_name": "mlp", "model_version": "1"}))
    assert _validated(world, "mlp", "1")


def test_a_validated_copy_that_cannot_be_deleted_does_not_fail_the_delete(world, stacks, caplog):
    """The registry item and the stack are gone: a copy left behind is storage, named in a warning."""
    from clipper.errors import Unavailable

    demo, admin = world["demo"], world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    upload(world, "mlp", "2", (demo / "logreg" / "1" / "model.onnx").read_bytes())
    uploads = S3ModelUploads.delete_prefix

    def refused(self, prefix):
        raise Unavailable("s3: AccessDenied")

    S3ModelUploads.delete_prefix = refused  # type: ignore[method-assign]
    try:
        with caplog.at_level("WARNING", logger="clipper.admin.service"):
            ok(admin.post("/admin/delete_versioned_model", json={"model_name": "mlp", "model_version": "2"}))
    finally:
        S3ModelUploads.delete_prefix = uploads  # type: ignore[method-assign]
    assert "validated/mlp/2/" in caplog.text and _validated(world, "mlp", "2")


def test_a_version_uploaded_again_while_its_stack_is_deleted_keeps_its_new_copy(world, stacks):
    """The updater handles an upload of the version (another file) between the registry's delete and the copy's:
    only the deleted registration's copy (its file's digest) goes; the new one's stack serves its own. Found by a
    review helper (the whole version's prefix was deleted)."""
    demo, admin = world["demo"], world["admin"]
    upload(world, "mlp", "1", (demo / "mlp" / "1" / "model.onnx").read_bytes())
    upload(world, "mlp", "2", (demo / "logreg" / "1" / "model.onnx").read_bytes())
    old = _validated(world, "mlp", "2")
    real_delete, state = type(stacks).delete, {}

    def delete_then_upload_again(self, model, version):
        real_delete(self, model, version)
        if version == "2" and not state:
            state["outcome"] = upload(world, "mlp", "2", (demo / "tree" / "1" / "model.onnx").read_bytes())
            state["copy"] = [k for k in _validated(world, "mlp", "2") if k not in old]

    type(stacks).delete = delete_then_upload_again  # type: ignore[method-assign]
    try:
        ok(admin.post("/admin/delete_versioned_model", json={"model_name": "mlp", "model_version": "2"}))
    finally:
        type(stacks).delete = real_delete  # type: ignore[method-assign]
    assert state["outcome"].status == "registered" and state["copy"]
    assert "2" in world["registry"].model_and_versions("mlp")[1]
    assert _validated(world, "mlp", "2") == state["copy"]  # the deleted one's gone, the new one's kept
