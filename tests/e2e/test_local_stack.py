"""`make run` as a user runs it, in a terminal: start it, run the curl line it prints, manage it, kill one of its
model servers, upload a model, Ctrl-C; start it again on the same state, with the cache off: what was registered
and uploaded is there, a second `make run` on its port fails at once, feedback is skipped without stopping
anything; Ctrl-C. Two start-ups in all (each costs a minute or two of CPU on a small machine)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from tests.e2e.terminal import TerminalProcess, session_processes
from tests.services import REPO, free_port

pytestmark = pytest.mark.e2e

# -o: make must not rebuild the virtual environment or the demo models from this test (in a git worktree that
# shares them, their prerequisites look newer than they are); the stack is what is tested here.
MAKE_RUN = ["make", "--no-print-directory", "-o", ".venv/.installed", "-o", "build/models/manifest.json", "run"]
STOP_LINES = ["[local-stack] stopping", "[local-stack] all processes stopped"]


def make_run(port: int, state: Path, **env: str) -> TerminalProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CLIPPER_", "REDIS_URL"))}
    return TerminalProcess(MAKE_RUN, {**base, "PORT": str(port), "CLIPPER_LOCAL_STATE_DIR": str(state), **env})


def post(url: str, body: dict[str, Any], timeout_s: float = 10) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def processes(state: Path) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in json.loads((state / "processes.json").read_text())["processes"]}


def eventually(check, what: str, within_s: float = 60.0) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, what
        time.sleep(0.25)


def stopped_cleanly(local: TerminalProcess) -> None:
    lines_before = len(local.lines)
    code = local.ctrl_c()
    after = [line.strip().removeprefix("^C") for line in local.lines[lines_before:]]  # the terminal echoes ^C
    after = [line for line in after if line]
    assert code == 0, f"make run exited {code}:\n{local.output[-3000:]}"
    assert after == STOP_LINES, after  # no "exited with status", "not received", "make: ***"
    assert "make: ***" not in local.output
    eventually(lambda: not session_processes(local.proc.pid), "left running after Ctrl-C", 15)


def test_make_run_supervises_its_processes_keeps_its_state_and_stops_cleanly(demo_models, tmp_path):
    holdout = np.load(Path(demo_models["out_dir"]) / demo_models["dataset"]["holdout"])
    x, y = holdout["X"].astype(np.float32), holdout["y"]
    uploaded = LogisticRegression(max_iter=300).fit(x[100:], (y[100:] + 3) % 10)  # answers unlike the demo's
    state, port = tmp_path / "state", free_port()
    url = f"http://127.0.0.1:{port}"

    local = make_run(port, state)
    try:
        local.wait_ready()
        token = re.search(r"CLIPPER_ADMIN_TOKEN=(\S+)", local.output).group(1)
        # a state folder other than .local-stack is in the export line, for `clipper logs` from anywhere
        exported = rf"export CLIPPER_URL=\S+ CLIPPER_ADMIN_TOKEN=\S+ CLIPPER_LOCAL_STATE_DIR={re.escape(str(state))}\n"
        assert re.search(exported, local.output), local.output[-2000:]
        curl_line_answers(local.output, port)
        background_work_runs_behind_the_queries(state)
        one_feedback_after_an_idle_spell_is_applied(url, state, x[0])
        redis_rewrites_its_file_only_when_the_launcher_asks(state)
        frontend_bounds_its_reads_of_unknown_names(state)
        manage_as_a_user(url, token)
        a_killed_model_server_comes_back_on_its_port(url, state, x[200:260])
        killed_batcher_and_frontend_come_back(url, state, x[260:320])
        register_and_upload(url, token, uploaded, x)
        lines = eventually(lambda: _request_log(state), "no request log")
        assert any(re.search(r" POST /digits/predict 200 [\d.]+ms qid=\d+$", line) for line in lines), lines[-5:]
        stopped_cleanly(local)
    finally:
        local.close()
    assert processes(state)["endpoint-mlp"]["status"] == "stopped"
    an_upload_whose_event_was_lost_at_the_stop(state)

    again = make_run(port, state, CLIPPER_CACHE_ENABLED="false")
    try:
        again.wait_ready()
        assert "state of the last run restored" in again.output and "served again: persist-lr:1" in again.output
        a_second_stack_on_the_port_fails_at_once(port, state)
        rows = x[:12]
        answers = [post(f"{url}/persist/predict", {"input": r.tolist()})[1] for r in rows]
        assert [a["output"] for a in answers] == uploaded.predict(rows).tolist(), answers
        assert not any(a["default"] for a in answers)
        from clipper.client import ClipperConnection

        conn = ClipperConnection(url, re.search(r"CLIPPER_ADMIN_TOKEN=(\S+)", again.output).group(1))
        mlp = conn.inspect_instance()["models"]["mlp"]  # the rollback of the first run stays
        assert mlp["active_version"] == "1" and set(mlp["versions"]) == {"1", "2"}
        eventually(lambda: "2" in conn.inspect_instance()["models"]["persist-lr"]["versions"], "lost upload")
        assert conn.inspect_instance()["models"]["persist-lr"]["active_version"] == "1"  # registered, not promoted
        eventually(lambda: _copied(state, "MODEL#persist-lr", "VERSION#2"), "its registration in the state copy")
        feedback_is_skipped_without_the_cache(url, state, x[0])
        redis_and_moto_come_back(again, url, state, x[300:400], uploaded)
        background_work_runs_behind_the_queries(state)  # moto and redis restarted at theirs, persist-lr's at 5
        a_deleted_demo_versions_processes_stop(conn, state)
        stopped_cleanly(again)
    finally:
        again.close()


def a_deleted_demo_versions_processes_stop(conn: Any, state: Path) -> None:
    """A demo model's version 1 deleted after another version took over (its own queue and server): its server
    and batcher, which the stack started itself, stop a grace after the delete, as an upload's do."""
    assert processes(state)["endpoint-tree"]["status"] == "running"
    conn._call(
        "add_model",
        {
            "model_name": "tree",
            "model_version": "2",
            "input_type": "floats",
            "queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/elsewhere",
            "endpoint": "http://127.0.0.1:9/",
        },
    )
    conn._call("delete_versioned_model", {"model_name": "tree", "model_version": "1"})
    eventually(
        lambda: not {"endpoint-tree", "batcher-tree"} & set(processes(state)),  # stopped: off the list
        "the deleted demo version's processes still run",
        30,
    )


