"""Supervision of the local stack's processes: every child that exits without being asked to is started again,
with the same command line (so a model server comes back on the same port), after an exponential back-off.

    supervisor = Supervisor(logs_dir, status_file)
    supervisor.start(ChildSpec("endpoint-mlp", [...], env, stage=Stage.SERVERS))
    supervisor.start_thread()           # polls the children, restarts them when due
    ...
    supervisor.stop_all()               # stage by stage: frontend, batchers, servers, workers, redis, moto

Back-off: the first restart comes after ``Backoff.first_s``, each further crash in a row doubles the wait up to
``Backoff.max_s``; a child that ran ``Backoff.stable_s`` before it died starts the count again. A child that keeps
crashing is reported (a log line naming its log file) and tried again at the capped interval, never in a hot loop.
Nothing a child does stops the stack.

Every change is written to a status file (``processes.json``), atomically::

    {"updated": <epoch s>, "processes": [{"name", "pid", "status": "running" | "restarting" | "stopped",
      "restarts": n, "last_exit": int | null, "last_restart": <epoch s> | null}]}

Children run in process groups of their own (a Ctrl-C in the terminal reaches only the launcher, which stops them
in order) and get SIGTERM if the launcher dies (``PR_SET_PDEATHSIG``). That signal follows the *thread* that
started a child, so children are started from the main thread or the supervisor's own thread, never from a
short-lived one: ``start`` called from another thread hands the launch to the supervisor's thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
import json
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from infra.local.backoff import Backoff, RestartRecord, describe_exit

logger = logging.getLogger("clipper.local")

Status = Literal["running", "restarting", "stopped"]


# The exit code a child that could not be started again counts as (a shell's "command not found")
FAILED_START = 127


class Stage(enum.IntEnum):
    """The order children stop in (lowest first); they start in the launcher's own order."""

    FRONTEND = 0
    BATCHERS = 1
    SERVERS = 2
    WORKERS = 3
    REDIS = 4
    MOTO = 5


