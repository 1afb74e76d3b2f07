"""A fault proxy in front of a real model server: it forwards each request unchanged, or, in a fault window,
answers 500 or waits before forwarding. The benchmark registers a model version whose endpoint is the proxy (and
runs a real batcher for it), so the faults reach the stack the way a failing or slow server would."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FaultProxy:
    def __init__(self, upstream: str, port: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.mode = "pass"  # pass | error | slow
        self.slow_s = 0.5
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def _forward(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                mode = proxy.mode
                if mode == "error" and self.path != "/ping":
                    self._answer(500, b'{"error": "injected fault"}', "application/json")
                    return
                if mode == "slow" and self.path != "/ping":
                    time.sleep(proxy.slow_s)
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
                request = urllib.request.Request(proxy.upstream + self.path, body, headers, method=method)
                try:
                    with urllib.request.urlopen(request, timeout=30) as r:
                        self._answer(r.status, r.read(), r.headers.get("Content-Type", "application/octet-stream"))
                except urllib.error.HTTPError as e:
                    self._answer(e.code, e.read(), e.headers.get("Content-Type", "text/plain"))
                except OSError as e:
                    self._answer(502, str(e).encode(), "text/plain")

            def _answer(self, status: int, data: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
