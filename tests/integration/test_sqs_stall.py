"""The frontend's SQS client against a stalled SQS (a server on loopback that accepts connections and never
answers): a feedback's send gives up within its client's two short tries and is answered 503, not held for the
default 10 s read timeout a try."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from clipper.adapters.sqs import SqsRequestQueue
from clipper.errors import Unavailable
from clipper.feedback import FeedbackReceiver
from clipper.wiring import FRONTEND_SQS, aws_client
from tests.fakes import InMemoryRegistry, digits_app

pytestmark = pytest.mark.integration


@pytest.fixture
def stalled_endpoint() -> Iterator[str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # takes each connection and never answers
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=2)
        for conn in held:
            conn.close()
        server.close()


def test_a_feedback_send_to_a_stalled_sqs_gives_up_within_its_short_tries(stalled_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", stalled_endpoint)
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    sqs = aws_client("sqs", **FRONTEND_SQS)
    registry = InMemoryRegistry()
    registry.apps["digits"] = digits_app()
    receiver = FeedbackReceiver(registry, SqsRequestQueue(sqs), f"{stalled_endpoint}/123456789012/feedback")
    started = time.monotonic()
    with pytest.raises(Unavailable):
        receiver.accept("digits", {"input": [0.0] * 64, "label": 1})
    waited = time.monotonic() - started
    # two tries of a 2 s read and the retry's back-off; the default client (10 s reads) took over 20 s
    assert waited < 10, waited
