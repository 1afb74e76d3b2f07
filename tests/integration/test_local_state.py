"""What the local stack keeps across restarts (``infra/local/state.py``), under moto: the registry, the bandit
states and the uploaded models copied out of one emulator and put back into a fresh one; only what changed is
written; a copy taken while moto was being restored is never written; ports are kept."""

from __future__ import annotations

import json
import socket
import time

import boto3
import pytest
from moto import mock_aws

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.adapters.dynamodb_selection import MARKER_TTL_S
from clipper.core.domain import Application, InputType, ModelVersion
from infra.local.cfn import with_physical_names
from infra.local.state import Ports, Snapshot, repoint_endpoints
from tests.integration.conftest import aws_env  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

TABLES = {"RegistryTable": "clipper-RegistryTable", "SelectionTable": "clipper-SelectionTable"}


def create_stack(dynamodb, s3) -> None:
    for name in TABLES.values():
        dynamodb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
    s3.create_bucket(Bucket="clipper-modelbucket")


def fill(dynamodb, s3) -> DynamoDBRegistry:
    registry = DynamoDBRegistry(dynamodb, TABLES["RegistryTable"])
    registry.put_app(Application("persist", InputType.FLOATS, "-1", 2_000_000, (64,), policy="exp3"))
    registry.link("persist", "plr")
    mv = ModelVersion("plr", "1", InputType.FLOATS, "https://sqs/q", "http://127.0.0.1:40001", (64,))
    registry.put_version(mv, activate=True)
    for i in range(30):  # more than one batch write
        item = {"pk": {"S": f"persist#{i}"}, "sk": {"S": "STATE"}, "weights": {"M": {"plr": {"N": "1.5"}}}}
        dynamodb.put_item(TableName=TABLES["SelectionTable"], Item=item)
        marker = {"pk": {"S": f"persist#{i}"}, "sk": {"S": f"FEEDBACK#{i}"}, "expires_at": {"N": "1"}}
        dynamodb.put_item(TableName=TABLES["SelectionTable"], Item=marker)  # applied long ago: not kept
    for i in range(5):  # applied a minute ago: kept, so a retry of it across a restart is applied once
        recent = str(int(time.time()) + MARKER_TTL_S - 60)
        marker = {"pk": {"S": f"persist#{i}"}, "sk": {"S": f"FEEDBACK#recent{i}"}, "expires_at": {"N": recent}}
        dynamodb.put_item(TableName=TABLES["SelectionTable"], Item=marker)
    s3.put_object(Bucket="clipper-modelbucket", Key="models/plr/1/model.onnx", Body=b"onnx bytes")
    s3.put_object(Bucket="clipper-modelbucket", Key="claims/abc", Body=b"transient claim check")
    return registry


def scan(dynamodb, table):
    return sorted(dynamodb.scan(TableName=table)["Items"], key=lambda i: (i["pk"]["S"], i["sk"]["S"]))


def test_the_state_of_one_emulator_comes_back_in_a_fresh_one(aws_env, tmp_path):  # noqa: F811
    with mock_aws():
        dynamodb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_stack(dynamodb, s3)
        fill(dynamodb, s3)
        snapshot = Snapshot(tmp_path, dynamodb, s3, TABLES, "clipper-modelbucket")
        assert sorted(snapshot.take()) == ["RegistryTable", "SelectionTable", "bucket"]
        assert snapshot.take() == []  # nothing changed, nothing written
        before = {t: scan(dynamodb, t) for t in TABLES.values()}
        kept = ("STATE", "FEEDBACK#recent")
        before[TABLES["SelectionTable"]] = [
            i for i in before[TABLES["SelectionTable"]] if i["sk"]["S"].startswith(kept)
        ]
    assert (tmp_path / "bucket" / "models" / "plr" / "1" / "model.onnx").read_bytes() == b"onnx bytes"
    assert not (tmp_path / "bucket" / "claims").exists()  # only models/

    with mock_aws():  # the next start: a new, empty emulator
        dynamodb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_stack(dynamodb, s3)
        snapshot = Snapshot(tmp_path, dynamodb, s3, TABLES, "clipper-modelbucket")
        assert snapshot.exists
        assert snapshot.restore() == {"RegistryTable": 5, "SelectionTable": 35, "objects": 1}
        assert {t: scan(dynamodb, t) for t in TABLES.values()} == before
        registry = DynamoDBRegistry(dynamodb, TABLES["RegistryTable"])
        assert registry.get_app("persist").policy == "exp3" and registry.linked_models("persist") == ["plr"]
        body = s3.get_object(Bucket="clipper-modelbucket", Key="models/plr/1/model.onnx")["Body"].read()
        assert body == b"onnx bytes"
        assert snapshot.take() == []  # what was restored is what is on disk

        # a change is written; a deleted object leaves the copy
        registry.set_model_settings("plr", replicas=2)
        s3.delete_object(Bucket="clipper-modelbucket", Key="models/plr/1/model.onnx")
        assert sorted(snapshot.take()) == ["RegistryTable", "bucket"]
        assert json.loads((tmp_path / "bucket.json").read_text()) == {}


