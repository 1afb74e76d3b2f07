"""``clipper deploy`` end to end against moto's server (a real presigned PUT), with the model updater run on each
upload as the S3 notification would: the state it prints is the one the API answers (``--no-promote`` with the
model's auto-promote on leaves the version registered, not active). Each uploaded version gets serving stacks of
its own; where there are none (ModelStacks off), a later version is refused up front with the reason."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import pytest

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.adapters.s3_uploads import S3ModelUploads
from clipper.admin.api import create_admin_app
from clipper.admin.service import AdminService
from clipper.cli import main
from clipper.models.serving import ServingStacks
from clipper.models.updater import ServingDefaults, build_model_updater
from tests.fakes import InMemoryServingStacks, digits_app, model_version
from tests.integration.conftest import create_tables
from tests.services import free_port, wait_for_port

pytestmark = pytest.mark.integration
TOKEN = "deploy-token"
BUCKET, TABLE = "clipper-models", "clipper-registry"


def run_updater(s3: Any, updater: Any, stop: threading.Event) -> None:
    """What the bucket's notification does: every new model file goes to the model updater once."""
    seen: set[str] = set()
    while not stop.wait(0.1):
        for obj in s3.list_objects_v2(Bucket=BUCKET, Prefix="models/").get("Contents", []):
            if obj["Key"] not in seen:
                seen.add(obj["Key"])
                head = s3.head_object(Bucket=BUCKET, Key=obj["Key"])
                updater.handle_object(BUCKET, obj["Key"], obj["Size"], head["ETag"], head.get("VersionId"))


@pytest.fixture
def api(aws_env: None) -> Iterator[str]:
    with serving_api(InMemoryServingStacks()) as url:
        yield url


@pytest.fixture
def api_without_stacks(aws_env: None) -> Iterator[str]:
    with serving_api(None) as url:
        yield url


