"""The RESP parser re-parsed (and copied again) a partly received reply from its start after every read,
so a large array reply (an XREADGROUP / RECEIVE script answer of hundreds of ~100-200 KB messages) cost time
quadratic in its size. Measured here: 51 MB parses in 0.76 s, 102 MB in 6.4 s, while the queue reader's script
call has the client's 1 s timeout: receive(512) of 100 KB messages times out, the 512 messages stay in the PEL
(in flight for the visibility timeout) and each redelivery times out the same way until they are dead-lettered."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import clipper.adapters.resp as resp
import clipper.adapters.resp_async as resp_async

pytestmark = pytest.mark.unit

CHUNK = 262144  # what _Connection._fill reads at most


class _FeedingSocket:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def settimeout(self, _t: float) -> None:
        pass

    def sendall(self, _b: bytes) -> None:
        pass

    def recv(self, n: int) -> bytes:
        out = self.data[self.at : self.at + min(n, CHUNK)]
        self.at += len(out)
        return out


def test_a_large_array_reply_is_parsed_in_linear_work(monkeypatch: Any) -> None:
    items, size = 256, 200_000
    item = b"x" * size
    data = b"*%d\r\n" % items + b"".join(b"$%d\r\n%b\r\n" % (size, item) for _ in range(items))
    conn = resp._Connection.__new__(resp._Connection)
    conn.buf = bytearray()
    conn.sock = _FeedingSocket(data)  # type: ignore[assignment]

    copied = 0
    real_parse = resp.parse

    def counting_parse(buf: Any, pos: int) -> Any:
        nonlocal copied
        value, end = real_parse(buf, pos)
        if isinstance(value, bytes):
            copied += len(value)
        return value, end

    monkeypatch.setattr(resp, "parse", counting_parse)
    (reply,) = conn.roundtrip([("XREADGROUP",)], deadline=float("inf"))
    assert len(reply) == items
    # Each element should be copied out once (51 MB); the parser copies every finished element again after each
    # 256 KB read: ~100x the reply.
    assert copied <= 2 * items * size, f"copied {copied / 1e9:.1f} GB for a {len(data) / 1e6:.0f} MB reply"


def _reply(items: int, size: int) -> bytes:
    item = b"x" * size
    return b"*%d\r\n" % items + b"".join(b"$%d\r\n%b\r\n" % (size, item) for _ in range(items))


def test_the_event_loop_client_parses_a_large_reply_once_it_is_whole(monkeypatch: Any) -> None:
    """The frontend's client (resp_async) re-parsed the same way at every part the loop handed it."""
    items, size = 256, 200_000
    data = _reply(items, size) + b"+OK\r\n"  # and the next call's reply behind it, in the same parts
    copied = 0
    real_parse = resp_async.parse

    def counting_parse(buf: Any, pos: int) -> Any:
        nonlocal copied
        value, end = real_parse(buf, pos)
        if isinstance(value, bytes):
            copied += len(value)
        return value, end

    monkeypatch.setattr(resp_async, "parse", counting_parse)
    monkeypatch.setattr(resp, "parse", counting_parse)  # its recursion

    async def run() -> list[Any]:
        proto = resp_async._Protocol()
        proto.loop = asyncio.get_running_loop()
        big, ok = proto.loop.create_future(), proto.loop.create_future()
        proto.calls.append(resp_async._Call(big, 1))
        proto.calls.append(resp_async._Call(ok, 1))
        for at in range(0, len(data), 65536):
            proto.data_received(data[at : at + 65536])
        return [await big, await ok]

    (reply,), ok = asyncio.run(run())
    assert len(reply) == items and ok == ["OK"]
    assert copied <= 2 * items * size, f"copied {copied / 1e9:.1f} GB for a {len(data) / 1e6:.0f} MB reply"


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 64])
def test_replies_cut_anywhere_come_out_whole_and_in_order(cut: int) -> None:
    """Nested arrays, nil, errors, integers and statuses, fed in parts of every size: the same replies."""
    data = b"*2\r\n*3\r\n$3\r\nabc\r\n$-1\r\n:42\r\n-ERR oops\r\n+PONG\r\n*-1\r\n$0\r\n\r\n"

    async def run() -> list[Any]:
        proto = resp_async._Protocol()
        proto.loop = asyncio.get_running_loop()
        futures = [proto.loop.create_future() for _ in range(4)]
        for f in futures:
            proto.calls.append(resp_async._Call(f, 1))
        for at in range(0, len(data), cut):
            proto.data_received(data[at : at + cut])
        return [(await f)[0] for f in futures]

    nested, pong, nil, empty = asyncio.run(run())
    assert nested[0] == [b"abc", None, 42] and isinstance(nested[1], resp.RespError)
    assert (pong, nil, empty) == ("PONG", None, b"")


