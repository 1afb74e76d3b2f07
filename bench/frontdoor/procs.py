"""Processes the benchmark starts: each in its own session, pinned to a core with taskset (children inherit
the affinity), its output in a log file, stopped as Ctrl-C stops it, and every process of its session (its
children too, in whatever process group they put themselves) checked gone."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.frontdoor.config import ROOT


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None


def pin_self(core: int) -> None:
    """Pin every thread of this process, and the threads and children it starts later, to ``core``."""
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, {core})


def free_port() -> int:
    """A free port below the kernel's ephemeral range where it can, so that no process of the system under
    test, which takes its own ports with ``bind(0)`` from that range, can be handed the same one."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    candidates = random.sample(range(20_000, low), min(50, low - 20_000)) if low > 20_100 else []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[str], what: str, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} while starting")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{what} did not listen on port {port} within {timeout_s:.0f} s")


class Group:
    """One command in its own process group; ``on_line`` sees each line of its output (also in ``log``)."""

    def __init__(
        self,
        command: list[str],
        log: Path,
        core: int | None,
        env: dict[str, str] | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        if core is not None:
            command = ["taskset", "-c", str(core), *command]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.on_line = on_line
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._pump = threading.Thread(target=self._read, name=f"pump-{self.proc.pid}", daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log, "w") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                if self.on_line is not None:
                    self.on_line(line.rstrip("\n"))

    def tail(self, lines: int = 30) -> str:
        """The last lines of the output (all of it once the process has exited)."""
        if self.proc.poll() is not None:
            self._pump.join(5)
        with contextlib.suppress(OSError):
            return "".join(self.log.read_text().splitlines(keepends=True)[-lines:])
        return ""

    def stop(self) -> list[int]:
        """SIGINT to the command (as Ctrl-C: it stops what it started, in its order), then SIGTERM and at last
        SIGKILL to whatever of its session is left; returns the pids that had to be signalled so."""
        sid = self.proc.pid  # the session leader's pid is the session id
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        forced: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            end = time.monotonic() + 5.0
            while session_members(sid) and time.monotonic() < end:
                time.sleep(0.1)  # children that stop after their parent
            left = session_members(sid)
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            forced += [pid for pid in left if pid not in forced]
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._pump.join(5)
        return forced


def session_members(sid: int) -> list[int]:
    """Live processes (not zombies) of session ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry.name))
    return found
