"""The entry points' stop signals (clipper.entrypoints.signals), in a child process: a burst of SIGTERMs stops a
main thread that waits on the stop event (the wait that held the event's lock when a handler set it), and a signal
before ``ready`` ends the process at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

PROGRAM = textwrap.dedent(
    """
    import sys, time
    from clipper.entrypoints.signals import StopSignals

    signals = StopSignals()
    signals.listen()
    if sys.argv[1] == "ready":
        woken = []
        signals.ready(on_stop=lambda: woken.append(1))
        print("ready", flush=True)
        while not signals.stop.wait(0.0001):  # the pattern a handler could deadlock: Event.wait in a loop
            pass
        time.sleep(0.2)
        print("stopped", len(woken), flush=True)
    else:
        print("starting", flush=True)
        time.sleep(30)
    """
)


def _start(mode: str) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", PROGRAM, mode], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() in ("ready", "starting")
    return child


def test_a_burst_of_signals_stops_a_waiting_main_thread_once():
    for _ in range(3):
        child = _start("ready")
        try:
            for _ in range(3000):
                if child.poll() is not None:
                    break
                child.send_signal(signal.SIGTERM)
            output, _ = child.communicate(timeout=15)
            assert "stopped 1" in output, output  # stopped, and woken once
            assert child.returncode in (0, -signal.SIGTERM)  # a late one may come while the interpreter exits
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_a_signal_before_ready_ends_the_process_at_once():
    child = _start("starting")
    try:
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
