"""The endpoint image's entrypoint script (model-images/onnx-runtime/serve), run as SageMaker runs it, with
stand-ins for its two processes on PATH (the server: a small HTTP server answering /ping; the batcher: a script
that, when stopped, makes one last call to the server): on SIGTERM the batcher is stopped first and its last call
still finds the server, which is stopped after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.services import REPO, free_port

pytestmark = pytest.mark.integration

SERVE = REPO / "model-images" / "onnx-runtime" / "serve"

FAKE_SERVER = """
import http.server, signal, sys
log = sys.argv[1]
class Ping(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a):
        pass
def stop(*_):
    open(log, "a").write("server stopped\\n"); sys.exit(0)
signal.signal(signal.SIGTERM, stop)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Ping).serve_forever()
"""

FAKE_BATCHER = """
import signal, sys, time, urllib.request
log, url = sys.argv[1], sys.argv[2]
def stop(*_):
    time.sleep(0.5)  # finishing its batch
    try:
        urllib.request.urlopen(url + "/ping", timeout=2)
        open(log, "a").write("batcher's last call answered\\n")
    except OSError as e:
        open(log, "a").write(f"batcher's last call failed: {e}\\n")
    open(log, "a").write("batcher stopped\\n"); sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(log, "a").write("batcher started\\n")
while True:
    time.sleep(0.1)
"""


def test_sigterm_stops_the_batcher_first_and_the_server_after_it(tmp_path: Path) -> None:
    log, bin_dir, port = tmp_path / "order.log", tmp_path / "bin", free_port()
    bin_dir.mkdir()
    (tmp_path / "server.py").write_text(FAKE_SERVER)
    (tmp_path / "batcher.py").write_text(FAKE_BATCHER)
    python = bin_dir / "python"  # `python -m clipper_endpoint ...` is the stand-in server; anything else real
    python.write_text(
        textwrap.dedent(f"""\
            #!/usr/bin/env bash
            if [[ "$1" == "-m" && "$2" == "clipper_endpoint" ]]; then
              exec {sys.executable} {tmp_path / "server.py"} {log} {port}
            fi
            exec {sys.executable} "$@"
            """)
    )
    batcher = bin_dir / "clipper-batcher"
    batcher.write_text(f'#!/usr/bin/env bash\nexec {sys.executable} {tmp_path / "batcher.py"} {log} "$4"\n')
    for f in (python, batcher):
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CLIPPER_QUEUE_URL": "https://sqs/q"}
    env["SAGEMAKER_BIND_TO_PORT"] = str(port)
    proc = subprocess.Popen(["bash", str(SERVE), "serve"], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not (log.exists() and "batcher started" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text() if log.exists() else ""
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = log.read_text().splitlines()
    assert lines == ["batcher started", "batcher's last call answered", "batcher stopped", "server stopped"], lines
