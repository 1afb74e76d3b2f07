"""The local stack's durable mark (infra/local/stack.py, ``DURABLE_KEY``): after each copy of moto's state the
launcher tells the feedback worker the time the copy began, and the worker acknowledges only what it applied
before (``clipper.entrypoints.feedback_worker``). A kill -9 of the stack lost the feedback applied since the last
copy: acknowledged already, it never came back."""

from __future__ import annotations

import threading
import time
import types

import pytest

from clipper.adapters.resp import RespClient
from infra.local.stack import DURABLE_KEY, LOST_KEY, LocalStack
from tests.services import redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


class Snapshot:
    def __init__(self, during=None) -> None:
        self.during = during

    def take(self, still_valid):
        if self.during is not None:
            self.during()
        return ["SelectionTable"]


def launcher(url: str, snapshot: Snapshot, queue: str = "redis") -> types.SimpleNamespace:
    """What ``LocalStack.take_snapshot`` uses of the launcher (and no mark yet)."""
    RespClient.from_url(url).execute([("DEL", DURABLE_KEY), ("DEL", LOST_KEY)])
    state = types.SimpleNamespace(
        args=types.SimpleNamespace(queue=queue),
        env={"REDIS_URL": url},
        snapshot=snapshot,
        state_ready=threading.Event(),
        _moto_generation=0,
        _snapshot_failing=False,
        _last_copy_began=0.0,
        _keys_client=None,
        ready=threading.Event(),
        stopping=threading.Event(),
    )
    state.state_ready.set()
    state._set_local_key = lambda key, value: LocalStack._set_local_key(state, key, value)
    return state


def durable(url: str) -> float | None:
    (value,) = RespClient.from_url(url).execute([("GET", DURABLE_KEY)])
    return None if value is None else float(value)


def test_a_copy_marks_the_time_it_began(redis_url):  # noqa: F811
    before = time.time()
    LocalStack.take_snapshot(launcher(redis_url, Snapshot()))
    assert before <= durable(redis_url) <= time.time()


@pytest.mark.parametrize("how", ["failed", "moto restarted meanwhile", "sqs queues"])
def test_no_mark_when_the_copy_does_not_hold_the_state(redis_url, how):  # noqa: F811
    snapshot = Snapshot()
    state = launcher(redis_url, snapshot, queue="sqs" if how == "sqs queues" else "redis")

    def fail() -> None:
        raise OSError(28, "No space left on device")

    def restarted() -> None:
        state._moto_generation += 1  # moto died during the copy: it wrote nothing

    snapshot.during = {"failed": fail, "moto restarted meanwhile": restarted}.get(how)
    LocalStack.take_snapshot(state)
    assert durable(redis_url) is None


def test_moto_dying_marks_what_it_took_since_the_last_copy(redis_url):  # noqa: F811
    """The next copy after moto's restore begins after its death, and would release the feedback applied to the
    moto that died: the range since the last copy is marked lost, for the worker to let it come back."""
    state = launcher(redis_url, Snapshot())
    LocalStack.take_snapshot(state)
    copied = durable(redis_url)
    LocalStack._moto_exited(state, -9)
    (value,) = RespClient.from_url(redis_url).execute([("GET", LOST_KEY)])
    start, end = (float(x) for x in value.split())
    assert start == copied and copied <= end <= time.time()
