"""Model endpoint clients: the ONNX Runtime server over HTTP (local stack, or a host next to the GPU),
and SageMaker's ``InvokeEndpoint`` on AWS. Numeric batches travel as ``.npy``; strings and bytes as JSON.

An endpoint address is a URL (``http://127.0.0.1:9001``) or ``sagemaker:<endpoint-name>``.

A plain ``http://`` endpoint (the model server beside the batcher) is called through ``KeepAliveHttp``: a
minimal HTTP/1.1 client that writes each request (line, headers and body) with one ``sendall`` on a kept-alive
connection. urllib3 writes the headers and the body separately and adds ~0.1 ms of Python a request; with
the batcher and the server on one core, each write wakes the server, and a call to the MLP took ~770 us
through urllib3 against ~340 us this way (batches of 16, both pinned to one core, measured back to back).
``https://`` addresses go through urllib3.
"""

from __future__ import annotations

import base64
import io
import json
import select
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlsplit

import numpy as np
import orjson
import urllib3
from botocore.exceptions import BotoCoreError, ClientError

from clipper.core.tensors import decode_npy, encode_npy
from clipper.core.validation import Rows
from clipper.errors import BatchRefused, EndpointError, MalformedMessage, RowTooLarge, Unavailable
from clipper.ports import ModelEndpoint, Registry

if TYPE_CHECKING:
    from mypy_boto3_sagemaker_runtime import SageMakerRuntimeClient
else:
    SageMakerRuntimeClient = Any

NPY = "application/x-npy"
# what an endpoint answers when it ran and refused the batch: its input checks (400), the model failing on it (500)
REFUSING_STATUSES = (400, 500)
JSON = "application/json"


def encode_batch(rows: Rows) -> tuple[bytes, str]:
    if isinstance(rows, np.ndarray):
        return encode_npy(rows), NPY
    items = [base64.b64encode(r).decode() if isinstance(r, bytes) else r for r in rows]
    return json.dumps({"instances": items}).encode(), JSON


def decode_outputs(body: bytes, content_type: str, expected: int) -> list[Any]:
    npy = content_type.startswith(NPY)
    checked = npy  # numbers of the dtypes inputs take: what the replies carry as they are
    try:
        if npy:
            try:
                outputs: list[Any] = decode_npy(body).tolist()
            except MalformedMessage:  # an output dtype no input takes (float16, strings): numpy's reader, no pickle
                outputs, checked = np.load(io.BytesIO(body), allow_pickle=False).tolist(), False
        else:
            outputs = json.loads(body)["predictions"]
    except (MalformedMessage, ValueError, KeyError, TypeError, OSError) as e:
        raise EndpointError(f"undecodable endpoint answer ({content_type}): {e}") from e
    if not isinstance(outputs, list):  # {"predictions": null}, a number, an object: not one output a row
        raise EndpointError(f"endpoint answered predictions as {type(outputs).__name__}, not a list")
    if len(outputs) != expected:
        raise EndpointError(f"endpoint returned {len(outputs)} outputs for {expected} inputs")
    if not checked:
        try:  # what the replies and the cache carry (orjson): an integer past 64 bits, nesting past 254 levels
            orjson.dumps(outputs)
        except TypeError as e:
            raise EndpointError(f"endpoint answered an output JSON cannot carry: {e}") from e
    return outputs


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", body[:200]))
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


class _Stale(Exception):
    """A kept-alive connection the server had closed: the request is sent again on a fresh one."""


