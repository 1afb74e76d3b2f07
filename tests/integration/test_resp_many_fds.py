"""RespClient's idle-connection check used select.select, which raises ValueError for a descriptor
>= 1024 (endpoints.KeepAliveHttp says so and uses poll); the ValueError is taken as "not usable", so once a
process has 1,024 descriptors open every call drops its pooled connection and connects again."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from clipper.adapters.resp import RespClient
from tests.services import redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def many_fds() -> Iterator[None]:
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        yield
    finally:
        for fd in fds:
            os.close(fd)


def test_a_pooled_connection_is_reused_when_descriptors_pass_1024(many_fds: None, redis_url: str) -> None:  # noqa: F811
    client = RespClient.from_url(redis_url)
    try:
        first = client.call("CLIENT", "ID")
        second = client.call("CLIENT", "ID")
        assert first == second, "a new connection for each call"
    finally:
        client.close()
