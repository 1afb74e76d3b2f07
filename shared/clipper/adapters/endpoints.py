"""Model endpoint clients: the ONNX Runtime server over HTTP (local stack, or a host next to the GPU),
and SageMaker's ``InvokeEndpoint`` on AWS. Numeric batches travel as ``.npy``; strings and bytes as JSON.

An endpoint address is a URL (``http://127.0.0.1:9001``) or ``sagemaker:<endpoint-name>``.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

import numpy as np
import urllib3
from botocore.exceptions import BotoCoreError, ClientError

from clipper.core.tensors import decode_npy, encode_npy
from clipper.core.validation import Rows
from clipper.errors import EndpointError, MalformedMessage, Unavailable
from clipper.ports import ModelEndpoint, Registry

if TYPE_CHECKING:
    from mypy_boto3_sagemaker_runtime import SageMakerRuntimeClient
else:
    SageMakerRuntimeClient = Any

NPY = "application/x-npy"
JSON = "application/json"


def encode_batch(rows: Rows) -> tuple[bytes, str]:
    if isinstance(rows, np.ndarray):
        return encode_npy(rows), NPY
    items = [base64.b64encode(r).decode() if isinstance(r, bytes) else r for r in rows]
    return json.dumps({"instances": items}).encode(), JSON


def decode_outputs(body: bytes, content_type: str, expected: int) -> list[Any]:
    try:
        if content_type.startswith(NPY):
            outputs: list[Any] = decode_npy(body).tolist()
        else:
            outputs = json.loads(body)["predictions"]
    except (MalformedMessage, ValueError, KeyError, TypeError) as e:
        raise EndpointError(f"undecodable endpoint answer ({content_type}): {e}") from e
    if len(outputs) != expected:
        raise EndpointError(f"endpoint returned {len(outputs)} outputs for {expected} inputs")
    return outputs


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", body[:200]))
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


class HttpModelEndpoint:
    def __init__(self, url: str, pool: urllib3.PoolManager, timeout_s: float = 30.0) -> None:
        self._url = url.rstrip("/") + "/invocations"
        self._pool = pool
        self._timeout = timeout_s

    def predict(self, rows: Rows) -> list[Any]:
        body, content_type = encode_batch(rows)
        try:
            resp = self._pool.request(
                "POST",
                self._url,
                body=body,
                headers={"Content-Type": content_type, "Accept": content_type},
                timeout=urllib3.Timeout(connect=1.0, read=self._timeout),
                retries=False,
            )
        except urllib3.exceptions.HTTPError as e:
            raise EndpointError(f"endpoint unreachable at {self._url}: {type(e).__name__}") from e
        if resp.status != 200:
            raise EndpointError(f"endpoint answered {resp.status}: {_error_text(resp.data)}")
        return decode_outputs(resp.data, resp.headers.get("Content-Type", JSON), len(rows))


class SageMakerModelEndpoint:
    def __init__(self, client: SageMakerRuntimeClient, endpoint_name: str) -> None:
        self._client = client
        self._name = endpoint_name

    def predict(self, rows: Rows) -> list[Any]:
        body, content_type = encode_batch(rows)
        try:
            resp = self._client.invoke_endpoint(
                EndpointName=self._name, Body=body, ContentType=content_type, Accept=content_type
            )
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            raise EndpointError(f"sagemaker endpoint {self._name}: {code}") from e
        except BotoCoreError as e:
            raise EndpointError(f"sagemaker endpoint {self._name}: {type(e).__name__}") from e
        return decode_outputs(resp["Body"].read(), resp.get("ContentType", JSON), len(rows))


class EndpointFactory:
    """Builds (once per address) the client for an endpoint address."""

    def __init__(self, pool: urllib3.PoolManager, sagemaker: SageMakerRuntimeClient | None = None) -> None:
        self._pool = pool
        self._sagemaker = sagemaker
        self._built: dict[str, ModelEndpoint] = {}

    def for_address(self, address: str) -> ModelEndpoint:
        endpoint = self._built.get(address)
        if endpoint is None:
            if address.startswith("sagemaker:"):
                if self._sagemaker is None:
                    raise Unavailable("no SageMaker runtime client configured")
                endpoint = SageMakerModelEndpoint(self._sagemaker, address.removeprefix("sagemaker:"))
            elif address.startswith(("http://", "https://")):
                endpoint = HttpModelEndpoint(address, self._pool)
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