def an_upload_whose_event_was_lost_at_the_stop(state: Path) -> None:
    """A model file that reached the bucket (and the state folder's copy of it) as the stack stopped, its upload
    event not yet handled: the queue of events is not kept, so only the next start can find it."""
    copy = state / "state"
    (copy / "bucket" / "models" / "persist-lr" / "2").mkdir(parents=True)
    data = (copy / "bucket" / "models" / "persist-lr" / "1" / "model.onnx").read_bytes()
    (copy / "bucket" / "models" / "persist-lr" / "2" / "model.onnx").write_bytes(data)
    index = json.loads((copy / "bucket.json").read_text())
    index["models/persist-lr/2/model.onnx"] = index["models/persist-lr/1/model.onnx"]  # same bytes, same ETag
    (copy / "bucket.json").write_text(json.dumps(index))


def _copied(state: Path, pk: str, sk: str) -> bool:
    """Whether the state folder's copy of the registry holds the item (moto restarting restores that copy)."""
    try:
        items = json.loads((state / "state" / "tables" / "RegistryTable.json").read_text())
    except (OSError, ValueError):
        return False
    return any(i["pk"]["S"] == pk and i["sk"]["S"] == sk for i in items)


def curl_line_answers(output: str, port: int) -> None:
    curl = next(line.strip() for line in output.splitlines() if line.strip().startswith("curl "))
    assert f"127.0.0.1:{port}/digits/predict" in curl
    out = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=30, check=True).stdout
    answer = json.loads(out)
    assert answer["default"] is False and isinstance(answer["output"], int), answer
    assert re.search(r"sample query answered: .*'default': False", output)


