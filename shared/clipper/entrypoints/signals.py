"""SIGINT and SIGTERM for the long-running entry points (the batcher, the feedback worker): a stop event set by a
thread of its own, never by code run in the middle of another frame.

    signals = StopSignals()
    signals.listen()                  # on the main thread, first: a signal now ends the process at once
    driver = build_driver(...)        # nothing received yet
    signals.ready(on_stop=driver.wake)
    driver.run(signals.stop)          # a signal sets ``stop`` and calls ``on_stop``

Python's C-level handler writes each signal's number to a pipe (``signal.set_wakeup_fd``), which the thread
reads; the Python-level handlers do nothing. A handler that set the stop event itself ran wherever the main thread
was, possibly inside that event's own lock (``Event.wait`` holds it around its checks), and the next signal could
enter it again there: it then waited for the lock forever. A batcher orphaned by a launcher killed with -9 kept
running that way, ignoring SIGTERM.

The wakeup fd is the process's only one: a process using this must not also take signals through asyncio
(``loop.add_signal_handler`` sets its own), or the stop signals would reach no one. ``listen`` refuses when a
wakeup fd is set already. After ``ready``, the first stop signal counts; later ones change nothing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


class StopSignals:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self._on_stop: Callable[[], None] | None = None
        self._ready = False

    def listen(self) -> None:
        """Take the stop signals (on the main thread, which alone may set handlers). Until ``ready``, a signal
        ends the process at once, with 128 + its number, as a shell reports it."""
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)  # what set_wakeup_fd needs
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        if previous != -1:
            signal.set_wakeup_fd(previous)
            raise RuntimeError("a signal wakeup fd is set already (asyncio's?): the stop signals would be lost")
        for sig in STOP_SIGNALS:
            signal.signal(sig, _noted)
        threading.Thread(target=self._take, args=(read_end,), name="clipper-signals", daemon=True).start()

    def ready(self, on_stop: Callable[[], None] | None = None) -> None:
        """From now on a signal sets ``stop``, then calls ``on_stop`` (on the signals' thread)."""
        self._on_stop = on_stop
        self._ready = True

    def _take(self, read_end: int) -> None:
        while not (stops := [n for n in os.read(read_end, 64) if n in STOP_SIGNALS]):
            pass
        if not self._ready:
            os._exit(128 + stops[0])
        self.stop.set()
        if self._on_stop is not None:
            self._on_stop()


def _noted(signum: int, frame: object) -> None:
    """The Python-level handler of the stop signals: nothing (``StopSignals`` acts on the pipe's byte)."""
