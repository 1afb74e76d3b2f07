"""The model endpoint server as a real process on a loopback port, serving the demo digits models."""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import urllib3

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_SOURCE = REPO_ROOT / "model-images" / "onnx-runtime"
NPY = "application/x-npy"
JSON = "application/json"


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.getheader("content-type", ""), resp.read()
        finally:
            conn.close()

    def post(self, body: bytes, content_type: str, accept: str | None = None) -> tuple[int, str, bytes]:
        headers = {"Content-Type": content_type}
        if accept:
            headers["Accept"] = accept
        return self.request("POST", "/invocations", body, headers)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(model_path: Path, log: Path, *extra: str) -> Server:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SERVER_SOURCE), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "clipper_endpoint", "--model-path", str(model_path)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Server(proc, port, log)


def _wait_ready(server: Server, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log.read_text()}")
        try:
            if server.request("GET", "/ping")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"server did not answer /ping in {timeout_s} s:\n{server.log.read_text()}")


def _stop(server: Server) -> int:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    return server.proc.returncode


@pytest.fixture(scope="module")
def models_dir(demo_models: dict[str, Any]) -> Path:
    return Path(demo_models["out_dir"])


@pytest.fixture(scope="module")
def servers(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """The MLP served inline (the default on CPU) and the forest's probabilities served on a worker thread."""
    logs = tmp_path_factory.mktemp("endpoint-logs")
    started = {
        "mlp": _start(models_dir / "mlp" / "1", logs / "mlp.log"),
        "forest": _start(
            models_dir / "forest" / "1" / "model.onnx",
            logs / "forest.log",
            "--output-name",
            "probabilities",
            "--inference",
            "thread",
        ),
    }
    try:
        for server in started.values():
            _wait_ready(server)
        yield started
    finally:
        for server in started.values():
            _stop(server)


@pytest.fixture(scope="module")
def mlp_server(servers: dict[str, Server]) -> Server:
    return servers["mlp"]


@pytest.fixture(scope="module")
def holdout(demo_models: dict[str, Any], models_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    data = np.load(models_dir / demo_models["dataset"]["holdout"])
    return data["X"], data["y"]


def _direct(model_file: Path, x: np.ndarray, output: str = "label") -> np.ndarray:
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    return np.asarray(session.run([output], {"input": x.astype(np.float32)})[0])


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _load_npy(body: bytes) -> np.ndarray:
    return np.asarray(np.load(io.BytesIO(body), allow_pickle=False))


def _error(body: bytes) -> str:
    payload = json.loads(body)
    assert set(payload) == {"error"}
    return str(payload["error"])


# --- the contract ---------------------------------------------------------------------------------------------


def test_ping_and_metadata(mlp_server: Server, models_dir: Path) -> None:
    status, _, body = mlp_server.request("GET", "/ping")
    assert status == 200
    status, content_type, body = mlp_server.request("GET", "/metadata")
    assert status == 200
    assert content_type.startswith(JSON)
    meta = json.loads(body)
    assert meta["input"] == {"name": "input", "dtype": "float32", "shape": [None, 64]}
    assert meta["output_names"] == ["label", "probabilities"]
    assert meta["output_name"] == "label"
    assert meta["providers"] == ["CPUExecutionProvider"]
    assert meta["inference"] == "inline"
    assert Path(meta["model_path"]) == models_dir / "mlp" / "1" / "model.onnx"


def test_npy_batch_of_the_whole_holdout_set(
    mlp_server: Server, demo_models: dict[str, Any], models_dir: Path, holdout: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = holdout
    status, content_type, body = mlp_server.post(_npy(x), NPY)
    assert status == 200
    assert content_type == NPY
    labels = _load_npy(body)
    assert labels.dtype == np.int64
    assert labels.shape == (len(x),)
    np.testing.assert_array_equal(labels, _direct(models_dir / "mlp" / "1" / "model.onnx", x))
    mlp_entry = next(m for m in demo_models["models"] if m["name"] == "mlp")
    assert float(np.mean(labels == y)) == pytest.approx(mlp_entry["accuracy"], abs=1e-6)
    assert mlp_entry["onnx_sklearn_mismatches"] <= 1  # the build checked ONNX Runtime against scikit-learn


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_npy_batches_answer_one_row_per_row(
    mlp_server: Server, models_dir: Path, holdout: tuple[np.ndarray, np.ndarray], rows: int
) -> None:
    x = holdout[0][100 : 100 + rows]
    status, _, body = mlp_server.post(_npy(x), NPY)
    assert status == 200
    np.testing.assert_array_equal(_load_npy(body), _direct(models_dir / "mlp" / "1" / "model.onnx", x))


def test_npy_of_another_numeric_dtype_is_cast(mlp_server: Server, holdout: tuple[np.ndarray, np.ndarray]) -> None:
    x = holdout[0][:16]
    _, _, as_float32 = mlp_server.post(_npy(x), NPY)
    for dtype in (np.float64, np.int64, np.uint8):
        status, _, body = mlp_server.post(_npy(x.astype(dtype)), NPY)
        assert status == 200
        assert body == as_float32


@pytest.mark.parametrize("key", ["instances", "inputs"])
def test_json_batch(mlp_server: Server, models_dir: Path, holdout: tuple[np.ndarray, np.ndarray], key: str) -> None:
    x = holdout[0][:32]
    status, content_type, body = mlp_server.post(json.dumps({key: x.tolist()}).encode(), JSON)
    assert status == 200
    assert content_type == JSON
    predictions = json.loads(body)["predictions"]
    assert predictions == _direct(models_dir / "mlp" / "1" / "model.onnx", x).tolist()


def test_accept_chooses_the_answer_format(mlp_server: Server, holdout: tuple[np.ndarray, np.ndarray]) -> None:
    x = holdout[0][:5]
    status, content_type, body = mlp_server.post(_npy(x), NPY, accept=JSON)
    assert (status, content_type) == (200, JSON)
    npy_as_json = json.loads(body)["predictions"]
    status, content_type, body = mlp_server.post(json.dumps({"instances": x.tolist()}).encode(), JSON, accept=NPY)
    assert (status, content_type) == (200, NPY)
    assert _load_npy(body).tolist() == npy_as_json
    status, content_type, _ = mlp_server.post(_npy(x), "application/x-npy; charset=binary", accept="*/*")
    assert (status, content_type) == (200, NPY)


def test_concurrent_requests_each_get_their_own_rows(
    mlp_server: Server, models_dir: Path, holdout: tuple[np.ndarray, np.ndarray]
) -> None:
    x = holdout[0]
    expected = _direct(models_dir / "mlp" / "1" / "model.onnx", x)
    starts = list(range(0, 400, 8))

    def call(start: int) -> np.ndarray:
        status, _, body = mlp_server.post(_npy(x[start : start + 1 + start % 5]), NPY)
        assert status == 200
        return _load_npy(body)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, starts))
    for start, answer in zip(starts, answers, strict=True):
        np.testing.assert_array_equal(answer, expected[start : start + 1 + start % 5])


def test_worker_thread_mode_and_a_chosen_output(
    servers: dict[str, Server], models_dir: Path, holdout: tuple[np.ndarray, np.ndarray]
) -> None:
    forest = servers["forest"]
    x = holdout[0][:50]
    meta = json.loads(forest.request("GET", "/metadata")[2])
    assert (meta["inference"], meta["output_name"]) == ("thread", "probabilities")
    status, _, body = forest.post(_npy(x), NPY)
    assert status == 200
    proba = _load_npy(body)
    assert proba.shape == (50, 10)
    assert proba.dtype == np.float32
    np.testing.assert_allclose(proba, _direct(models_dir / "forest" / "1" / "model.onnx", x, "probabilities"))
    status, _, body = forest.post(_npy(x[:, :10]), NPY)
    assert status == 400
    assert _error(body) == "expected shape [N, 64] float32, got shape [50, 10] float32"


# --- errors -----------------------------------------------------------------------------------------------------


def _npy_header(descr: str, shape: str) -> bytes:
    """A version 1.0 .npy header of this dtype and shape (no data)."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1")


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b"1,2,3", "text/csv", 415, "unsupported content type 'text/csv'; send application/x-npy or application/json"),
        (b"1,2,3", "", 415, "unsupported content type '(none)'"),
        (_npy(np.zeros((2, 63), np.float32)), NPY, 400, "expected shape [N, 64] float32, got shape [2, 63] float32"),
        (_npy(np.zeros(64, np.float32)), NPY, 400, "expected shape [N, 64] float32, got shape [64] float32"),
        (_npy(np.zeros((0, 64), np.float32)), NPY, 400, "expected shape [N, 64] float32 with at least one row"),
        (_npy(np.full((1, 64), "7")), NPY, 400, "expected shape [N, 64] float32, got string values"),
        (b"not numpy", NPY, 400, "body is not a .npy array"),
        (_npy(np.zeros((4, 64), np.float32))[:-8], NPY, 400, "header says shape [4, 64] float32"),
        (b"{not json", JSON, 400, "body is not valid JSON (Expecting property name enclosed in double quotes"),
        (b'{"rows": [[1]]}', JSON, 400, 'expected a JSON object {"instances": [...]} (or "inputs"), a list of rows'),
        (b'{"instances": [[1, 2], [3]]}', JSON, 400, "expected shape [N, 64] float32, got rows of different lengths"),
        (b'{"instances": [[1, 2, 3]]}', JSON, 400, "expected shape [N, 64] float32, got shape [1, 3] int64"),
        (json.dumps({"instances": [["a"] * 64]}).encode(), JSON, 400, "got string values"),
        # malformed bodies that answered 500 (and tripped the endpoint's 5xx alarm): a v2 header cut short, a shape
        # numpy cannot make, a dtype with a shape of its own, JSON nested past the recursion limit
        (b"\x93NUMPY\x02\x00\x10\x00", NPY, 400, "the body ends inside it"),
        (_npy_header("<f4", "(1000000000000000000000000000000, 0)"), NPY, 400, "malformed .npy header: shape"),
        (_npy_header("(64,)<f4", "(1,)") + bytes(256), NPY, 400, "a dtype of plain values is expected"),
        (b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", JSON, 400, "nested too deeply"),
        # found by a new user: both keys (the inputs' three rows were dropped for the instances' one), and a value
        # that is finite as sent and infinite as float32 (the cast is not safe)
        (json.dumps({"inputs": [[0.0] * 64] * 3, "instances": [[0.0] * 64]}).encode(), JSON, 400, "got both"),
        (json.dumps({"instances": [[1e300] + [0.0] * 63]}).encode(), JSON, 400, "a value out of float32's range"),
        (_npy(np.full((1, 64), -1e39)), NPY, 400, "a value out of float32's range (+-3.403e+38)"),
    ],
)
def test_a_wrong_request_gets_a_4xx_naming_the_expectation(
    mlp_server: Server, body: bytes, content_type: str, status: int, message: str
) -> None:
    got_status, got_type, got_body = mlp_server.post(body, content_type)
    assert got_status == status
    assert got_type == JSON
    assert message in _error(got_body)


def test_other_methods_and_paths(mlp_server: Server) -> None:
    assert mlp_server.request("GET", "/invocations")[0] == 405
    # every error is {"error": ...} (a 404 and a 405 of the router were text/plain)
    for method, path, status in (("GET", "/nowhere", 404), ("POST", "/ping", 405), ("DELETE", "/metadata", 405)):
        got, media, body = mlp_server.request(method, path)
        assert (got, media) == (status, JSON)
        assert f"{method} {path}: " in _error(body) and "POST /invocations" in _error(body)
    # a NaN as sent is not a cast's doing: it reaches the model (a tree model may take it as missing)
    assert mlp_server.post(_npy(np.full((1, 64), np.nan)), NPY)[0] == 200
    # The server still serves after every error above.
    status, _, body = mlp_server.post(_npy(np.zeros((1, 64), np.float32)), NPY)
    assert status == 200
    assert _load_npy(body).shape == (1,)


# --- lifecycle --------------------------------------------------------------------------------------------------


def test_a_missing_model_ends_the_process_with_a_message(tmp_path: Path) -> None:
    server = _start(tmp_path / "no-such-model", tmp_path / "missing.log")
    assert server.proc.wait(timeout=30) == 2
    assert "does not exist" in server.log.read_text()


def test_the_server_stops_cleanly_on_sigterm(models_dir: Path, tmp_path: Path) -> None:
    server = _start(models_dir / "tree" / "1", tmp_path / "tree.log", "--threads", "1")
    try:
        _wait_ready(server)
        assert server.post(_npy(np.zeros((2, 64), np.float32)), NPY)[0] == 200
    finally:
        returncode = _stop(server)
    # uvicorn shuts down gracefully, then re-raises the signal it caught, as a process stopped by it should.
    assert returncode in (0, -signal.SIGTERM)
    log = server.log.read_text()
    assert "Application shutdown complete" in log
    assert "Finished server process" in log
    assert "Traceback" not in log


def test_the_batchers_client_against_the_server(
    mlp_server: Server, models_dir: Path, holdout: tuple[np.ndarray, np.ndarray]
) -> None:
    """``HttpModelEndpoint`` (one write a request, kept-alive connections) gets the model's own answers."""
    import urllib3

    from clipper.adapters.endpoints import HttpModelEndpoint
    from clipper.errors import BatchRefused, EndpointError

    endpoint = HttpModelEndpoint(f"http://127.0.0.1:{mlp_server.port}", urllib3.PoolManager(), timeout_s=10)
    expected = _direct(models_dir / "mlp" / "1" / "model.onnx", holdout[0][:64])
    for rows in (1, 7, 64, 1):
        assert endpoint.predict(holdout[0][:rows]) == expected[:rows].tolist()
    with pytest.raises(BatchRefused, match="endpoint answered 400"):  # the batcher then sends each query alone
        endpoint.predict(np.zeros((2, 3), np.float32))
    assert endpoint.predict(holdout[0][:2]) == expected[:2].tolist()  # the connection survives a 400
    gone = HttpModelEndpoint(f"http://127.0.0.1:{_free_port()}", urllib3.PoolManager(), timeout_s=2)
    with pytest.raises(EndpointError) as unreachable:  # nothing listens: not a refusal of the batch's inputs
        gone.predict(holdout[0][:2])
    assert not isinstance(unreachable.value, BatchRefused)


def test_a_chunked_body_over_the_limit_is_refused_in_one_piece_too(models_dir: Path, tmp_path: Path) -> None:
    """Found by a new user: a body without Content-Length (chunked) whose whole came in the first read passed the
    --max-body-bytes check (only the later pieces were counted)."""
    server = _start(models_dir / "mlp" / "1", tmp_path / "limit.log", "--max-body-bytes", "2000")
    try:
        _wait_ready(server)
        body = json.dumps({"instances": [[0.0] * 64] * 12}).encode()  # ~3 KB
        assert len(body) > 2000
        for pieces in ([body], [body[:1000], body[1000:]]):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                head = "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                chunks = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces)
                sock.sendall(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
                answer = sock.makefile("rb").readline()
            assert answer.split()[1] == b"413", (pieces, answer)
    finally:
        _stop(server)


def test_the_client_sends_a_batch_the_server_refuses_as_too_large_in_parts(
    models_dir: Path, holdout: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    """The server's --max-body-bytes (a batch of large rows, e.g. 3x224x224 images, over it): the batcher's HTTP
    client sends the batch in halves until each fits (one batch's error, retried whole, before); a single row over
    it is that row's error, which the batcher answers alone."""
    from clipper.adapters.endpoints import HttpModelEndpoint
    from clipper.errors import RowTooLarge

    x, _ = holdout
    server = _start(models_dir / "mlp" / "1", tmp_path / "small.log", "--max-body-bytes", "2200")  # ~8 rows
    try:
        _wait_ready(server)
        endpoint = HttpModelEndpoint(f"http://127.0.0.1:{server.port}", urllib3.PoolManager())
        rows = x[:40].astype(np.float32)
        expected = _direct(models_dir / "mlp" / "1" / "model.onnx", rows).tolist()
        assert endpoint.predict(rows) == expected
        wide = _start(models_dir / "mlp" / "1", tmp_path / "tiny.log", "--max-body-bytes", "100")
        try:
            _wait_ready(wide)
            tiny = HttpModelEndpoint(f"http://127.0.0.1:{wide.port}", urllib3.PoolManager())
            with pytest.raises(RowTooLarge) as e:
                tiny.predict(rows[:3])
            assert e.value.index == 0
        finally:
            _stop(wide)
    finally:
        _stop(server)