def background_work_runs_behind_the_queries(state: Path) -> None:
    """On Redis Streams queues, moto's server and the feedback worker run at niceness 19 (no query waits for
    them), the frontend at the launcher's own, and the processes behind it on a query's path 5 above it."""
    own = os.nice(0)

    def niceness(name: str) -> int:
        pid = processes(state)[name]["pid"]
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])

    assert {n: niceness(n) for n in ("moto", "feedback")} == {"moto": 19, "feedback": 19}
    assert niceness("frontend") == own
    running = [n for n, p in processes(state).items() if p["status"] == "running"]
    behind = [n for n in running if n == "redis" or n.startswith(("batcher-", "endpoint-"))]
    assert {"redis", "batcher-mlp", "endpoint-mlp"} <= set(behind), running  # and a deployed version's, if any
    assert {n: niceness(n) for n in behind} == dict.fromkeys(behind, min(19, own + 5))
    # the launcher's own background threads (moto's copy and the registry's follow; the upload dispatch) too,
    # its main thread and the supervisor's (which starts every process) at its own
    launcher = int(Path(f"/proc/{processes(state)['moto']['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1])
    threads: dict[str, list[int]] = {}
    for task in Path(f"/proc/{launcher}/task").iterdir():
        stat = (task / "stat").read_text()
        threads.setdefault((task / "comm").read_text().strip(), []).append(int(stat.rsplit(")", 1)[1].split()[16]))
    # (the upload dispatch's lanes, upload-lane, exist while an upload is handled, at its niceness)
    assert threads["stack-follow"] == [19] and set(threads["upload-dispatch"]) == {19}, threads
    assert set(threads.get("upload-lane", [19])) == {19}, threads
    assert int(Path(f"/proc/{launcher}/stat").read_text().rsplit(")", 1)[1].split()[16]) == own


def redis_rewrites_its_file_only_when_the_launcher_asks(state: Path) -> None:
    """The stack's Redis keeps an append-only file and does not rewrite it by itself (infra.local.aof)."""
    from clipper.adapters.resp import RespClient

    client = RespClient.from_url(json.loads((state / "env.json").read_text())["REDIS_URL"])
    assert client.call("CONFIG", "GET", "appendonly") == [b"appendonly", b"yes"]
    assert client.call("CONFIG", "GET", "auto-aof-rewrite-percentage") == [b"auto-aof-rewrite-percentage", b"0"]


def frontend_bounds_its_reads_of_unknown_names(state: Path) -> None:
    """One process answers every request here: its frontend reads at most 20 unknown names a second before it
    answers them from the registry's list of names (``CLIPPER_UNKNOWN_APP_READS_PER_S``; 0, every name read, on
    AWS)."""
    pid = processes(state)["frontend"]["pid"]
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    assert environ.get("CLIPPER_UNKNOWN_APP_READS_PER_S") == "20"
    assert environ.get("CLIPPER_KEEP_WARM_S") == "60"  # and keeps what queries used fresh while none comes


def manage_as_a_user(url: str, token: str) -> None:
    """The management CLI and Python client against the running stack, with the token it printed."""
    env = dict(os.environ, CLIPPER_URL=url, CLIPPER_ADMIN_TOKEN=token)
    cli = [sys.executable, "-m", "clipper.cli"]
    denied = subprocess.run([*cli, "--token", "wrong", "apps"], env=env, capture_output=True, text=True, timeout=30)
    assert denied.returncode == 2 and "403" in denied.stderr
    apps = json.loads(subprocess.run([*cli, "apps"], env=env, capture_output=True, text=True, check=True).stdout)
    assert {"digits", "digits-exp3", "digits-exp4"} <= set(apps)

    from clipper.client import ClipperConnection

    conn = ClipperConnection(url, token)
    conn.deploy_model("mlp", "2", "floats", [64], labels=["canary"], activate=False)
    assert conn.get_model_info("mlp", "1")["is_current_version"]
    conn.set_model_version("mlp", "2")
    assert conn.get_model_info("mlp", "2")["is_current_version"]
    assert conn.rollback_model("mlp")["active_version"] == "1"
    state = conn.inspect_instance()
    assert state["models"]["mlp"]["active_version"] == "1" and "2" in state["models"]["mlp"]["versions"]


def a_killed_model_server_comes_back_on_its_port(url: str, state: Path, rows: np.ndarray) -> None:
    before = processes(state)["endpoint-mlp"]
    port = json.loads((state / "ports.json").read_text())["endpoint-mlp"]
    os.kill(before["pid"], signal.SIGKILL)
    after = eventually(
        lambda: (p := processes(state)["endpoint-mlp"])["status"] == "running" and p["pid"] != before["pid"] and p,
        "the killed model server was not restarted",
    )
    assert after["restarts"] == 1 and after["last_exit"] == -signal.SIGKILL and after["last_restart"] > 0
    eventually(lambda: _pings(f"http://127.0.0.1:{port}/ping"), "not back on its port (the one the registry names)")
    fresh = iter(rows)  # inputs never asked before: the cache cannot answer them
    eventually(lambda: not post(f"{url}/digits/predict", {"input": next(fresh).tolist()})[1]["default"], "no answer")
    with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
        assert r.status == 200  # the stack kept running
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:  # /metrics reports the restart too
        reported = {p["name"]: p for p in json.loads(r.read())["processes"]}
    assert reported["endpoint-mlp"]["restarts"] == 1
    others = [p for name, p in processes(state).items() if name != "endpoint-mlp"]
    assert all(p["status"] == "running" and p["restarts"] == 0 for p in others), others


def killed_batcher_and_frontend_come_back(url: str, state: Path, rows: np.ndarray) -> None:
    """The batcher starts again on its queue; the frontend on its port."""
    fresh = iter(rows)
    for name in ("batcher-mlp", "frontend"):
        os.kill(processes(state)[name]["pid"], signal.SIGKILL)
        eventually(lambda n=name: processes(state)[n]["restarts"] == 1, f"{name} was not restarted")
        eventually(
            lambda: (
                _pings(f"{url}/health")
                and not post(f"{url}/digits/predict", {"input": next(fresh).tolist()})[1]["default"]
            ),
            f"no answer after {name} restarted",
        )


def register_and_upload(url: str, token: str, model: Any, x: np.ndarray) -> None:
    from clipper.client import ClipperConnection

    conn = ClipperConnection(url, token)
    conn.register_application("persist", "floats", "-1", 2_000_000, input_shape=[64])
    info = conn.deploy_sklearn_model("persist-lr", "1", model, "floats", x[:2])
    assert info["is_current_version"] and info["artifact"].startswith("s3://")
    assert info["artifact_version_id"]  # the bucket keeps versions, as template.yaml declares
    conn.link_model_to_app("persist", "persist-lr")
    rows = x[:4]
    assert [post(f"{url}/persist/predict", {"input": r.tolist()})[1]["output"] for r in rows] == model.predict(
        rows
    ).tolist()


def a_second_stack_on_the_port_fails_at_once(port: int, state: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CLIPPER_"))}
    env.update(PORT=str(port), CLIPPER_LOCAL_STATE_DIR=str(state))
    started = time.monotonic()
    second = subprocess.run(MAKE_RUN, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert second.returncode != 0
    assert f"port {port} is in use" in second.stderr, second.stderr
    assert "moto server" not in second.stdout  # nothing started
    print(f"second make run on a busy port failed in {took:.2f} s")


def one_feedback_after_an_idle_spell_is_applied(url: str, state: Path, row: np.ndarray) -> None:
    """The feedback worker waits in 20 s long polls. Its client gave up after 10 s (botocore's default read
    timeout) and polled again, leaving moto's first poll open; a feedback sent alone then went to the abandoned
    poll (received by no one, invisible for the queue's 3 minutes, and again): accepted, never applied."""
    log = state / "logs" / "feedback.log"
    applied = log.read_text().count(": applied")
    status, answer = post(f"{url}/digits-exp3/predict", {"input": row.tolist()})
    assert status == 200 and not answer["default"], answer
    time.sleep(12)  # idle past the client's old read timeout: a poll of it would have been abandoned by now
    status, body = post(f"{url}/digits-exp3/update", {"input": row.tolist(), "label": 1})
    assert status == 200 and body["accepted"], body
    eventually(lambda: log.read_text().count(": applied") > applied, "the feedback was not applied", within_s=30)


def feedback_is_skipped_without_the_cache(url: str, state: Path, row: np.ndarray) -> None:
    status, body = post(f"{url}/digits-exp3/update", {"input": row.tolist(), "label": 1})
    assert status == 200 and body["accepted"], body
    log = state / "logs" / "feedback.log"
    eventually(lambda: "feedback skipped: the prediction cache is off" in log.read_text(), "feedback not skipped")
    worker = processes(state)["feedback"]
    assert worker["status"] == "running" and worker["restarts"] == 0, worker


def redis_and_moto_come_back(local: TerminalProcess, url: str, state: Path, rows: np.ndarray, model: Any) -> None:
    """redis restarts with its append-only file; moto restarts empty and gets the stack and the last snapshot
    back: the uploaded version answers again."""
    assert any((state / "redis").rglob("*.aof")), "redis keeps no append-only file"
    fresh = iter(rows)
    for name in ("redis", "moto"):
        if name == "moto":
            window = QueriesWhileRestoring(url, "persist", rows[0])  # from before the kill to after the restore
        os.kill(processes(state)[name]["pid"], signal.SIGKILL)
        eventually(lambda n=name: processes(state)[n]["restarts"] == 1, f"{name} was not restarted")
        if name == "moto":
            eventually(lambda: "moto restored" in local.output, "moto was not restored")
            time.sleep(1.0)
            statuses = window.stop()
            # while moto came back empty and got its state back, an existing application was never unknown, and
            # no feedback was taken for one of an unknown application (moto is gated until its state is back);
            # feedback was accepted all along (validated against the frontend's registry copy, queued on Redis)
            assert set(statuses) <= {"predict 200", "update 200"}, statuses
            assert statuses.get("predict 200", 0) > 0, statuses
            feedback_log = (state / "logs" / "feedback.log").read_text()
            assert "unknown_app" not in feedback_log, feedback_log[-3000:]

        def answered(app: str = "digits" if name == "redis" else "persist") -> bool:
            row = next(fresh)
            status, answer = post(f"{url}/{app}/predict", {"input": row.tolist()})
            expected = model.predict(row[None])[0] if app == "persist" else answer.get("output")
            return status == 200 and not answer["default"] and answer["output"] == expected

        eventually(answered, f"no answer after {name} restarted", 30)


class QueriesWhileRestoring:
    """Queries and feedback of one application, back to back on a thread, until ``stop``: the statuses seen."""

    def __init__(self, url: str, app: str, row: np.ndarray) -> None:
        self.url, self.app, self.row = url, app, row
        self.statuses: dict[str, int] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.done.is_set():
            n += 1
            row = self.row.copy()
            row[0] = n * 2.0**-20  # a distinct input each time: no cache answers
            for path, body in (("predict", {"input": row.tolist()}), ("update", {"input": row.tolist(), "label": 0})):
                try:
                    status, _ = post(f"{self.url}/{self.app}/{path}", body, timeout_s=5)
                except OSError:  # this client's own timeout on a busy machine: not what this looks at
                    continue
                self.statuses[f"{path} {status}"] = self.statuses.get(f"{path} {status}", 0) + 1
            time.sleep(0.02)

    def stop(self) -> dict[str, int]:
        self.done.set()
        self.thread.join(timeout=15)
        return self.statuses


def _pings(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _request_log(state: Path) -> list[str]:
    path = state / "requests.log"
    return path.read_text().splitlines() if path.is_file() else []
