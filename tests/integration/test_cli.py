"""The ``clipper`` command against the admin and query APIs over real HTTP (the apps in process, the registry in
moto, the model answered inline by the batcher core): queries, feedback, inspect as a table, the local stack's
logs, and the papercuts (joblib files, rejected versions' exit code, an unreachable API)."""

from __future__ import annotations

import json
import pickle
import re
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.adapters.s3_uploads import S3ModelUploads
from clipper.admin.api import create_admin_app
from clipper.admin.service import AdminService
from clipper.batching.core import Batcher
from clipper.cli import main
from clipper.cli.files import load_estimator
from clipper.client import ClipperConnection
from clipper.client_query import QueryError
from clipper.core.domain import InputType
from clipper.core.registry_cache import CachedRegistry
from clipper.feedback import FeedbackReceiver
from clipper.frontend.api import create_app
from clipper.frontend.query import QueryProcessor
from clipper.models.updater import ServingDefaults, build_model_updater
from infra.local.routing import gateway
from tests.fakes import FakeEndpoint, FakeResolver, InMemoryReplies, ListQueue, digits_app, model_version
from tests.services import free_port, wait_for_port
from tests.unit.test_query_processor import InlineQueue

pytestmark = pytest.mark.integration
TOKEN = "cli-token"


@pytest.fixture
def api(aws, tmp_path) -> Iterator[dict[str, Any]]:
    import uvicorn

    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_app(digits_app(latency_slo_micros=2_000_000))
    registry.put_version(model_version("mlp", "1"), activate=True)
    registry.link("digits", "mlp")
    admin = create_admin_app(AdminService(registry, uploads=S3ModelUploads(aws.s3, aws.bucket)), "token", TOKEN)
    clock, replies, endpoint = SystemClock(), InMemoryReplies(), FakeEndpoint()
    cached = CachedRegistry(registry, clock, ttl_s=0)
    queue = InlineQueue(batcher=Batcher(FakeResolver(endpoint), replies, clock))
    feedback_queue = ListQueue()
    processor = QueryProcessor(cached, queue, replies, clock, lambda: 1 << 16)
    feedback = FeedbackReceiver(cached, feedback_queue, "https://sqs.local/feedback")
    frontend = create_app(processor, 1 << 20, feedback=feedback)

    processes = tmp_path / "processes.json"  # the local stack's gateway lists what the supervisor writes here
    port = free_port()
    routed = gateway(admin, frontend, processes)
    server = uvicorn.Server(uvicorn.Config(routed, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port(port)
    yield {
        "url": f"http://127.0.0.1:{port}",
        "aws": aws,
        "registry": registry,
        "feedback": feedback_queue,
        "processes": processes,
        "endpoint": endpoint,
    }
    server.should_exit = True
    thread.join(10)


def clipper(api: dict[str, Any], *argv: str) -> int:
    return main(["--url", api["url"], "--token", TOKEN, *argv])


def one_hot(i: int) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(64)]


def test_predict_takes_json_a_file_or_npy_rows_and_says_when_the_answer_is_a_default(api, tmp_path, capsys):
    assert clipper(api, "predict", "digits", "--input", json.dumps(one_hot(3))) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["output"] == 3 and answer["default"] is False  # FakeEndpoint answers the hot index
    (tmp_path / "q.json").write_text(json.dumps(one_hot(5)))
    assert clipper(api, "predict", "digits", "--input", f"@{tmp_path / 'q.json'}", "--debug") == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["output"] == 5 and answer["debug"]["model"] == "mlp"
    np.save(tmp_path / "rows.npy", np.array([one_hot(1), one_hot(2)], dtype=np.float32))
    assert clipper(api, "predict", "digits", "--npy", str(tmp_path / "rows.npy")) == 0
    outputs = [p["output"] for p in json.loads(capsys.readouterr().out)["batch_predictions"]]
    assert outputs == [1, 2]
    # a bad input: the API's 400 names the field, exit 2
    assert clipper(api, "predict", "digits", "--input", "[1, 2]") == 2
    assert "input: expected shape [64]" in capsys.readouterr().err
    # the app's declared type is honoured: text for a numeric app is refused before any request
    assert clipper(api, "predict", "digits", "--input", "not json") == 2  # refused, as the API's 400 is
    assert "a JSON list of floats expected" in capsys.readouterr().err
    assert clipper(api, "predict", "digits", "--file", str(tmp_path / "q.json")) == 2  # a file's bytes: not floats
    assert "--file: a file's bytes are an input of a bytes (or strings) application" in capsys.readouterr().err
    # the model fails: the app's default answers, and the command says so (with the query id and the cause)
    api["endpoint"].fail_with = "model server down"
    assert clipper(api, "predict", "digits", "--input", json.dumps(one_hot(4))) == 0
    out, err = capsys.readouterr()
    answer = json.loads(out)
    assert answer["default"] is True and answer["output"] == -1
    assert err == f"clipper: default output for query {answer['query_id']}: {answer['default_explanation']}\n"


def test_update_sends_feedback_and_the_client_has_predict_and_update(api, capsys):
    assert clipper(api, "update", "digits", "--uid", "7", "--input", json.dumps(one_hot(2)), "--label", "2") == 0
    assert json.loads(capsys.readouterr().out)["accepted"] is True
    (sent,) = api["feedback"].sent
    body = json.loads(sent[1])
    assert body["user"] == "7" and body["label"] == 2 and body["app"] == "digits"
    # a uid is sent as typed: "007" is the API's user "007", not 7 (the CLI made an integer of digits)
    assert clipper(api, "update", "digits", "--uid", "007", "--input", json.dumps(one_hot(2)), "--label", "2") == 0
    assert json.loads(api["feedback"].sent[-1][1])["user"] == "007"
    capsys.readouterr()
    conn = ClipperConnection(api["url"], TOKEN)
    assert conn.predict("digits", one_hot(6), uid="u1")["output"] == 6
    assert conn.update("digits", one_hot(6), 6, uid="u1")["accepted"] is True


def test_an_update_that_timed_out_says_so_and_is_sent_again_with_its_key_applied_once(api, monkeypatch):
    """The feedback queue takes the feedback but answers after the client's timeout, at both of the client's tries:
    the client cannot tell whether it was taken. It raises QueryUnanswered (still a QueryError) carrying the key, and
    the feedback sent again with it is the same feedback (one id: the worker applies it once)."""
    import time

    from clipper.client_query import QueryUnanswered
    from clipper.feedback import FeedbackMessage

    monkeypatch.setattr("clipper.client_query.RETRY_PAUSE_S", 0.0)
    queue, send = api["feedback"], api["feedback"].send

    def slow_send(queue_url: str, body: str, timeout: float | None = None) -> None:
        send(queue_url, body)  # taken...
        if len(queue.sent) <= 2:
            time.sleep(0.6)  # ...but answered after the client gave up

    monkeypatch.setattr(queue, "send", slow_send)
    conn = ClipperConnection(api["url"], TOKEN, timeout_s=0.3)
    with pytest.raises(QueryUnanswered) as unanswered:
        conn.update("digits", one_hot(4), 4, uid="u9")
    e = unanswered.value
    assert isinstance(e, QueryError) and e.status == 0 and "within 0.3 s" in str(e)
    assert e.feedback_id is not None
    deadline = time.monotonic() + 5
    while len(queue.sent) < 2 and time.monotonic() < deadline:  # the server's second answer, after the client's
        time.sleep(0.05)
    patient = ClipperConnection(api["url"], TOKEN)  # the calls meant to be answered: a loaded machine's pace
    answer = patient.update("digits", one_hot(4), 4, uid="u9", feedback_id=e.feedback_id)
    ids = {FeedbackMessage.from_json(body).feedback_id for _, body in queue.sent}
    assert len(queue.sent) == 3 and ids == {answer["feedback_id"]}  # three sends, one feedback
    with pytest.raises(QueryUnanswered) as again:  # no API at all: the same kind of error, nothing taken
        ClipperConnection(f"http://127.0.0.1:{free_port()}", TOKEN).predict("digits", one_hot(4))
    assert again.value.feedback_id is None
    with pytest.raises(QueryError) as refused:  # a 400: not sent again, and no key (it was not taken)
        patient.update("digits", [1.0, 2.0], 4)
    assert not isinstance(refused.value, QueryUnanswered) and refused.value.feedback_id is None
    assert len(queue.sent) == 3


def test_inspect_is_a_table_with_the_local_processes_and_json_on_request(api, capsys):
    processes = [
        {"name": "endpoint-mlp", "pid": 41, "status": "running", "restarts": 2, "last_exit": -9, "last_restart": 1.0},
        {"name": "frontend", "pid": 42, "status": "running", "restarts": 0, "last_exit": None, "last_restart": None},
    ]
    api["processes"].write_text(json.dumps({"updated": 1, "processes": processes}))
    assert clipper(api, "inspect") == 0
    table = capsys.readouterr().out
    assert "applications (1)" in table and "models (1)" in table and "mlp:1*" in table
    assert any(line.split()[:4] == ["endpoint-mlp", "41", "running", "2"] for line in table.splitlines())
    assert clipper(api, "inspect", "--json") == 0
    raw = json.loads(capsys.readouterr().out)
    assert raw["processes"] == processes and "digits" in raw["applications"]
    # the gateway's /metrics: the frontend's metrics and the processes
    report = ClipperConnection(api["url"]).get_metrics()
    assert report["processes"] == processes and {"counters", "meters", "histograms"} <= set(report)


def test_inspect_shows_the_processes_of_the_stack_it_asks_not_a_local_folder(api, tmp_path, monkeypatch, capsys):
    """An API whose gateway lists no processes (AWS, or the stack not yet written them) shows none, even with a
    stopped local stack's processes.json in the state folder here."""
    stale = tmp_path / "stale"
    stale.mkdir()
    old = [{"name": "frontend", "pid": 1, "status": "stopped", "restarts": 0}]
    (stale / "processes.json").write_text(json.dumps({"processes": old}))
    monkeypatch.setenv("CLIPPER_LOCAL_STATE_DIR", str(stale))
    monkeypatch.chdir(tmp_path)
    assert clipper(api, "inspect") == 0
    table = capsys.readouterr().out
    assert "applications (1)" in table and "local processes" not in table
    assert clipper(api, "inspect", "--json") == 0
    assert "processes" not in json.loads(capsys.readouterr().out)
    assert "processes" not in ClipperConnection(api["url"]).get_metrics()


def test_logs_lists_the_processes_and_tails_one(tmp_path, capsys):
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    (state / "processes.json").write_text(
        json.dumps({"processes": [{"name": "batcher-mlp", "pid": 1, "status": "restarting", "restarts": 3}]})
    )
    (state / "logs" / "batcher-mlp.log").write_text("".join(f"line {i}\n" for i in range(100)))
    (state / "requests.log").write_text("POST /digits/predict 200 2.1 ms\n")
    assert main(["logs", "--state-dir", str(state)]) == 0
    listing = capsys.readouterr().out
    assert "batcher-mlp" in listing and "restarting" in listing and "requests.log" in listing
    assert main(["logs", "batcher-mlp", "-n", "3", "--state-dir", str(state)]) == 0
    assert capsys.readouterr().out == "line 97\nline 98\nline 99\n"
    assert main(["logs", "requests", "--state-dir", str(state)]) == 0
    assert "POST /digits/predict" in capsys.readouterr().out
    assert main(["logs", "nope", "--state-dir", str(state)]) == 2  # a process that is not there: refused
    assert "processes: batcher-mlp, requests" in capsys.readouterr().err
    assert main(["logs", "--state-dir", str(tmp_path / "none")]) == 1  # no stack there, as no API at a URL
    err = capsys.readouterr().err  # where to name the folder make run used
    assert "no local stack state" in err and "--state-dir" in err and "CLIPPER_LOCAL_STATE_DIR" in err
    assert main(["logs", "batcher-mlp", "--state-dir", str(tmp_path / "none")]) == 2  # one process's, no stack
    err = capsys.readouterr().err
    assert "no local stack state in" in err and "CLIPPER_LOCAL_STATE_DIR" in err and "processes:" not in err


def test_a_joblib_file_loads_with_joblib_and_a_bad_file_is_one_line(tmp_path):
    import joblib
    from sklearn.linear_model import LogisticRegression

    x = np.random.default_rng(0).random((20, 4))
    model = LogisticRegression().fit(x, (x[:, 0] > 0.5).astype(int))
    joblib.dump(model, tmp_path / "m.joblib", compress=3)  # compressed: plain pickle cannot read it
    assert load_estimator(str(tmp_path / "m.joblib")).predict(x).tolist() == model.predict(x).tolist()
    (tmp_path / "m.pkl").write_bytes(pickle.dumps(model))
    assert load_estimator(str(tmp_path / "m.pkl")).coef_.shape == (1, 4)
    (tmp_path / "bad.joblib").write_bytes(b"not a model")
    with pytest.raises(SystemExit) as refused:
        load_estimator(str(tmp_path / "bad.joblib"))
    assert str(refused.value).startswith(f"clipper: cannot load {tmp_path / 'bad.joblib'}: ")
    assert "\n" not in str(refused.value)


def test_a_rejected_version_exits_3_and_an_unreachable_api_is_a_sentence(api, capsys):
    aws = api["aws"]
    key = "models/mlp/9/model.onnx"
    put = aws.s3.put_object(Bucket=aws.bucket, Key=key, Body=b"not a model")
    updater = build_model_updater(aws.dynamodb, aws.s3, aws.registry_table, SystemClock(), ServingDefaults(), 10**8)
    assert updater.handle_object(aws.bucket, key, 11, put["ETag"], put.get("VersionId")).status == "rejected"
    assert clipper(api, "model", "mlp", "9") == 3
    out, err = capsys.readouterr()
    assert json.loads(out)["status"] == "rejected" and "mlp:9 was rejected" in err
    assert clipper(api, "model", "mlp", "1") == 0
    capsys.readouterr()
    nobody = f"http://127.0.0.1:{free_port()}"
    assert main(["--url", nobody, "--token", TOKEN, "apps"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"clipper: no Clipper API answers at {nobody}") and "0 unreachable" not in err
    for argv in (["metrics"], ["predict", "digits", "--input", "[1]"]):
        assert main(["--url", nobody, *argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"clipper: no Clipper API answers at {nobody}") and "Traceback" not in err


def test_every_command_has_a_help_line(capsys):
    from clipper.cli.main import parser

    sub = next(a for a in parser()._actions if a.dest == "command")
    helpless = [a.dest for a in sub._choices_actions if not a.help]
    assert helpless == []
    assert {"batching", "cost", "inspect", "logs", "predict", "update"} <= set(sub.choices)


def test_batching_settings_from_the_command_line(api, capsys):
    assert clipper(api, "batching", "mlp") == 0
    assert json.loads(capsys.readouterr().out)["batching"]["controller"] == "aimd"
    assert clipper(api, "batching", "mlp", "--controller", "fixed", "--batch-size", "8") == 0
    assert json.loads(capsys.readouterr().out)["batching"] == {
        "controller": "fixed",
        "batch_size": 8,
        "max_batch_size": 256,
        "batch_wait_ms": 1.0,
    }
    assert clipper(api, "batching", "mlp", "--controller", "quantile") == 0  # the fixed size is dropped
    assert json.loads(capsys.readouterr().out)["batching"]["batch_size"] == 0
    assert clipper(api, "batching", "mlp", "--batch-size", "0", "--controller", "fixed") == 2
    assert "batch_size" in capsys.readouterr().err
    assert clipper(api, "batching", "mlp", "--batch-size", "4") == 0  # a size alone: the fixed controller's
    assert {"controller": "fixed", "batch_size": 4}.items() <= json.loads(capsys.readouterr().out)["batching"].items()
    # an adaptive bound set before does not refuse a larger fixed size (it was a 400 naming max_batch_size)
    assert clipper(api, "batching", "mlp", "--controller", "aimd", "--max-batch-size", "2") == 0
    capsys.readouterr()
    assert clipper(api, "batching", "mlp", "--batch-size", "16") == 0
    assert {"controller": "fixed", "batch_size": 16}.items() <= json.loads(capsys.readouterr().out)["batching"].items()
    assert clipper(api, "batching", "mlp", "--batch-size", "32", "--max-batch-size", "8") == 2  # both asked: refused


def test_set_policy_turns_default_when_unsure_on_and_off(api, capsys):
    def app() -> dict[str, Any]:
        return json.loads(capsys.readouterr().out)

    on = ["set-policy", "digits", "exp4", "--confidence-threshold", "0.9", "--default-when-unsure"]
    assert clipper(api, *on) == 0
    turned_on = app()
    assert (turned_on["confidence_threshold"], turned_on["default_when_unsure"]) == (0.9, True)
    assert clipper(api, "set-policy", "digits", "exp4", "--confidence-threshold", "0.75") == 0  # omitted: kept
    kept = app()
    assert (kept["confidence_threshold"], kept["default_when_unsure"]) == (0.75, True)
    assert clipper(api, "set-policy", "digits", "exp4", "--no-default-when-unsure") == 0  # it could not be undone
    assert app()["default_when_unsure"] is False


def test_a_reader_that_goes_away_gets_no_traceback(tmp_path):
    import subprocess
    import sys

    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    listed = [{"name": f"batcher-{i}", "pid": i, "status": "running", "restarts": 0} for i in range(50_000)]
    (state / "processes.json").write_text(json.dumps({"processes": listed}))
    done = subprocess.run(
        f"{sys.executable} -m clipper.cli logs --state-dir {state} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.startswith("batcher-0 ") and "Traceback" not in done.stderr, done.stderr[-500:]


def test_predict_reads_numbers_by_the_apps_declared_shape(api, tmp_path, capsys):
    """A [2, 3] app: a nested list of that shape is one input (not a batch of its rows), an .npy of such
    inputs is a batch; a bytes app takes --input as base64 text."""
    assert clipper(api, "register-app", "grid", "floats", "-1", "2000000", "--input-shape", "2,3") == 0
    api["registry"].put_version(model_version("gridnet", "1", input_shape=(2, 3)), activate=True)
    assert clipper(api, "link", "grid", "gridnet") == 0
    capsys.readouterr()
    assert clipper(api, "predict", "grid", "--input", "[[0, 0, 0], [0, 5, 0]]") == 0
    assert json.loads(capsys.readouterr().out)["output"] == 4  # the flat argmax of one [2, 3] input
    grids = np.zeros((3, 2, 3), dtype=np.float32)
    for i in range(3):
        grids[i].flat[i + 1] = 1.0
    np.save(tmp_path / "grids.npy", grids)
    assert clipper(api, "predict", "grid", "--npy", str(tmp_path / "grids.npy")) == 0
    assert [p["output"] for p in json.loads(capsys.readouterr().out)["batch_predictions"]] == [1, 2, 3]
    np.save(tmp_path / "one.npy", grids[2])
    assert clipper(api, "predict", "grid", "--npy", str(tmp_path / "one.npy")) == 0
    assert json.loads(capsys.readouterr().out)["output"] == 3
    # the Python client reads a numpy array by the declared shape too (asked once of the admin API)
    conn = ClipperConnection(api["url"], TOKEN)
    assert conn.predict("grid", grids[1])["output"] == 2
    assert [p["output"] for p in conn.predict("grid", grids)["batch_predictions"]] == [1, 2, 3]
    # and so does update: an array of the app's 2-D shape is its one input (it was refused as a batch)
    assert conn.update("grid", grids[1], 2)["accepted"] is True
    # an array of another 2-D shape is one input the API refuses naming input (it was sent as input_batch)
    with pytest.raises(QueryError, match=r"input: expected shape \[2, 3\].*got shape \[3, 2\]"):
        conn.predict("grid", np.zeros((3, 2), dtype=np.float32))
    # a bytes app: --input is base64 text as the query API takes it, --file a file's bytes
    assert clipper(api, "register-app", "blobs", "bytes", "-1", "2000000") == 0
    api["registry"].put_version(
        model_version("blobnet", "1", input_type=InputType.BYTES, input_shape=None), activate=True
    )
    assert clipper(api, "link", "blobs", "blobnet") == 0
    capsys.readouterr()
    assert clipper(api, "predict", "blobs", "--input", "aGVsbG8=") == 0
    assert json.loads(capsys.readouterr().out)["output"] == 5  # FakeEndpoint: the length of b"hello"
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02")
    assert clipper(api, "predict", "blobs", "--file", str(tmp_path / "blob.bin")) == 0
    assert json.loads(capsys.readouterr().out)["output"] == 3


def _ctrl_c_default() -> None:
    """In the child: Ctrl-C as a terminal delivers it, even when the suite was started in the background by a
    non-interactive shell (which starts its background jobs with SIGINT ignored, and children inherit that)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_logs_follow_prints_what_is_appended(tmp_path):
    import queue
    import signal
    import subprocess
    import sys

    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    log = state / "logs" / "batcher-mlp.log"
    log.write_text("old 1\nold 2\n")
    follow = subprocess.Popen(
        [sys.executable, "-m", "clipper.cli", "logs", "batcher-mlp", "-f", "-n", "1", "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_default,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in follow.stdout or []], daemon=True).start()
    try:
        assert lines.get(timeout=30) == "old 2\n"
        with log.open("a") as f:
            f.write("new 1\nnew 2\n")
        assert [lines.get(timeout=30), lines.get(timeout=30)] == ["new 1\n", "new 2\n"]
        follow.send_signal(signal.SIGINT)  # Ctrl-C: the way to stop following, so no traceback and status 0
        assert follow.wait(30) == 0
        assert "Traceback" not in (follow.stderr.read() if follow.stderr else "")
    finally:
        follow.kill()
        follow.wait(10)


def test_a_bad_npy_file_is_one_line(api, tmp_path, capsys):
    (tmp_path / "garbage.npy").write_bytes(b"not an array")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for bad in ("garbage.npy", "objects.npy", "missing.npy"):
        assert clipper(api, "predict", "digits", "--npy", str(tmp_path / bad)) == 2  # refused, like a 4xx
        err = capsys.readouterr().err
        assert err.startswith(f"clipper: --npy: cannot load {tmp_path / bad} as a .npy array: ")
        assert err.count("\n") == 1
    (tmp_path / "m.pkl").write_bytes(b"")
    garbage = str(tmp_path / "garbage.npy")
    assert clipper(api, "deploy", "lr", "1", str(tmp_path / "m.pkl"), "--sample-npy", garbage) == 2
    assert "--sample-npy: cannot load" in capsys.readouterr().err


def test_ctrl_c_while_waiting_for_an_answer_is_no_traceback():
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        waiting = subprocess.Popen(
            [sys.executable, "-m", "clipper.cli", "--url", url, "predict", "digits", "--input", "[1]"],
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_ctrl_c_default,
        )
        try:
            silent.settimeout(60)
            accepted, _ = silent.accept()  # connected: it waits for the answer now
            with accepted:
                waiting.send_signal(signal.SIGINT)
                assert waiting.wait(30) == 130
            err = waiting.stderr.read() if waiting.stderr else ""
            assert err == "clipper: interrupted\n", err
        finally:
            waiting.kill()
            waiting.wait(10)


def test_output_to_a_reader_that_has_gone_ends_quietly(api, monkeypatch, capsys):
    """`clipper inspect | head -1`: the pipe closes under the output; a BrokenPipeError is no file error."""
    import os
    import sys

    read, write = os.pipe()
    os.close(read)
    closed = os.fdopen(write, "w", buffering=1)  # each line written at once, as to a terminal or pipe reader
    monkeypatch.setattr(sys, "stdout", closed)
    try:
        assert clipper(api, "inspect") == 1
    finally:
        monkeypatch.undo()
    assert "Broken pipe" not in capsys.readouterr().err


def test_update_of_an_npy_of_several_rows_is_refused_before_any_request(api, tmp_path, capsys):
    """It exited 1 ("no API at the URL") for what is a refused argument (2)."""
    np.save(tmp_path / "rows.npy", np.array([one_hot(1), one_hot(2), one_hot(3)], dtype=np.float32))
    assert clipper(api, "update", "digits", "--npy", str(tmp_path / "rows.npy"), "--label", "1") == 2
    assert "one input per feedback; --npy holds 3 inputs" in capsys.readouterr().err
    assert api["feedback"].sent == []


def test_update_whose_feedback_was_not_queued_names_the_option_to_send_it_again_with(api, capsys):
    """The server's 503 names the JSON field ("feedback_id"); on the command line it is --feedback-id."""
    api["feedback"].down = True  # a 503: unavailable, try again (1), not refused (2)
    assert clipper(api, "update", "digits", "--input", json.dumps(one_hot(2)), "--label", "2") == 1
    err = capsys.readouterr().err
    key = re.search(r"--feedback-id (\S+) to have it applied once", err)
    assert key is not None, err
    api["feedback"].down = False
    assert (
        clipper(api, "update", "digits", "--input", json.dumps(one_hot(2)), "--label", "2", "--feedback-id", key[1])
        == 0
    )


def test_a_server_that_never_answers_or_answers_no_json_is_one_line_exit_1(capsys):
    """A port that accepts and never answers was a bare "timed out" with exit 2 (refused); a page that is not
    JSON (a proxy's, another server's) a JSONDecodeError traceback. Both are "not Clipper's API answering": 1."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from clipper.client import AdminError, ClipperConnection

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts (the kernel's backlog), never reads nor answers

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._page()

        def do_POST(self) -> None:
            self._page()

        def _page(self) -> None:
            body = b"<html>sign in</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    page = HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    try:
        silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        page_url = f"http://127.0.0.1:{page.server_address[1]}"
        with pytest.raises(AdminError, match=f"no answer from {silent_url} within 0.5 s"):
            ClipperConnection(silent_url, token=TOKEN, timeout_s=0.5).get_all_apps()
        with pytest.raises(AdminError, match=r"answered 200 with no JSON .*sign in"):
            ClipperConnection(page_url, token=TOKEN).get_all_apps()
        capsys.readouterr()
        assert main(["--url", page_url, "--token", TOKEN, "apps"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("clipper: 200 not JSON:") and "Traceback" not in err
    finally:
        page.shutdown()
        silent.close()


def test_the_clients_stop_versioned_models_deletes_nothing_when_an_active_version_is_listed(api):
    """The active version is refused by the API; the versions listed before it were deleted first."""
    from clipper.client import AdminError

    conn = ClipperConnection(api["url"], TOKEN)
    conn.deploy_model("mlp", "2", "floats", activate=False)
    with pytest.raises(AdminError, match="got the active mlp:1; nothing was deleted"):
        conn.stop_versioned_models({"mlp": ["2", "1"]})
    assert sorted(conn.get_all_models()) == ["mlp:1", "mlp:2"]
    conn.stop_versioned_models({"mlp": ["2"]})
    assert conn.get_all_models() == ["mlp:1"]


def test_bad_option_values_are_named_in_one_line(api, tmp_path, capsys):
    """--input-shape a,b said "invalid <lambda> value"; logs -n -3 printed nothing and exited 0; --input
    @missing.json did not name --input."""
    for argv in (
        ["register-app", "s1", "floats", "-1", "1000", "--input-shape", "a,b"],
        ["register-app", "s1", "floats", "-1", "1000", "--input-shape", "64,0"],
        ["logs", "frontend", "-n", "-3"],
    ):
        with pytest.raises(SystemExit) as e:
            clipper(api, *argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "<lambda>" not in err and ("--input-shape" in err or "--lines" in err), err
    missing = tmp_path / "missing.json"
    assert clipper(api, "predict", "digits", "--input", f"@{missing}") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"clipper: --input @{missing}: No such file") and len(err.splitlines()) == 1, err
    # text rows for a string model (the deployers convert numeric models): a traceback before, now one line, 2
    texts, model = tmp_path / "texts.npy", tmp_path / "text.onnx"
    np.save(texts, np.array([["good movie"], ["bad"]]))
    model.write_bytes(b"not read: the sample is checked first")
    assert clipper(api, "deploy", "txt", "1", str(model), "--sample-npy", str(texts)) == 2
    err = capsys.readouterr().err
    assert err.startswith("clipper: --sample-npy: the sample input is not floats rows") and len(err.splitlines()) == 1


def test_the_client_takes_versions_as_clippers_examples_give_them(api):
    """Clipper's examples give versions as numbers (clipper_admin converts them): here each was a 400
    "model_version: Input should be a valid string"; a container image in deploy_model's 4th place was a 400
    about input_shape, a parameter the caller never named."""
    conn = ClipperConnection(api["url"], TOKEN)
    conn.deploy_model("mlp", 2, "floats", activate=False)
    assert conn.get_model_info("mlp", 2)["model_version"] == "2"
    conn.set_model_version("mlp", 2)
    conn.set_model_version("mlp", 1)
    conn.stop_versioned_models({"mlp": [2]})
    assert conn.get_all_models() == ["mlp:1"]
    with pytest.raises(TypeError, match="models here are ONNX files"):
        conn.deploy_model("m5", "1", "floats", "clipper/python-closure-container:latest")  # type: ignore[arg-type]


def test_the_client_has_clipper_admins_names_for_what_it_does(api):
    """A script ported from clipper_admin to this client met AttributeErrors for names clipper_admin has."""
    conn = ClipperConnection(api["url"], TOKEN)
    assert conn.get_current_model_version("mlp") == "1"
    conn.register_model("mlp", 2, "floats", batch_size=8)  # active at once, on mlp's resources
    assert conn.get_current_model_version("mlp") == "2"
    assert conn.get_model_batching("mlp")["batching"]["batch_size"] == 8
    replicas = conn.get_all_model_replicas(verbose=True)
    assert replicas and {r["model_name"] for r in replicas} == {"mlp"}
    first = replicas[0]
    assert conn.get_model_replica_info(first["model_name"], first["model_version"], first["model_replica_id"])
    conn.register_application("gone", "floats", "-1", 100000)
    conn.delete_application("gone")
    assert "gone" not in conn.get_all_apps()
