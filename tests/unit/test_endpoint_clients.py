"""The endpoint clients' wire format: SageMaker's InvokeEndpoint (botocore's Stubber checks the request
against the service model; moto answers canned bodies), and how an address picks its client."""

from __future__ import annotations

import io

import boto3
import numpy as np
import pytest
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

from clipper.adapters.endpoints import EndpointFactory, SageMakerModelEndpoint
from clipper.core.tensors import encode_npy
from clipper.errors import EndpointError

pytestmark = pytest.mark.unit


@pytest.fixture
def runtime(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    client = boto3.client("sagemaker-runtime", region_name="us-east-1")
    with Stubber(client) as stub:
        yield client, stub


def body(data: bytes) -> StreamingBody:
    return StreamingBody(io.BytesIO(data), len(data))


def test_sagemaker_endpoint_sends_npy_and_reads_npy(runtime):
    client, stub = runtime
    rows = np.arange(128, dtype=np.float32).reshape(2, 64)
    answer = encode_npy(np.array([3, 7], dtype=np.int64))
    stub.add_response(
        "invoke_endpoint",
        {"Body": body(answer), "ContentType": "application/x-npy"},
        {"EndpointName": "clipper-mlp", "Body": ANY, "ContentType": "application/x-npy", "Accept": "application/x-npy"},
    )
    assert SageMakerModelEndpoint(client, "clipper-mlp").predict(rows) == [3, 7]
    stub.assert_no_pending_responses()


def test_sagemaker_strings_travel_as_json(runtime):
    client, stub = runtime
    stub.add_response(
        "invoke_endpoint",
        {"Body": body(b'{"predictions": ["pos", "neg"]}'), "ContentType": "application/json"},
        {
            "EndpointName": "e",
            "Body": b'{"instances": ["good", "bad"]}',
            "ContentType": "application/json",
            "Accept": "application/json",
        },
    )
    assert SageMakerModelEndpoint(client, "e").predict(["good", "bad"]) == ["pos", "neg"]


def test_sagemaker_errors_and_wrong_counts_fail_the_batch(runtime):
    client, stub = runtime
    stub.add_client_error("invoke_endpoint", service_error_code="ModelError", http_status_code=424)
    with pytest.raises(EndpointError, match="ModelError"):
        SageMakerModelEndpoint(client, "e").predict(np.zeros((1, 64), np.float32))
    stub.add_response("invoke_endpoint", {"Body": body(encode_npy(np.array([1]))), "ContentType": "application/x-npy"})
    with pytest.raises(EndpointError, match="1 outputs for 2 inputs"):
        SageMakerModelEndpoint(client, "e").predict(np.zeros((2, 64), np.float32))


def test_a_sagemaker_model_error_of_the_containers_400_or_500_is_a_refusal_of_the_batch(runtime):
    """The batcher sends a refused batch again in halves (``BatchRefused``); a container that cannot be reached
    or is busy (another status) fails the batch once, as any endpoint error."""
    from clipper.errors import BatchRefused

    client, stub = runtime
    for status, refusal in ((400, True), (500, True), (503, False)):
        stub.add_client_error(
            "invoke_endpoint",
            service_error_code="ModelError",
            http_status_code=424,
            modeled_fields={"OriginalStatusCode": status, "OriginalMessage": '{"error": "idx=9 out of bounds"}'},
        )
        with pytest.raises(EndpointError) as failed:
            SageMakerModelEndpoint(client, "e").predict(np.zeros((2, 64), np.float32))
        assert isinstance(failed.value, BatchRefused) is refusal, (status, failed.value)
        assert ("idx=9 out of bounds" in str(failed.value)) is refusal


def test_an_http_endpoints_400_or_500_is_a_refusal_and_a_503_is_not():
    import urllib3

    from clipper.adapters.endpoints import HttpModelEndpoint
    from clipper.errors import BatchRefused

    endpoint = HttpModelEndpoint("http://127.0.0.1:1", urllib3.PoolManager())
    for status, refusal in ((400, True), (500, True), (503, False), (429, False)):
        answer = (status, {"content-type": "application/json"}, b'{"error": "model failed on a batch"}')
        endpoint._direct.post = lambda *_, answer=answer: answer  # type: ignore[union-attr,method-assign]
        with pytest.raises(EndpointError, match=f"endpoint answered {status}: model failed") as failed:
            endpoint.predict(np.zeros((2, 64), np.float32))
        assert isinstance(failed.value, BatchRefused) is refusal, status


def test_factory_picks_the_client_by_address(runtime):
    import urllib3

    client, _ = runtime
    factory = EndpointFactory(urllib3.PoolManager(), client)
    assert isinstance(factory.for_address("sagemaker:clipper-mlp"), SageMakerModelEndpoint)
    assert factory.for_address("http://127.0.0.1:1") is factory.for_address("http://127.0.0.1:1")
    with pytest.raises(EndpointError, match="unsupported"):
        factory.for_address("ftp://x")


def test_a_batch_over_invoke_endpoints_6_mb_goes_in_parts_under_it(runtime):
    """InvokeEndpoint refuses a body over 6 MB (the service model says so: the Stubber checks it too): four rows
    of 2.4 MB each go as two calls of two, their outputs in order; one row over the limit is an endpoint error."""
    client, stub = runtime
    rows = np.zeros((4, 600_000), np.float32)
    for outputs in ([1, 2], [3, 4]):
        stub.add_response(
            "invoke_endpoint",
            {"Body": body(encode_npy(np.array(outputs, dtype=np.int64))), "ContentType": "application/x-npy"},
        )
    assert SageMakerModelEndpoint(client, "e").predict(rows) == [1, 2, 3, 4]
    stub.assert_no_pending_responses()
    with pytest.raises(EndpointError, match="over InvokeEndpoint"):
        SageMakerModelEndpoint(client, "e").predict(np.zeros((1, 1_600_000), np.float32))


def test_npy_answers_of_output_dtypes_no_input_takes_are_read(runtime):
    """A float16 model (a GPU model exported in half precision) or a classifier with string labels answers .npy in
    its own dtype; numpy's reader takes them (without pickle), and their values travel as JSON does."""
    from clipper.adapters.endpoints import decode_outputs

    def npy(array: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        return buf.getvalue()

    assert decode_outputs(npy(np.array([0.5, 1.25], dtype=np.float16)), "application/x-npy", 2) == [0.5, 1.25]
    assert decode_outputs(npy(np.array(["cat", "dog"])), "application/x-npy", 2) == ["cat", "dog"]
    with pytest.raises(EndpointError, match="JSON cannot carry"):  # bytes: no JSON value for them
        decode_outputs(npy(np.array([b"\xff"], dtype="S1")), "application/x-npy", 1)
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(EndpointError, match="undecodable"):  # an object array needs pickle: refused
        decode_outputs(pickled.getvalue(), "application/x-npy", 1)
    with pytest.raises(EndpointError, match="undecodable"):
        decode_outputs(b"\x93NUMPY\x01\x00" + b"v" * 40, "application/x-npy", 1)


def test_an_http_endpoint_called_by_the_lambda_batcher_times_out_within_the_function():
    """The factory built HTTP endpoints with a fixed 30 s, whatever the settings, and the Lambda batcher's own
    timeout is 30 s by default: a hung model server stopped the function with nothing reported (no item
    failures, no EndpointErrors for the model stack's alarm). A hung endpoint now fails the call in time."""
    import socket
    import time

    import urllib3

    from clipper.settings import BatcherSettings

    tables = {"registry_table": "registry", "replies_table": "replies"}
    settings = BatcherSettings(function_timeout_s=3, **tables)  # type: ignore[arg-type]
    assert settings.endpoint_call_timeout_s == pytest.approx(1.4)  # 0.8 x 3 s - 1 s, under its 25 s
    assert BatcherSettings(**tables).endpoint_call_timeout_s == 25.0  # type: ignore[arg-type]  # not on Lambda
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(4)  # accepts (the kernel's backlog), never answers
    try:
        factory = EndpointFactory(urllib3.PoolManager(), None, settings.endpoint_call_timeout_s)
        endpoint = factory.for_address(f"http://127.0.0.1:{hung.getsockname()[1]}")
        started = time.monotonic()
        with pytest.raises(EndpointError):
            endpoint.predict(np.zeros((1, 4), dtype=np.float32))
        assert time.monotonic() - started < 3  # within the function's 3 s
    finally:
        hung.close()
