from __future__ import annotations

import threading

import pytest

from clipper.wiring import LazyClient

pytestmark = pytest.mark.unit


class Client:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def put_object(self, **kwargs: str) -> str:
        self.calls.append(kwargs["Key"])
        return "ok"


def test_lazy_client_is_created_on_first_use_and_only_once():
    made: list[Client] = []

    def create() -> Client:
        made.append(Client())
        return made[-1]

    lazy = LazyClient(create)
    assert made == [] and not lazy.created
    assert lazy.put_object(Bucket="b", Key="k1") == "ok"
    lazy.put_object(Bucket="b", Key="k2")
    assert len(made) == 1 and made[0].calls == ["k1", "k2"] and lazy.created


def test_lazy_client_created_once_under_concurrent_first_use():
    made: list[Client] = []
    gate = threading.Barrier(8)

    def create() -> Client:
        made.append(Client())
        return made[-1]

    lazy = LazyClient(create)

    def use(i: int) -> None:
        gate.wait()
        lazy.put_object(Bucket="b", Key=str(i))

    threads = [threading.Thread(target=use, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and sorted(made[0].calls) == [str(i) for i in range(8)]
