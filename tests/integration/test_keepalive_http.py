"""The batcher's HTTP client (``KeepAliveHttp``) against a local HTTP/1.1 server: connection reuse, a
connection the server closed meanwhile, chunked and connection-close answers, timeouts, no server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clipper.adapters.endpoints import KeepAliveHttp
from clipper.errors import EndpointError

pytestmark = pytest.mark.integration


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    opened = 0  # connections accepted (one handler instance serves one connection)

    def setup(self) -> None:
        super().setup()
        Handler.opened += 1

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = b"echo:" + body + b":" + self.headers.get("X-Tag", "").encode()
        if self.path == "/slow":
            time.sleep(0.5)
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (answer[:3], answer[3:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_response(503 if self.path == "/busy" else 200)
        self.send_header("Content-Length", str(len(answer)))
        if self.path == "/close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(answer)


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        return None  # the timeout test's client leaves before its answer: a broken pipe, expected


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    Handler.opened = 0
    httpd = QuietServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def client(httpd: ThreadingHTTPServer, timeout_s: float = 5.0) -> KeepAliveHttp:
    return KeepAliveHttp("127.0.0.1", httpd.server_address[1], timeout_s)


def test_requests_reuse_one_connection(server):
    http = client(server)
    for i in range(5):
        status, headers, body = http.post("/x", b"row%d" % i, {"X-Tag": "t"})
        assert (status, body) == (200, b"echo:row%d:t" % i) and headers["content-length"] == str(len(body))
    assert Handler.opened == 1
    assert http.post("/busy", b"b", {})[0] == 503


def test_chunked_and_connection_close_answers(server):
    http = client(server)
    assert http.post("/chunked", b"abc", {})[2] == b"echo:abc:"
    assert http.post("/close", b"once", {})[2] == b"echo:once:"
    assert http.post("/x", b"after", {})[2] == b"echo:after:"  # a fresh connection after the close
    assert Handler.opened == 2


def test_a_connection_the_server_closed_is_replaced(server):
    http = client(server)
    assert http.post("/x", b"1", {})[0] == 200
    for sock, _ in http._idle:  # what a server's keep-alive timeout does, seen from this side
        sock.shutdown(socket.SHUT_RDWR)
    assert http.post("/x", b"2", {})[2] == b"echo:2:"
    assert Handler.opened == 2


def test_a_slow_answer_times_out_and_a_missing_server_is_unreachable(server):
    http = client(server, timeout_s=0.1)
    with pytest.raises(EndpointError, match="did not answer within"):
        http.post("/slow", b"z", {})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EndpointError, match="unreachable"):
        KeepAliveHttp("127.0.0.1", port, 1.0).post("/x", b"", {})