class KeepAliveHttp:
    """POST to one plain-HTTP host over kept-alive connections (thread-safe: a connection per caller).

    Each request is written with one ``sendall``. A response needs ``Content-Length`` or chunked encoding (or
    ends with the connection). A request on a reused connection that the server had closed meanwhile is sent
    once more on a fresh connection (a prediction has no side effect); anything else is an EndpointError.
    """

    def __init__(self, host: str, port: int, timeout_s: float, connect_timeout_s: float = 1.0) -> None:
        self._address = (host, port)
        self._host_header = f"{host}:{port}"
        self._timeout = timeout_s
        self._connect_timeout = connect_timeout_s
        self._idle: list[tuple[socket.socket, BinaryIO]] = []
        self._lock = threading.Lock()

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        lines = [f"POST {path} HTTP/1.1", f"Host: {self._host_header}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin1") + body
        conn = self._take()
        if conn is not None:
            try:
                return self._exchange(conn, request, reused=True)
            except _Stale:
                pass
        return self._exchange(self._connect(), request, reused=False)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            _close(conn)

    def _take(self) -> tuple[socket.socket, BinaryIO] | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                sock, reader = self._idle.pop()
            # An idle connection has nothing to read unless the server closed it (or it is out of step): then
            # it is not reused. poll(), not select(), which fails on descriptors >= 1024.
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            if not poller.poll(0):
                return sock, reader
            _close((sock, reader))

    def _connect(self) -> tuple[socket.socket, BinaryIO]:
        try:
            sock = socket.create_connection(self._address, timeout=self._connect_timeout)
        except OSError as e:
            raise EndpointError(f"endpoint unreachable at {self._host_header}: {type(e).__name__}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self._timeout)
        return sock, sock.makefile("rb")

    def _exchange(
        self, conn: tuple[socket.socket, BinaryIO], request: bytes, reused: bool
    ) -> tuple[int, dict[str, str], bytes]:
        sock, reader = conn
        keep = False
        try:
            try:
                sock.sendall(request)
                status_line = reader.readline(65537)
            except TimeoutError:
                raise
            except OSError as e:
                if reused:
                    raise _Stale from e
                raise
            if not status_line:
                if reused:
                    raise _Stale
                raise EndpointError(f"endpoint at {self._host_header} closed the connection without answering")
            status, headers = _parse_head(status_line, reader)
            data = _read_body(reader, headers)
            keep = (
                status_line.startswith(b"HTTP/1.1")  # HTTP/1.0 closes unless it says otherwise: never reused
                and headers.get("connection", "").lower() != "close"
                and ("content-length" in headers or "chunked" in headers.get("transfer-encoding", ""))
            )
            return status, headers, data
        except TimeoutError as e:
            raise EndpointError(f"endpoint at {self._host_header} did not answer within {self._timeout:g} s") from e
        except (OSError, ValueError) as e:
            raise EndpointError(f"endpoint at {self._host_header}: {type(e).__name__}: {e}") from e
        finally:
            if keep:
                with self._lock:
                    self._idle.append(conn)
            else:
                _close(conn)


def _close(conn: tuple[socket.socket, BinaryIO]) -> None:
    sock, reader = conn
    reader.close()
    sock.close()


def _parse_head(status_line: bytes, reader: BinaryIO) -> tuple[int, dict[str, str]]:
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while True:
        line = reader.readline(65537)
        if line in (b"\r\n", b"\n"):
            return int(parts[1]), headers
        if not line:
            raise ValueError("the connection closed in the response headers")
        name, sep, value = line.decode("latin1").partition(":")
        if not sep:
            raise ValueError(f"malformed response header {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()


def _read_body(reader: BinaryIO, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        while True:
            size = int(reader.readline(1024).split(b";")[0].strip(), 16)
            if size == 0:
                while reader.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(_read_exactly(reader, size))
            reader.readline(3)
    if "content-length" in headers:
        return _read_exactly(reader, int(headers["content-length"]))
    return reader.read()


def _read_exactly(reader: BinaryIO, size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise ValueError(f"the connection closed {size - len(data)} bytes before the end of the response")
    return data


def _in_halves(predict: Callable[[Rows, int], list[Any]], rows: Rows, first: int) -> list[Any]:
    """A batch too large for one request, sent as two halves (``predict(rows, first)``: row ``first`` of the batch
    onwards), each halved again until it fits: a few calls for the rare oversized batch."""
    half = len(rows) // 2
    return predict(rows[:half], first) + predict(rows[half:], first + half)


class HttpModelEndpoint:
    """The model server over HTTP: ``KeepAliveHttp`` for ``http://`` addresses, ``pool`` (urllib3) for
    ``https://``."""

    def __init__(self, url: str, pool: urllib3.PoolManager, timeout_s: float = 30.0) -> None:
        self._url = url.rstrip("/") + "/invocations"
        self._pool = pool
        self._timeout = timeout_s
        parts = urlsplit(self._url)
        self._direct: KeepAliveHttp | None = None
        if parts.scheme == "http" and parts.hostname:
            self._direct = KeepAliveHttp(parts.hostname, parts.port or 80, timeout_s)
            self._path = parts.path

    def predict(self, rows: Rows) -> list[Any]:
        return self._predict(rows, 0)

    def _predict(self, rows: Rows, first: int) -> list[Any]:
        """``rows``, row ``first`` of the batch onwards. A batch the server refuses as too large (413: its
        --max-body-bytes) is sent in halves until each part fits; a single row it refuses is that row's error."""
        body, content_type = encode_batch(rows)
        headers = {"Content-Type": content_type, "Accept": content_type}
        if self._direct is not None:
            status, response_headers, data = self._direct.post(self._path, body, headers)
            response_type = response_headers.get("content-type", JSON)
        else:
            try:
                resp = self._pool.request(
                    "POST",
                    self._url,
                    body=body,
                    headers=headers,
                    timeout=urllib3.Timeout(connect=1.0, read=self._timeout),
                    retries=False,
                )
            except urllib3.exceptions.HTTPError as e:
                raise EndpointError(f"endpoint unreachable at {self._url}: {type(e).__name__}") from e
            status, data, response_type = resp.status, resp.data, resp.headers.get("Content-Type", JSON)
        if status == 413:
            if len(rows) == 1:
                raise RowTooLarge(first, f"endpoint {self._url}: an input of {len(body)} bytes: {_error_text(data)}")
            return _in_halves(self._predict, rows, first)
        if status in REFUSING_STATUSES:
            raise BatchRefused(f"endpoint answered {status}: {_error_text(data)}")
        if status != 200:
            raise EndpointError(f"endpoint answered {status}: {_error_text(data)}")
        return decode_outputs(data, response_type, len(rows))


# A real-time endpoint refuses a request body over 6 MB (InvokeEndpoint's payload limit); a batch of large inputs
# (several claim-checked ones, or hundreds of CNN images) is sent in parts under it.
MAX_INVOKE_BYTES = 6 * 1024 * 1024


class SageMakerModelEndpoint:
    def __init__(self, client: SageMakerRuntimeClient, endpoint_name: str, max_bytes: int = MAX_INVOKE_BYTES) -> None:
        self._client = client
        self._name = endpoint_name
        self._max_bytes = max_bytes

    def predict(self, rows: Rows) -> list[Any]:
        return self._predict(rows, 0)

    def _predict(self, rows: Rows, first: int) -> list[Any]:
        """``rows``, row ``first`` of the batch onwards."""
        body, content_type = encode_batch(rows)
        if len(body) > self._max_bytes:
            if len(rows) == 1:
                raise RowTooLarge(
                    first,
                    f"sagemaker endpoint {self._name}: an input of {len(body)} bytes encoded, over InvokeEndpoint's "
                    f"{self._max_bytes}",
                )
            return _in_halves(self._predict, rows, first)
        try:
            resp = self._client.invoke_endpoint(
                EndpointName=self._name, Body=body, ContentType=content_type, Accept=content_type
            )
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code == "ModelError" and e.response.get("OriginalStatusCode") in REFUSING_STATUSES:
                said = _error_text(str(e.response.get("OriginalMessage", "")).encode())
                raise BatchRefused(f"sagemaker endpoint {self._name}: {code}: {said}") from e
            raise EndpointError(f"sagemaker endpoint {self._name}: {code}") from e
        except BotoCoreError as e:
            raise EndpointError(f"sagemaker endpoint {self._name}: {type(e).__name__}") from e
        return decode_outputs(resp["Body"].read(), resp.get("ContentType", JSON), len(rows))


class EndpointFactory:
    """Builds (once per address) the client for an endpoint address."""

    def __init__(
        self, pool: urllib3.PoolManager, sagemaker: SageMakerRuntimeClient | None = None, timeout_s: float = 30.0
    ) -> None:
        self._pool = pool
        self._sagemaker = sagemaker  # its timeout is its client's (read_timeout)
        self._timeout = timeout_s  # an HTTP endpoint's call
        self._built: dict[str, ModelEndpoint] = {}

    def for_address(self, address: str) -> ModelEndpoint:
        endpoint = self._built.get(address)
        if endpoint is None:
            if address.startswith("sagemaker:"):
                if self._sagemaker is None:
                    raise Unavailable("no SageMaker runtime client configured")
                endpoint = SageMakerModelEndpoint(self._sagemaker, address.removeprefix("sagemaker:"))
            elif address.startswith(("http://", "https://")):
                endpoint = HttpModelEndpoint(address, self._pool, self._timeout)
            else:
                raise EndpointError(f"unsupported endpoint address {address!r}")
            self._built[address] = endpoint
        return endpoint


class RegistryEndpointResolver:
    """Resolves (model, version) to its endpoint through the registry (the Lambda driver's way)."""

    def __init__(self, registry: Registry, factory: EndpointFactory) -> None:
        self._registry = registry
        self._factory = factory

    def endpoint_for(self, model: str, version: str) -> ModelEndpoint:
        return self._factory.for_address(self._registry.get_version(model, version).endpoint)


class FixedEndpointResolver:
    """One endpoint for every message (the long-poll driver beside its model server)."""

    def __init__(self, endpoint: ModelEndpoint) -> None:
        self._endpoint = endpoint

    def endpoint_for(self, model: str, version: str) -> ModelEndpoint:
        return self._endpoint
