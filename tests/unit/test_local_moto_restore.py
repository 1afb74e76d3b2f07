"""The launcher's side of moto's restore (infra/local/stack.py): a restore that worked is not repeated when
only the gate's opening fails (a second deploy into the restored moto fails: its stack exists), and a moto that
died while the stack was still starting is restored once the start is done."""

from __future__ import annotations

import threading
import types

import pytest

from infra.local import gate
from infra.local.stack import LocalStack

pytestmark = pytest.mark.unit


def launcher(**overrides):
    state = types.SimpleNamespace(
        _moto_generation=1,
        stopping=threading.Event(),
        ready=threading.Event(),
        state_ready=threading.Event(),
        env={"AWS_ENDPOINT_URL": "http://127.0.0.1:1"},
        restores=0,
    )

    def restore():
        state.restores += 1

    state._restore_moto = restore
    state._open_gate = lambda generation: LocalStack._open_gate(state, generation)
    for k, v in overrides.items():
        setattr(state, k, v)
    return state


def test_a_failed_open_is_tried_again_alone(monkeypatch):
    tries: list[str] = []

    def flaky_open(url, timeout_s=5.0):
        tries.append(url)
        if len(tries) < 3:
            raise OSError("timed out")

    monkeypatch.setattr(gate, "open_gate", flaky_open)
    s = launcher()
    s.ready.set()
    LocalStack._moto_restarted(s)
    assert (len(tries), s.restores, s.state_ready.is_set()) == (3, 1, True)


def test_a_moto_started_again_meanwhile_is_left_closed_for_its_own_restore(monkeypatch):
    s = launcher()

    def open_and_die(url, timeout_s=5.0):
        s._moto_generation += 1  # died again: the one answering now is closed and empty
        raise OSError("connection refused")

    monkeypatch.setattr(gate, "open_gate", open_and_die)
    assert LocalStack._open_gate(s, 1) is False


def test_a_moto_that_died_during_the_start_is_restored_once_the_start_is_done(monkeypatch):
    monkeypatch.setattr(gate, "open_gate", lambda url, timeout_s=5.0: None)
    s = launcher()
    hook = threading.Thread(target=LocalStack._moto_restarted, args=(s,))
    hook.start()
    hook.join(timeout=1.5)
    assert hook.is_alive() and s.restores == 0  # waits for the start
    s.ready.set()
    hook.join(timeout=5)
    assert not hook.is_alive() and s.restores == 1 and s.state_ready.is_set()
