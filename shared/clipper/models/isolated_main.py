"""The validation child's entry point (``python -m clipper.models.isolated_main <parent pid> <answers fd>``): see
``clipper.models.isolated``. It asks Linux to kill it when its parent dies, and exits at once if the parent is
already gone (died before the request took effect)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from clipper.models.isolated import run_child

_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return  # not Linux: a child of a killed parent runs to its end (the parent's limit stops it otherwise)
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit(1)


if __name__ == "__main__":
    _die_with(int(sys.argv[1]))
    fd = int(sys.argv[2])
    os.set_inheritable(fd, False)  # a process the model's libraries start must not hold the parent's channel open
    with os.fdopen(fd, "wb") as answers:
        run_child(sys.stdin.buffer, answers)
