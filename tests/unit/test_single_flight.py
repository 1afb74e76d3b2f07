"""One read in flight per key: joiners share the leader's result, and its error as their own copy."""

from __future__ import annotations

import threading
import time

import pytest

from clipper.core.single_flight import SingleFlight
from clipper.errors import NotFound

pytestmark = pytest.mark.unit


def _joined(flight: SingleFlight[str], leader_load, joiners: int) -> list[object]:
    gate, entered = threading.Event(), threading.Event()
    out: list[object] = [None] * (joiners + 1)

    def leads() -> str:
        entered.set()
        assert gate.wait(5)
        return leader_load()

    def call(i: int, load) -> None:
        try:
            out[i] = flight.run("k", load, 10.0, 0.0)
        except BaseException as e:  # what each caller got
            out[i] = e

    threads = [threading.Thread(target=call, args=(0, leads))]
    threads[0].start()
    assert entered.wait(5)
    threads += [threading.Thread(target=call, args=(i, lambda: "own read")) for i in range(1, joiners + 1)]
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 5
    while flight.joined < joiners and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    for t in threads:
        t.join(5)
    return out


def test_joiners_take_the_leaders_result():
    out = _joined(SingleFlight(), lambda: "shared", 3)
    assert out == ["shared"] * 4


def test_each_joiner_raises_its_own_copy_of_the_leaders_error():
    def missing() -> str:
        raise NotFound("application", "digits")

    out = _joined(SingleFlight(), missing, 3)
    assert all(isinstance(e, NotFound) and str(e) == "application 'digits' does not exist" for e in out)
    assert len({id(e) for e in out}) == 4  # no two threads raise (and extend the traceback of) one object
    assert all(e.__cause__ is out[0] for e in out[1:])


def test_when_the_leader_is_interrupted_joiners_read_for_themselves():
    def interrupted() -> str:
        raise KeyboardInterrupt

    out = _joined(SingleFlight(), interrupted, 2)
    assert isinstance(out[0], KeyboardInterrupt) and out[1:] == ["own read", "own read"]