class Process(Protocol):
    """The part of ``subprocess.Popen`` the supervisor uses."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


@dataclass
class ChildSpec:
    name: str
    cmd: list[str]
    env: dict[str, str]
    stage: Stage
    on_exit: Callable[[int], None] | None = None  # in the supervisor's thread, as soon as it exited unasked
    on_restart: Callable[[], None] | None = None  # in a thread of its own, once it was started again
    nice: int = 0  # added to the child's CPU niceness when it starts (19: it runs when nothing else wants the CPU)
    folders: tuple[Path, ...] = ()  # made before each start, if missing (the state folder removed under the stack)


@dataclass
class Child:
    spec: ChildSpec
    log_path: Path
    record: RestartRecord = field(default_factory=RestartRecord)
    proc: Process | None = None
    status: Status = "restarting"
    started_at: float = 0.0  # monotonic
    due_at: float = 0.0  # monotonic: when a restarting child starts again
    stopping: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.status == "running" else None

    def exit_code(self) -> int | None:
        """The exit status while it is down (None while it runs)."""
        if self.proc is None:
            return None
        return self.proc.poll()


Launch = Callable[[ChildSpec, Path], Process]


class Supervisor:
    def __init__(
        self,
        logs_dir: Path,
        status_file: Path,
        cwd: Path | None = None,
        backoff: Backoff | None = None,
        launch: Launch | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        heartbeat_s: float = 5.0,
    ) -> None:
        self._logs, self._status_file, self._cwd = logs_dir, status_file, cwd
        self._backoff = backoff or Backoff()
        self._launch_fn: Launch = launch or self._popen
        self._clock, self._wall = clock, wall_clock
        self._heartbeat_s = heartbeat_s
        self._children: dict[str, Child] = {}
        self._lock = threading.RLock()
        self._launches: queue.Queue[tuple[Child, Future[None]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self._dirty = True
        self._written_at = -1e9
        self._faults: set[str] = set()  # file failures said already (``_fault``)
        logs_dir.mkdir(parents=True, exist_ok=True)

    # -- starting --------------------------------------------------------------------------------------
    def start(self, spec: ChildSpec) -> Child:
        """Start a child now (its log: ``<logs>/<name>.log``, appended); it is restarted whenever it exits."""
        with self._lock:
            old = self._children.get(spec.name)
            if old is not None and old.status != "stopped":
                raise ValueError(f"a child named {spec.name} is already supervised")
            child = Child(spec, self._logs / f"{spec.name}.log")
            self._children[spec.name] = child
            self._dirty = True
        owner = self._thread
        if owner is None or threading.current_thread() in (owner, threading.main_thread()):
            self._launch(child)
            return child
        if self._halt.is_set():
            raise RuntimeError(f"{spec.name} not started: the stack is stopping")
        done: Future[None] = Future()
        self._launches.put((child, done))
        done.result()
        return child

    def _launch(self, child: Child) -> None:
        with self._lock:
            if child.stopping:
                return
            for folder in child.spec.folders:
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                except OSError as e:  # started anyway: it says what it misses in its log
                    self._fault(str(folder), e, failed="made")
            child.proc = self._launch_fn(child.spec, child.log_path)
            child.status = "running"
            child.started_at = self._clock()
            self._dirty = True

    def _popen(self, spec: ChildSpec, log_path: Path) -> Process:
        def popen(stdout: Any) -> Process:
            return subprocess.Popen(
                spec.cmd,
                env=spec.env,
                cwd=self._cwd,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=functools.partial(_start_child, spec.nice),
            )

        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)  # the state folder removed under the stack
            log = open(log_path, "ab")  # noqa: SIM115  (the child keeps its own descriptor)
        except OSError as e:  # a full disk: the process without its log, rather than no process
            self._fault(f"log {log_path}", e)
            return popen(subprocess.DEVNULL)
        self._faults.discard(f"log {log_path}")  # said again if it fails again
        with log:
            return popen(log)

    def _fault(self, what: str, error: BaseException, failed: str = "written") -> None:
        """A failure of the supervisor's own files (a full disk, the state folder removed) or of a child's start
        (``failed="started"``): logged once while it lasts (until the same succeeds again); the children are
        supervised meanwhile."""
        if what not in self._faults:
            self._faults.add(what)
            logger.warning("%s could not be %s (%s); supervising on, trying again later", what, failed, error)

    # -- supervising -----------------------------------------------------------------------------------
    def poll(self) -> None:
        """One pass: note the children that exited, start again those whose back-off is over, write the status
        file when something changed (and every ``heartbeat_s``)."""
        now = self._clock()
        restarted: list[Child] = []
        with self._lock:
            for child in list(self._children.values()):
                if child.stopping:
                    continue
                if child.status == "running":
                    code = child.exit_code()
                    if code is not None:
                        self._exited(child, code, now)
                elif child.status == "restarting" and now >= child.due_at:
                    self._note_restart(child, child.record.last_exit)
                    try:
                        self._launch(child)
                    except Exception as e:  # fork failed, its binary gone...: an exit, under the back-off
                        self._fault(child.name, e, failed="started")
                        child.started_at = now
                        self._exited(child, FAILED_START, now)
                        continue
                    self._faults.discard(child.name)
                    child.record.restarted(self._wall())
                    logger.info("%s restarted (restart %d, pid %s)", child.name, child.record.restarts, child.pid)
                    restarted.append(child)
            if self._dirty or now - self._written_at >= self._heartbeat_s:
                self.write_status()
        for child in restarted:
            hook = child.spec.on_restart
            if hook is not None:
                threading.Thread(target=hook, name=f"{child.name}-restarted", daemon=True).start()

    def _exited(self, child: Child, code: int, now: float) -> None:
        delay = child.record.exited(code, now - child.started_at, self._backoff)
        child.status, child.due_at, self._dirty = "restarting", now + delay, True
        where = f"see {child.log_path}"
        if child.record.crash_looping(self._backoff):
            logger.warning(
                "%s keeps crashing (%d exits in a row, the last %s); next try in %.0f s; %s",
                child.name,
                child.record.crashes,
                describe_exit(code),
                delay,
                where,
            )
        else:
            logger.warning("%s %s; restarting it in %.1f s (%s)", child.name, describe_exit(code), delay, where)
        if child.spec.on_exit is not None:
            child.spec.on_exit(code)

    def _note_restart(self, child: Child, code: int | None) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            child.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(child.log_path, "ab") as log:
                log.write(f"\n[local-stack] {stamp} restarted after it {describe_exit(code or 0)}\n".encode())
            self._faults.discard(f"log {child.log_path}")
        except OSError as e:
            self._fault(f"log {child.log_path}", e)

    def run(self) -> None:
        """The supervisor's thread: launches handed over by other threads, and a poll every 0.1 s. It never ends
        before ``halt``: the children it started get SIGTERM when it ends (``PR_SET_PDEATHSIG`` follows the
        thread that forked them), and nothing would restart the others."""
        while not self._halt.is_set():
            try:
                self._run_once()
            except Exception:  # logged, and supervising goes on
                logger.exception("supervisor pass failed; supervising on")
                time.sleep(0.1)
        while not self._launches.empty():
            _, done = self._launches.get_nowait()
            done.set_exception(RuntimeError("the stack is stopping"))

    def _run_once(self) -> None:
        """A launch handed over (if one comes within 0.1 s), then a poll."""
        try:
            child, done = self._launches.get(timeout=0.1)
        except queue.Empty:
            pass
        else:
            try:
                self._launch(child)
                done.set_result(None)
            except BaseException as e:  # handed back to the thread that asked
                done.set_exception(e)
        self.poll()

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self.run, name="supervisor", daemon=True)
        self._thread.start()

    # -- stopping --------------------------------------------------------------------------------------
    def stop(self, names: list[str], forget: bool = False, timeout_s: float = 10.0) -> None:
        """Stop children (SIGTERM, then SIGKILL after ``timeout_s``) without restarting them; ``forget``: drop
        them from the status file (a deleted version's processes)."""
        with self._lock:
            children = [self._children[n] for n in names if n in self._children]
            for child in children:
                child.stopping = True
        for child in children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = self._clock() + timeout_s
        for child in children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout=max(0.1, deadline - self._clock()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop within %.0f s: killed", child.name, timeout_s)
                child.proc.kill()
                child.proc.wait()
        with self._lock:
            for child in children:
                child.status = "stopped"
                if forget and self._children.get(child.name) is child:
                    del self._children[child.name]
            self._dirty = True

    def stop_stage(self, stage: Stage) -> None:
        with self._lock:
            names = [c.name for c in self._children.values() if c.spec.stage == stage]
        self.stop(names)

    def halt(self) -> None:
        """Stop the supervisor's thread (children keep running: stop them first)."""
        self._halt.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._lock:
            self.write_status()

    # -- reporting -------------------------------------------------------------------------------------
    def children(self) -> list[Child]:
        with self._lock:
            return list(self._children.values())

    def get(self, name: str) -> Child | None:
        with self._lock:
            return self._children.get(name)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "updated": round(self._wall(), 3),
                "processes": [
                    {
                        "name": c.name,
                        "pid": c.pid,
                        "status": c.status,
                        "restarts": c.record.restarts,
                        "last_exit": c.record.last_exit,
                        "last_restart": c.record.last_restart,
                    }
                    for c in self._children.values()
                ],
            }

    def write_status(self) -> None:
        """Write the status file; one that cannot be written (``_fault``) is written again at the next poll."""
        with self._lock:
            body = json.dumps(self.status(), indent=1)
            self._dirty, self._written_at = False, self._clock()
        what = str(self._status_file)
        try:
            write_atomically(self._status_file, body.encode())
        except OSError as e:
            with self._lock:
                self._dirty = True
            self._fault(what, e)
            return
        if what in self._faults:
            self._faults.discard(what)
            logger.info("%s written again", what)


def write_atomically(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole or is unchanged; its folder is made if missing (removed under the stack)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:  # a full disk: no half-written file left behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
try:  # looked up once here: nothing is loaded between fork and exec
    _prctl: Any = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
except OSError:
    _prctl = None  # not Linux: children then outlive a launcher that is killed


def lower_thread_priority(nice: int, name: str = "") -> None:
    """Add ``nice`` to the CPU niceness of the calling thread only (Linux: a thread's niceness is its own) and
    give it ``name`` (15 bytes at most) where ``ps -L`` and ``/proc/<pid>/task/*/comm`` show it; the threads
    and processes it starts from then on inherit the niceness, so it must not launch children (the supervisor's
    thread does, on request from ``Supervisor.start``). Best effort: where it cannot be set, nothing changes."""
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as e:
        logger.debug("thread niceness not changed: %s", e)
    if name and _prctl is not None:
        _prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def _start_child(nice: int) -> None:
    """In the child, before its command runs: die with the launcher, and take its niceness."""
    _die_with_parent()
    if nice:
        os.nice(nice)


def _die_with_parent() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
