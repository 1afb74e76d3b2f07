"""The gate on the local stack's moto server (infra/local/gate.py), on a real moto server process started as the
launcher starts it (``--gated``): closed, every request but moto's own API and the restoring thread's is a 503 the
stack's adapters take as AWS unavailable; open once the launcher says so."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto import server

from clipper.adapters.aws_errors import translate
from clipper.errors import Unavailable
from infra.local import gate, moto_server
from tests.services import REPO, free_port

pytestmark = pytest.mark.integration

TABLE = {
    "TableName": "restored",
    "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
    "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
    "BillingMode": "PAY_PER_REQUEST",
}


@pytest.fixture
def gated_moto() -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "infra.local.moto_server", "-H", "127.0.0.1", "-p", str(port), "--gated"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/moto-api/", timeout=2):  # moto's own API passes a closed gate
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto server did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def session() -> Any:
    return boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")


def client(s: Any, url: str) -> Any:
    return s.client("dynamodb", endpoint_url=url, config=Config(retries={"max_attempts": 1, "mode": "standard"}))


def test_closed_until_opened_and_only_the_restoring_thread_passes(gated_moto):
    plain = client(session(), gated_moto)
    with pytest.raises(ClientError) as closed:
        plain.list_tables()
    assert closed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert isinstance(translate(closed.value, "registry"), Unavailable)  # unavailable, not "no such table"

    launcher = session()
    gate.install(launcher)
    restorer = client(launcher, gated_moto)
    seen_elsewhere: list[int] = []

    def other_thread() -> None:  # another thread of the launcher (the registry follower) waits like the stack
        try:
            restorer.list_tables()
            seen_elsewhere.append(200)
        except ClientError as e:
            seen_elsewhere.append(e.response["ResponseMetadata"]["HTTPStatusCode"])

    with gate.passing():
        restorer.create_table(**TABLE)
        restorer.put_item(TableName="restored", Item={"pk": {"S": "APP#digits"}})
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen_elsewhere == [503]
    with pytest.raises(ClientError):
        restorer.list_tables()  # out of ``passing``: closed again for this thread too
    with pytest.raises(ClientError):
        plain.get_item(TableName="restored", Key={"pk": {"S": "APP#digits"}})

    gate.open_gate(gated_moto)
    assert plain.get_item(TableName="restored", Key={"pk": {"S": "APP#digits"}})["Item"] == {"pk": {"S": "APP#digits"}}
    gate.open_gate(gated_moto)  # idempotent
    assert plain.list_tables()["TableNames"] == ["restored"]


@pytest.mark.parametrize(
    "service, call",
    [
        ("cloudformation", lambda c: c.describe_stacks(StackName="clipper")),  # query protocol, XML errors
        ("s3", lambda c: c.list_objects_v2(Bucket="models")),  # REST XML
        ("sqs", lambda c: c.list_queues()),  # JSON
        ("events", lambda c: c.list_rules()),
    ],
)
def test_every_protocol_takes_a_closed_gate_for_unavailable(gated_moto, service, call):
    s = session()
    c = s.client(service, endpoint_url=gated_moto, config=Config(retries={"max_attempts": 1, "mode": "standard"}))
    with pytest.raises(ClientError) as closed:  # not a parser error (a 500 where the admin API calls it)
        call(c)
    assert isinstance(translate(closed.value, service), Unavailable)


def test_the_gate_opens_on_a_post_only(gated_moto):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(gated_moto + gate.OPEN_PATH, timeout=5)
    assert e.value.code == 405
    with pytest.raises(ClientError):
        client(session(), gated_moto).list_tables()


def test_main_strips_the_flag_and_gates_motos_application() -> None:
    original = server.DomainDispatcherApplication
    seen: list[list[str]] = []
    try:
        moto_server.main(["-H", "127.0.0.1", "-p", "1", "--gated"], run=seen.append)
        app = server.DomainDispatcherApplication(lambda *a, **k: None)
        assert isinstance(app, gate.Gate)
        app.debug = True  # moto's server sets its application's attributes: they reach moto's application
        assert app.app.debug is True
    finally:
        server.DomainDispatcherApplication = original
        moto_server.uninstall()
    assert seen == [["-H", "127.0.0.1", "-p", "1"]]
