"""The local stack's supervisor: a fake launcher and a fake clock drive its restarts, back-off,
crash-loop report, stops and status file; one test starts real children (their niceness)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from infra.local.backoff import Backoff, RestartRecord, describe_exit
from infra.local.supervisor import ChildSpec, Stage, Supervisor

pytestmark = pytest.mark.unit


class FakeProcess:
    def __init__(self, pid: int, ignores_term: bool = False) -> None:
        self.pid = pid
        self.code: int | None = None
        self.signals: list[int] = []
        self.ignores_term = ignores_term
        self.on_wait = None  # what happens while the stopping thread waits (the supervisor's thread polls)

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if not self.ignores_term:
            self.code = -sig

    def wait(self, timeout: float | None = None) -> int:
        if self.on_wait is not None:
            self.on_wait()
        if self.code is None:
            raise subprocess.TimeoutExpired("fake", timeout or 0)
        return self.code

    def kill(self) -> None:
        self.code = -signal.SIGKILL


class World:
    """A supervisor over fake processes and a clock that moves only when told."""

    def __init__(self, tmp_path, backoff: Backoff | None = None) -> None:
        self.now = 1000.0
        self.launched: list[tuple[str, FakeProcess]] = []
        self.status_file = tmp_path / "processes.json"
        self.sup = Supervisor(
            tmp_path / "logs",
            self.status_file,
            backoff=backoff or Backoff(first_s=0.5, factor=2, max_s=8, stable_s=30, report_after=3),
            launch=self.launch,
            clock=lambda: self.now,
            wall_clock=lambda: 1_700_000_000 + self.now,
            heartbeat_s=5,
        )

    def launch(self, spec: ChildSpec, log_path) -> FakeProcess:
        proc = FakeProcess(100 + len(self.launched), ignores_term=spec.name == "stubborn")
        self.launched.append((spec.name, proc))
        return proc

    def start(self, name: str, stage: Stage = Stage.SERVERS, **hooks) -> None:
        self.sup.start(ChildSpec(name, ["serve", name], {}, stage, **hooks))

    def current(self, name: str) -> FakeProcess:
        return [p for n, p in self.launched if n == name][-1]

    def launches(self, name: str) -> int:
        return sum(n == name for n, _ in self.launched)

    def advance(self, seconds: float, step: float = 0.125) -> None:  # exact in binary: no drift
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = min(end, self.now + step)
            self.sup.poll()

    def status(self, name: str) -> dict:
        processes = json.loads(self.status_file.read_text())["processes"]
        return next(p for p in processes if p["name"] == name)


def test_backoff_doubles_from_the_first_delay_up_to_its_cap():
    b = Backoff(first_s=0.5, factor=2, max_s=30)
    assert [b.delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def test_a_crash_after_a_stable_run_counts_as_the_first_again():
    b = Backoff(first_s=0.5, factor=2, max_s=30, stable_s=30, report_after=3)
    record = RestartRecord()
    assert [record.exited(1, 0.2, b) for _ in range(3)] == [0.5, 1, 2]
    assert record.crash_looping(b)
    assert record.exited(-9, 45.0, b) == 0.5 and record.crashes == 1 and not record.crash_looping(b)
    assert record.last_exit == -9


def test_exit_descriptions_name_the_signal():
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with status 3"


def test_a_killed_child_comes_back_with_the_same_command_after_its_backoff(tmp_path):
    w = World(tmp_path)
    w.start("endpoint-mlp")
    w.start("frontend", Stage.FRONTEND)
    first = w.current("endpoint-mlp")
    first.code = -9
    w.sup.poll()
    assert w.status("endpoint-mlp")["status"] == "restarting" and w.status("endpoint-mlp")["pid"] is None
    w.advance(0.4)
    assert w.launches("endpoint-mlp") == 1, "restarted before its back-off"
    w.advance(0.2)
    assert w.launches("endpoint-mlp") == 2
    child = w.sup.get("endpoint-mlp")
    assert child.proc is w.current("endpoint-mlp") and child.spec.cmd == ["serve", "endpoint-mlp"]
    status = w.status("endpoint-mlp")
    assert status == {
        "name": "endpoint-mlp",
        "pid": w.current("endpoint-mlp").pid,
        "status": "running",
        "restarts": 1,
        "last_exit": -9,
        "last_restart": pytest.approx(1_700_000_000 + w.now, abs=0.2),
    }
    assert w.status("frontend")["restarts"] == 0 and w.launches("frontend") == 1
    assert "restarted after it was killed by SIGKILL" in (tmp_path / "logs" / "endpoint-mlp.log").read_text()


def test_a_child_that_keeps_crashing_is_reported_and_never_restarted_in_a_hot_loop(tmp_path, caplog):
    w = World(tmp_path)
    w.start("batcher-bad")
    waits = []
    for _ in range(8):
        w.current("batcher-bad").code = 1  # dies at once, every time
        w.sup.poll()
        died_at, before = w.now, w.launches("batcher-bad")
        while w.launches("batcher-bad") == before:
            w.advance(0.125)
        waits.append(w.now - died_at)
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]  # doubling, then the cap
    assert "batcher-bad keeps crashing" in caplog.text and "logs/batcher-bad.log" in caplog.text
    assert w.status("batcher-bad")["restarts"] == 8 and w.status("batcher-bad")["last_exit"] == 1


def test_hooks_run_when_a_child_exits_and_once_it_is_back(tmp_path):
    w = World(tmp_path)
    seen = []
    w.start(
        "moto", Stage.MOTO, on_exit=lambda code: seen.append(("exit", code)), on_restart=lambda: seen.append("back")
    )
    w.current("moto").code = -9
    w.sup.poll()
    assert seen == [("exit", -9)]
    w.advance(0.6)
    for _ in range(100):  # on_restart runs in a thread of its own
        if "back" in seen:
            break
        time.sleep(0.01)
    assert seen == [("exit", -9), "back"]


def test_stopped_children_are_not_restarted_and_stop_by_stage(tmp_path):
    w = World(tmp_path)
    for name, stage in [("frontend", Stage.FRONTEND), ("batcher-a", Stage.BATCHERS), ("moto", Stage.MOTO)]:
        w.start(name, stage)
    w.sup.stop_stage(Stage.FRONTEND)
    assert w.current("frontend").signals == [signal.SIGTERM] and w.current("moto").signals == []
    w.advance(5)
    assert w.launches("frontend") == 1 and w.status("frontend")["status"] == "stopped"
    assert w.status("batcher-a")["status"] == "running"


def test_a_child_exiting_because_it_was_asked_to_is_not_restarted(tmp_path):
    w = World(tmp_path)
    w.start("batcher-a", Stage.BATCHERS)
    proc = w.current("batcher-a")
    proc.on_wait = lambda: w.advance(2)  # the supervisor polls while the stop waits for the exit
    w.sup.stop(["batcher-a"])
    w.advance(2)
    assert w.launches("batcher-a") == 1 and w.status("batcher-a")["status"] == "stopped"


def test_a_child_that_ignores_sigterm_is_killed(tmp_path, caplog):
    w = World(tmp_path)
    w.start("stubborn")
    proc = w.current("stubborn")
    w.sup.stop(["stubborn"], timeout_s=0)
    assert proc.signals == [signal.SIGTERM] and proc.code == -signal.SIGKILL
    assert "did not stop" in caplog.text


def test_forgotten_children_leave_the_status_file(tmp_path):
    w = World(tmp_path)
    w.start("endpoint-m-2-0")
    w.start("endpoint-m-1-0")
    w.sup.stop(["endpoint-m-2-0"], forget=True)
    w.sup.poll()
    names = [p["name"] for p in json.loads(w.status_file.read_text())["processes"]]
    assert names == ["endpoint-m-1-0"]
    w.start("endpoint-m-2-0")  # its name can be used again
    assert w.launches("endpoint-m-2-0") == 2


def test_the_status_file_is_written_on_change_and_on_a_heartbeat(tmp_path):
    w = World(tmp_path)
    w.start("redis", Stage.REDIS)
    w.sup.poll()
    first = json.loads(w.status_file.read_text())["updated"]
    w.advance(2)
    assert json.loads(w.status_file.read_text())["updated"] == first  # nothing changed
    w.advance(4)
    assert json.loads(w.status_file.read_text())["updated"] > first  # heartbeat


def test_the_same_name_twice_is_refused(tmp_path):
    w = World(tmp_path)
    w.start("feedback", Stage.WORKERS)
    with pytest.raises(ValueError, match="already supervised"):
        w.start("feedback", Stage.WORKERS)


def _niceness(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[16])  # field 19: nice


def test_a_child_starts_with_its_niceness_and_keeps_it_when_restarted(tmp_path):
    """A real child (the supervisor's own launcher): ``nice`` is added to its CPU niceness, here and after a crash;
    a child without one runs at the launcher's."""
    import os
    import sys

    sup = Supervisor(tmp_path / "logs", tmp_path / "processes.json", backoff=Backoff(first_s=0.0))
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    own = os.nice(0)
    try:
        background = sup.start(ChildSpec("background", sleeper, dict(os.environ), Stage.WORKERS, nice=7))
        query_path = sup.start(ChildSpec("query-path", sleeper, dict(os.environ), Stage.FRONTEND))
        assert _niceness(background.proc.pid) == min(19, own + 7)
        assert _niceness(query_path.proc.pid) == own
        first = background.proc.pid
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (background.proc.pid == first or background.status != "running") and time.monotonic() < deadline:
            sup.poll()
            time.sleep(0.05)
        assert background.proc.pid != first and _niceness(background.proc.pid) == min(19, own + 7)
    finally:
        sup.stop(["background", "query-path"])


def test_a_status_file_that_cannot_be_written_stops_no_restart(tmp_path, caplog):
    """A full disk or the state folder removed under the stack made writing processes.json raise in the supervisor's
    thread, which ended it: nothing was restarted after, and the children it had started died with it."""
    blocked = tmp_path / "state"
    blocked.write_text("a file where the folder should be")  # every write under it fails, as on a full disk
    w = World(tmp_path)
    w.sup._status_file = w.status_file = blocked / "processes.json"
    w.start("endpoint-mlp")
    w.current("endpoint-mlp").code = -9

    w.advance(1.0)  # raised before

    assert w.launches("endpoint-mlp") == 2
    warnings = [r.getMessage() for r in caplog.records if "could not be written" in r.getMessage()]
    assert len(warnings) == 1, "said once while it lasts"
    blocked.unlink()
    w.advance(0.2)
    assert w.status("endpoint-mlp")["restarts"] == 1  # written again once it can be


def test_the_supervisor_thread_outlives_a_failed_pass(tmp_path):
    """Its children die with the thread that started them (PR_SET_PDEATHSIG), so the thread must not end on an
    error: a restart that fails once is tried again, and the thread goes on."""
    w = World(tmp_path)
    w.start("batcher-mlp")
    failures = [OSError(28, "No space left on device")]
    launch = w.sup._launch_fn

    def flaky(spec, log_path):
        if failures:
            raise failures.pop()
        return launch(spec, log_path)

    w.sup._launch_fn = flaky
    w.sup.start_thread()
    try:
        w.current("batcher-mlp").code = -9
        deadline = time.monotonic() + 10
        while w.launches("batcher-mlp") < 2 and time.monotonic() < deadline:
            w.now += 0.25
            time.sleep(0.05)
        assert w.launches("batcher-mlp") == 2 and not failures
        assert w.sup._thread is not None and w.sup._thread.is_alive()
    finally:
        w.sup.halt()


def test_a_childs_folders_are_made_again_before_it_restarts(tmp_path):
    """redis-server refuses to start when its --dir is missing: with the state folder removed under the stack, it
    was restarted and exited again, again and again, and every query defaulted."""
    import shutil

    w = World(tmp_path)
    data = tmp_path / "state" / "redis"
    w.sup.start(ChildSpec("redis", ["redis-server"], {}, Stage.REDIS, folders=(data,)))
    shutil.rmtree(tmp_path / "state")
    w.current("redis").code = -9

    w.advance(1.0)

    assert w.launches("redis") == 2 and data.is_dir()


def test_a_child_that_cannot_be_started_again_backs_off_and_holds_up_no_other(tmp_path):
    """A restart that raised (fork failed, its binary gone) left the poll before the children after it, again each
    0.1 s: their exits went unnoticed, none was restarted, and no back-off applied (found by a review)."""
    w = World(tmp_path)
    w.start("redis", Stage.REDIS)
    w.start("batcher-mlp", Stage.BATCHERS)
    launch = w.sup._launch_fn

    def failing_for_redis(spec, log_path):
        if spec.name == "redis" and w.launches("redis") >= 1:
            w.launched.append(("redis-failed", FakeProcess(0)))
            raise FileNotFoundError("redis-server")
        return launch(spec, log_path)

    w.sup._launch_fn = failing_for_redis
    w.current("redis").code = -9
    w.current("batcher-mlp").code = -9

    w.advance(4.0)

    assert w.launches("batcher-mlp") == 2  # restarted after its back-off
    tries = w.launches("redis-failed")
    assert 2 <= tries <= 4, tries  # 0.5 s, then 1 s, 2 s apart: not every poll
    assert w.status("redis")["status"] == "restarting"