def test_a_connection_whose_set_up_is_not_answered_is_closed() -> None:
    """AUTH not answered within the call's time: the call is Unavailable and its connection closed (it was
    neither kept nor closed: one connection leaked per such call; found by a review)."""
    from clipper.adapters.resp import RespClient
    from clipper.errors import Unavailable

    async def run() -> bool:
        closed = asyncio.Event()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await reader.read(4096):  # reads AUTH, never answers
                pass
            closed.set()  # the client closed its end

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = RespClient.from_url(f"redis://:secret@127.0.0.1:{port}/0").aio
        with pytest.raises(Unavailable):
            await client.execute([("PING",)], timeout=0.2)
        try:
            await asyncio.wait_for(closed.wait(), 2.0)
            return True
        except TimeoutError:
            return False
        finally:
            server.close()

    assert asyncio.run(run())


def _many_small(items: int) -> bytes:
    return b"*%d\r\n" % items + b"".join(b"*2\r\n$2\r\nid\r\n:%d\r\n" % i for i in range(items))


def test_a_reply_of_many_small_elements_is_scanned_once_however_many_parts() -> None:
    """The end of a reply in parts was looked for again from its start at every part: 50,000 small elements in
    16 KB parts took 6.8 s (every element passed ~100 times). Counted here: the elements' headers looked at."""
    items = 50_000
    data = _many_small(items) + b"+OK\r\n"
    looked = 0
    real_find = bytearray.find

    class CountingBuffer(bytearray):
        def find(self, *args: Any) -> int:  # type: ignore[override]
            nonlocal looked
            looked += 1
            return real_find(self, *args)

    async def run() -> list[Any]:
        proto = resp_async._Protocol()
        proto.buf = CountingBuffer()
        proto.loop = asyncio.get_running_loop()
        big, ok = proto.loop.create_future(), proto.loop.create_future()
        proto.calls.append(resp_async._Call(big, 1))
        proto.calls.append(resp_async._Call(ok, 1))
        for at in range(0, len(data), 16384):
            proto.data_received(data[at : at + 16384])
        return [await big, await ok]

    (reply,), ok = asyncio.run(run())
    assert len(reply) == items and reply[-1] == [b"id", items - 1] and ok == ["OK"]
    parts = len(data) // 16384 + 1
    # each element has 3 headers; scanned once as the parts come and parsed once whole (and the first part's parse
    # that found it incomplete): ~2 x 150,000, where scanning from the start at every part looked at ~40 x 150,000
    assert parts > 40 and looked <= 3 * 3 * items, looked

    conn = resp._Connection.__new__(resp._Connection)
    conn.buf = CountingBuffer()
    conn.sock = _FeedingSocket(data)  # type: ignore[assignment]
    looked = 0
    conn.sock.recv = lambda n: _FeedingSocket.recv(conn.sock, min(n, 16384))  # type: ignore[method-assign]
    replies = conn.roundtrip([("XREADGROUP",), ("PING",)], deadline=float("inf"))
    assert len(replies[0]) == items and replies[1] == "OK"
    assert looked <= 3 * 3 * items, looked


def test_close_from_another_thread_fails_a_loops_calls_on_that_loops_thread() -> None:
    """``close()`` failed each loop's connection from the caller's thread: a future's callbacks scheduled and its
    transport closed from outside its loop (asyncio's debug mode refuses it: 'Non-thread-safe operation')."""
    import concurrent.futures

    from clipper.adapters.resp import RespClient
    from clipper.errors import Unavailable

    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()

    async def silent_server() -> int:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await reader.read(4096):  # reads, never answers
                pass

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port: int = server.sockets[0].getsockname()[1]
        return port

    try:
        port = asyncio.run_coroutine_threadsafe(silent_server(), loop).result(5)
        client = RespClient.from_url(f"redis://127.0.0.1:{port}/0").aio
        call = asyncio.run_coroutine_threadsafe(client.execute([("PING",)], timeout=30.0), loop)
        for _ in range(200):  # until the call is in flight on its connection
            if client._connections and next(iter(client._connections.values())).calls:
                break
            time.sleep(0.01)
        client.close()  # from this thread, not the loop's
        with pytest.raises(Unavailable):
            call.result(5)
    except concurrent.futures.TimeoutError:
        pytest.fail("the call was not failed by close()")
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)


def test_close_after_the_loop_of_a_connection_is_closed_does_not_raise() -> None:
    """A client used under ``asyncio.run`` (its loop closed since) and closed after: ``close()`` raised 'Event loop
    is closed' from the connection's transport (found by a review)."""
    from clipper.adapters.resp import RespClient

    async def pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"+PONG\r\n")
        await writer.drain()

    ready, box = threading.Event(), {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        server = loop.run_until_complete(asyncio.start_server(pong, "127.0.0.1", 0))
        box["port"], box["loop"] = server.sockets[0].getsockname()[1], loop
        ready.set()
        loop.run_forever()

    threading.Thread(target=serve, daemon=True).start()
    assert ready.wait(5)
    client = RespClient("127.0.0.1", box["port"], timeout=1.0)

    async def ping() -> list[Any]:
        return await client.aio.execute([("PING",)])

    try:
        assert asyncio.run(ping()) == ["PONG"]  # the loop of that connection is closed once run returns
        client.close()
    finally:
        box["loop"].call_soon_threadsafe(box["loop"].stop)
