"""A server that answers every request at once (asyncio + uvloop, no framework): what the load generator is
measured against to find its own ceiling. ``--default-every K`` answers every K-th request of a connection
with ``"default": true`` (the tests check that the generator counts those as misses).

    python -m bench.frontdoor.trivial_server --port 8123 [--default-every K]
"""

from __future__ import annotations

import argparse
import asyncio

REAL = b'{"output":0,"default":false}'
DEFAULT = b'{"output":-1,"default":true}'


def _response(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


class Answer(asyncio.Protocol):
    def __init__(self, default_every: int) -> None:
        self.buffer = bytearray()
        self.default_every = default_every
        self.count = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        out = []
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            head = bytes(buffer[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(buffer) < end + 4 + length:
                break
            del buffer[: end + 4 + length]
            self.count += 1
            default = self.default_every > 0 and self.count % self.default_every == 0
            out.append(_ANSWERS[default])
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


_ANSWERS = {False: _response(REAL), True: _response(DEFAULT)}


async def serve(host: str, port: int, default_every: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: Answer(default_every), host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--default-every", type=int, default=0)
    args = p.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args.host, args.port, args.default_every))
    except ImportError:  # pragma: no cover
        asyncio.run(serve(args.host, args.port, args.default_every))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