@contextmanager
def serving_api(stacks: ServingStacks | None) -> Iterator[str]:
    """The admin API and the model updater over moto's server, both with ``stacks`` (None: ModelStacks off)."""
    import uvicorn
    from moto.server import ThreadedMotoServer

    moto_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
    moto.start()
    endpoint = f"http://127.0.0.1:{moto_port}"
    reset = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(reset, timeout=30).close()  # moto's state is the process's: start from none
    s3, dynamodb = boto3.client("s3", endpoint_url=endpoint), boto3.client("dynamodb", endpoint_url=endpoint)
    create_tables(dynamodb, TABLE, "clipper-replies")
    s3.create_bucket(Bucket=BUCKET)
    registry = DynamoDBRegistry(dynamodb, TABLE)
    registry.put_app(digits_app())
    registry.put_version(model_version("mlp", "1"), activate=True)
    registry.link("digits", "mlp")
    service = AdminService(registry, uploads=S3ModelUploads(s3, BUCKET), stacks=stacks)
    admin = create_admin_app(service, "token", TOKEN)
    updater = build_model_updater(dynamodb, s3, TABLE, SystemClock(), ServingDefaults(), 10**8, stacks)
    stop = threading.Event()
    watcher = threading.Thread(target=run_updater, args=(s3, updater, stop), daemon=True)
    watcher.start()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(admin, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port(port)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    stop.set()
    thread.join(10)
    watcher.join(10)
    urllib.request.urlopen(reset, timeout=30).close()
    moto.stop()


def test_deploy_prints_the_state_the_api_answers(api, demo_models, capsys):
    model = str(Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx")

    def clipper(*argv: str) -> int:
        return main(["--url", api, "--token", TOKEN, *argv])

    assert clipper("auto-promote", "mlp", "on") == 0
    capsys.readouterr()
    assert clipper("deploy", "mlp", "2", model, "--no-promote", "--timeout", "60") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["is_current_version"] is False
    assert err.splitlines()[-1].startswith("clipper: mlp:2 registered, not active"), err
    assert clipper("model", "mlp", "1") == 0
    assert json.loads(capsys.readouterr().out)["is_current_version"] is True
    assert clipper("deploy", "mlp", "3", model, "--timeout", "60") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["is_current_version"] is True
    assert err.splitlines()[-1].startswith("clipper: mlp:3 active"), err


def test_deploy_a_joblib_file_and_a_version_the_updater_rejects_exits_3(api, tmp_path, capsys):
    import joblib
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)

    def fitted(features: int) -> str:
        x = rng.random((40, features)).astype(np.float32)
        path = tmp_path / f"lr{features}.joblib"
        joblib.dump(LogisticRegression().fit(x, (x[:, 0] > 0.5).astype(int)), path, compress=3)
        np.save(tmp_path / f"rows{features}.npy", x[:2])
        return str(path)

    def clipper(*argv: str) -> int:
        return main(["--url", api, "--token", TOKEN, *argv])

    assert clipper("deploy", "mlp", "5", fitted(64), "--sample-npy", str(tmp_path / "rows64.npy")) == 0
    assert json.loads(capsys.readouterr().out)["is_current_version"] is True
    # 10 features: it converts and passes its sample, but the linked app (digits) takes 64: rejected
    assert clipper("deploy", "mlp", "6", fitted(10), "--sample-npy", str(tmp_path / "rows10.npy")) == 3
    out, err = capsys.readouterr()
    assert out == "" and "clipper: mlp:6 was rejected" in err and "Traceback" not in err
    assert clipper("model", "mlp", "6") == 3


def test_deploy_refuses_a_version_that_would_get_no_serving_resources_of_its_own(
    api_without_stacks, demo_models, capsys
):
    """ModelStacks off: the new file would take mlp:1's queue and endpoint, and mlp:1's model would go on answering
    while deploy reported mlp:2 active. The admin API refuses the upload URL; the CLI says why and exits 2."""
    model = str(Path(demo_models["out_dir"]) / "logreg" / "1" / "model.onnx")

    def clipper(*argv: str) -> int:
        return main(["--url", api_without_stacks, "--token", TOKEN, *argv])

    assert clipper("deploy", "mlp", "2", model, "--timeout", "10") == 2
    out, err = capsys.readouterr()
    assert out == "" and "mlp:2 active" not in err
    assert "clipper: 409 conflict: mlp:2 would have no serving resources of its own" in err
    assert "ModelStacks=on" in err and "add_model" in err and "Traceback" not in err
    assert clipper("model", "mlp", "2") == 2  # nothing registered
    assert clipper("model", "mlp", "1") == 0
    assert json.loads(capsys.readouterr().out)["is_current_version"] is True


def test_an_upload_url_is_refused_for_a_registered_version(api, demo_models, capsys):
    """Versions are immutable: a second file at a registered version's key must never reach its endpoint."""
    model = str(Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx")

    def clipper(*argv: str) -> int:
        return main(["--url", api, "--token", TOKEN, *argv])

    assert clipper("deploy", "mlp", "2", model, "--timeout", "60") == 0
    capsys.readouterr()
    assert clipper("upload-url", "mlp", "2") == 2
    err = capsys.readouterr().err
    assert "409 conflict: mlp:2 is registered already and versions are immutable" in err
    assert "it is the active version" in err and "--start 2" not in err  # a canary of the active one is refused
    assert clipper("upload-url", "mlp", "1") == 2
    assert "start this one as the canary" in capsys.readouterr().err  # an inactive one can be
    assert clipper("deploy", "mlp", "2", model, "--timeout", "10") == 2


def test_upload_url_takes_the_promote_wish(api, capsys):
    """`clipper upload-url --no-promote` signs the wish into the URL (the way through while a canary runs, for an
    auto-promoting model); `--promote` too; without either, the model's auto-promote decides (no header)."""

    def url(*extra: str) -> dict:
        assert main(["--url", api, "--token", TOKEN, "upload-url", "mlp", "7", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    assert url("--no-promote")["headers"]["x-amz-meta-clipper-promote"] == "false"
    assert url("--promote")["headers"]["x-amz-meta-clipper-promote"] == "true"
    assert "x-amz-meta-clipper-promote" not in url()["headers"]