def test_a_copy_taken_while_moto_was_being_restored_is_not_written(aws_env, tmp_path):  # noqa: F811
    with mock_aws():
        dynamodb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_stack(dynamodb, s3)
        fill(dynamodb, s3)
        snapshot = Snapshot(tmp_path, dynamodb, s3, TABLES, "clipper-modelbucket")
        snapshot.take()
        good = (tmp_path / "tables" / "RegistryTable.json").read_bytes()
    with mock_aws():
        dynamodb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_stack(dynamodb, s3)  # moto restarted: the stack exists again, empty
        empty = Snapshot(tmp_path, dynamodb, s3, TABLES, "clipper-modelbucket")
        assert empty.take(still_valid=lambda: False) == []
        assert (tmp_path / "tables" / "RegistryTable.json").read_bytes() == good
        assert (tmp_path / "bucket" / "models" / "plr" / "1" / "model.onnx").is_file()


def test_endpoints_of_servers_that_moved_are_repointed(aws_env):  # noqa: F811
    with mock_aws():
        dynamodb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_stack(dynamodb, s3)
        registry = fill(dynamodb, s3)
        other = ModelVersion("plr", "2", InputType.FLOATS, "https://sqs/q", "http://127.0.0.1:40001", (64,))
        registry.put_version(other)  # added with the resources of version 1
        moved = {"http://127.0.0.1:40001": "http://127.0.0.1:40002"}
        assert repoint_endpoints(dynamodb, TABLES["RegistryTable"], moved) == 2
        versions = registry.model_record("plr").versions
        assert {v.endpoint for v in versions.values()} == {"http://127.0.0.1:40002"}
        assert versions["1"].queue_url == "https://sqs/q"


def test_a_process_gets_its_port_of_the_last_run_unless_it_is_taken(tmp_path):
    ports = Ports(tmp_path / "ports.json")
    a, b = ports.assign("endpoint-mlp"), ports.assign("moto")
    assert a != b
    again = Ports(tmp_path / "ports.json")
    assert again.assign("endpoint-mlp") == a and again.moved == {}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", b))
        busy.listen()
        moved = again.assign("moto")
    assert moved != b and again.moved == {"moto": (b, moved)}
    assert again.moved_urls() == {f"http://127.0.0.1:{b}": f"http://127.0.0.1:{moved}"}


def test_local_resources_are_named_after_their_logical_ids():
    template = {
        "Resources": {
            "RegistryTable": {"Type": "AWS::DynamoDB::Table", "Properties": {}},
            "ModelBucket": {"Type": "AWS::S3::Bucket", "Properties": {}},
            "FeedbackQueue": {"Type": "AWS::SQS::Queue", "Properties": {}},
            "Ordered": {"Type": "AWS::SQS::Queue", "Properties": {"FifoQueue": True}},
            "Named": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": "mine"}},
            "Function": {"Type": "AWS::Lambda::Function", "Properties": {}},
        }
    }
    named = with_physical_names(template, "clipper")["Resources"]
    assert named["RegistryTable"]["Properties"]["TableName"] == "clipper-RegistryTable"
    assert named["ModelBucket"]["Properties"]["BucketName"] == "clipper-modelbucket"
    assert named["FeedbackQueue"]["Properties"]["QueueName"] == "clipper-FeedbackQueue"
    assert named["Ordered"]["Properties"]["QueueName"] == "clipper-Ordered.fifo"
    assert named["Named"]["Properties"]["QueueName"] == "mine"
    assert named["Function"]["Properties"] == {}
    assert template["Resources"]["RegistryTable"]["Properties"] == {}  # a copy


def test_at_most_the_newest_recent_markers_are_kept(aws_env, tmp_path, monkeypatch):  # noqa: F811
    import infra.local.state as state

    monkeypatch.setattr(state, "MAX_RECENT_MARKERS", 2)
    with mock_aws():
        dynamodb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_stack(dynamodb, s3)
        now = int(time.time()) + MARKER_TTL_S
        for i, ago in enumerate((30, 10, 20, 5000)):  # the last written before the hour kept
            marker = {"pk": {"S": "app/x"}, "sk": {"S": f"FEEDBACK#{i}"}, "expires_at": {"N": str(now - ago)}}
            dynamodb.put_item(TableName=TABLES["SelectionTable"], Item=marker)
        Snapshot(tmp_path, dynamodb, s3, TABLES, "clipper-modelbucket").take()
    with mock_aws():
        dynamodb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        create_stack(dynamodb, s3)
        Snapshot(tmp_path, dynamodb, s3, TABLES, "clipper-modelbucket").restore()
        kept = sorted(i["sk"]["S"] for i in scan(dynamodb, TABLES["SelectionTable"]))
    assert kept == ["FEEDBACK#1", "FEEDBACK#2"]  # the two newest of the last hour
