"""A command run as in a terminal: a pseudo-terminal is its controlling terminal, its output is collected, and
``ctrl_c`` types Ctrl-C, so the terminal's line discipline sends SIGINT to whatever process group is in the
foreground, exactly as for a user (``make run`` and the stack under it)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import subprocess
import termios
import threading
from pathlib import Path

from tests.services import REPO


def _controlling_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # in the child: its new session's terminal is stdin (the pty)


class TerminalProcess:
    def __init__(self, command: list[str], env: dict[str, str], cwd: Path = REPO) -> None:
        master, slave = pty.openpty()
        self._master = master
        self.lines: list[str] = []
        self._partial = ""
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_controlling_terminal,
        )
        os.close(slave)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: every process holding the terminal is gone
                break
            if not chunk:
                break
            text = self._partial + chunk.decode(errors="replace").replace("\r\n", "\n")
            *complete, self._partial = text.split("\n")
            for line in complete:
                self.lines.append(line)
                if line.lstrip().startswith("logs:") and "local stack ready" in self.output:
                    self._ready.set()  # the last line of what the stack prints when it is ready
        if self._partial:
            self.lines.append(self._partial)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout_s: float = 300) -> None:
        if not self._ready.wait(timeout_s):
            raise AssertionError("no ready line:\n" + "\n".join(self.lines[-40:]))

    def ctrl_c(self, timeout_s: float = 90) -> int:
        """Type Ctrl-C and wait for the command to end; returns its exit status."""
        os.write(self._master, b"\x03")
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        """SIGKILL to every process of its session (the stack's children run in process groups of their own)."""
        import signal

        for pid in session_processes(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        with contextlib.suppress(OSError):
            os.close(self._master)


def session_processes(sid: int) -> list[int]:
    """PIDs of live processes in session ``sid`` (read from /proc: field 6 of stat is the session)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids
