"""The gate on the local stack's moto server: closed from the server's start until the launcher has put the stack's
state back in it.

moto keeps everything in memory, so a moto server that exits comes back empty; the launcher (``stack.LocalStack``)
creates the stack in it again and then loads the last snapshot into its tables. Between the two the tables exist
and are empty: a frontend whose registry copy refreshed then answered 404 "unknown application" for applications
that exist, and the feedback worker acknowledged a feedback of such an application as ``unknown_app`` (dropped).

Started with ``--gated`` (``infra.local.moto_server``), the server answers every request with an empty 503
until the gate opens, except moto's own ``/moto-api/`` (the launcher's readiness check) and
requests that carry ``X-Clipper-Restore`` (the launcher's restoring thread, ``passing``). The stack's processes take
the 503 as AWS being unavailable (``clipper.adapters.aws_errors``): the registry copy keeps answering what it
held, the feedback worker leaves a feedback for later, nothing is taken for absent. The launcher opens the gate
(``POST /moto-api/clipper/gate``) once the stack, the snapshot and the uploaded versions' stacks are back; a
moto server that exits again comes back closed.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import Any

HEADER = "X-Clipper-Restore"
OPEN_PATH = "/moto-api/clipper/gate"
_ENVIRON_HEADER = "HTTP_" + HEADER.upper().replace("-", "_")
StartResponse = Callable[..., Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class Gate:
    """A WSGI middleware around moto's application: closed until a ``POST`` to ``OPEN_PATH``."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.opened = threading.Event()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == OPEN_PATH:
            if environ.get("REQUEST_METHOD") != "POST":
                start_response("405 Method Not Allowed", [("Content-Length", "0")])
                return [b""]
            self.opened.set()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "15")])
            return [b'{"open": true}\n']
        if self.opened.is_set() or path.startswith("/moto-api/") or _ENVIRON_HEADER in environ:
            return self.app(environ, start_response)
        # no body: every protocol's parser (JSON, query XML, REST XML: CloudFormation failed to parse a JSON one)
        # makes a ClientError of an empty 503, which the stack's adapters take as unavailable
        start_response("503 Service Unavailable", [("Content-Length", "0")])
        return [b""]

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("app", "opened"):
            object.__setattr__(self, name, value)
        else:  # moto's server sets attributes of its application (``debug``): they belong to it
            setattr(self.app, name, value)


# -- the launcher's side ------------------------------------------------------------------------------------------
_passing = threading.local()


def install(session: Any) -> None:
    """Make ``passing`` work for the clients this boto3 session creates from now on (idempotent: botocore keeps
    one handler per ``unique_id``)."""
    session.events.register("before-send", _mark, unique_id="clipper-gate-passing")


def _mark(request: Any, **_: Any) -> None:
    if getattr(_passing, "on", False):
        request.headers[HEADER] = "1"


@contextlib.contextmanager
def passing() -> Iterator[None]:
    """While inside, this thread's requests pass a closed gate (the restore's own reads and writes); the launcher's
    other threads (the registry follower, the upload dispatch) wait behind it like every process of the stack."""
    before = getattr(_passing, "on", False)
    _passing.on = True
    try:
        yield
    finally:
        _passing.on = before


def open_gate(endpoint_url: str, timeout_s: float = 5.0) -> None:
    """Open the gate of the moto server at ``endpoint_url``."""
    request = urllib.request.Request(endpoint_url.rstrip("/") + OPEN_PATH, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        answer.read()
