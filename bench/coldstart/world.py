"""The moto server, the endpoint and the batcher that a cold start's first events travel through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.coldstart.config import ENDPOINT_PKG, ROOT
from bench.coldstart.procs import free_port, http_get, stop_process


class World:
    def __init__(self, tmp: Path, model_path: str) -> None:
        self.tmp = tmp
        self.model_path = model_path
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env: dict[str, str] = {}
        self.counter = 0

    def spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        logfile = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115  (kept open by the child)
        proc = subprocess.Popen(cmd, env=env, stdout=logfile, stderr=subprocess.STDOUT, cwd=ROOT)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)

    def start(self) -> None:
        import boto3
        import numpy as np

        base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
        moto_port = free_port()
        moto = self.spawn("moto", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)], base)
        self._wait(lambda: http_get(moto_port, "/moto-api/")[0] == 200, moto, "moto server")
        aws = {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{moto_port}",
        }
        os.environ.update(aws)
        os.environ.pop("AWS_PROFILE", None)
        dynamodb, sqs, s3 = boto3.client("dynamodb"), boto3.client("sqs"), boto3.client("s3")
        from tests.integration.conftest import create_queue, create_tables

        create_tables(dynamodb, "cs-registry", "cs-replies")
        for table, keys in (("cs-cache", ("key",)), ("cs-selection", ("pk", "sk"))):
            dynamodb.create_table(
                TableName=table,
                KeySchema=[{"AttributeName": k, "KeyType": t} for k, t in zip(keys, ("HASH", "RANGE"), strict=False)],
                AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in keys],
                BillingMode="PAY_PER_REQUEST",
            )
        s3.create_bucket(Bucket="cs-models")
        queue_url, _ = create_queue(sqs, "cs-model-mlp")
        feedback_url, _ = create_queue(sqs, "cs-feedback")
        self.queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        self.feedback_arn = sqs.get_queue_attributes(QueueUrl=feedback_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        self.admin_token = uuid.uuid4().hex
        self.env = {
            **base,
            **aws,
            "AWS_LAMBDA_FUNCTION_NAME": "coldstart",
            "POWERTOOLS_SERVICE_NAME": "clipper",
            "POWERTOOLS_METRICS_NAMESPACE": "Clipper",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
            "CLIPPER_REGISTRY_TABLE": "cs-registry",
            "CLIPPER_REPLIES_TABLE": "cs-replies",
            "CLIPPER_CACHE_TABLE": "cs-cache",
            "CLIPPER_SELECTION_TABLE": "cs-selection",
            "CLIPPER_MODEL_BUCKET": "cs-models",
            "CLIPPER_FEEDBACK_QUEUE_URL": feedback_url,
            "CLIPPER_ADMIN_TOKEN": self.admin_token,
            "CS_MODEL_PATH": self.model_path,
        }
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("CLIPPER_")})

        # the model endpoint and a long-poll batcher answer the frontend's queries
        port = free_port()
        env = {**self.env, "PYTHONPATH": str(ENDPOINT_PKG)}
        cmd = [sys.executable, "-m", "clipper_endpoint", "--model-path", self.model_path, "--host", "127.0.0.1"]
        endpoint = self.spawn("endpoint", [*cmd, "--port", str(port)], env)
        self._wait(lambda: http_get(port, "/ping")[0] == 200, endpoint, "endpoint server")
        endpoint_url = f"http://127.0.0.1:{port}"
        longpoll = [sys.executable, "-m", "clipper.entrypoints.batcher", "--queue-url", queue_url]
        longpoll += ["--endpoint-url", endpoint_url, "--slo-ms", "500", "--log-level", "WARNING"]
        self.spawn("batcher", [*longpoll, "--model", "mlp", "--version", "1"], self.env)

        from clipper.adapters.dynamodb_registry import DynamoDBRegistry
        from clipper.core.domain import Application, InputType, ModelVersion

        registry = DynamoDBRegistry(dynamodb, "cs-registry")
        registry.put_app(Application("digits", InputType.FLOATS, "-1", 2_000_000, (64,)))
        registry.put_app(Application("digits-exp3", InputType.FLOATS, "-1", 2_000_000, (64,), policy="exp3"))
        registry.put_version(ModelVersion("mlp", "1", InputType.FLOATS, queue_url, endpoint_url, (64,)), activate=True)
        registry.link("digits", "mlp")
        registry.link("digits-exp3", "mlp")

        from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
        from clipper.settings import FrontendSettings
        from clipper.wiring import build_query_processor

        self.s3 = s3
        self.processor = build_query_processor(FrontendSettings(), dynamodb=dynamodb, sqs=sqs, s3=s3)  # type: ignore[call-arg]
        self.selection = DynamoDBSelectionStore(dynamodb, "cs-selection")
        self.rng = np.random.default_rng(0)
        probe = self.processor.predict("digits", {"input": self.row()})
        if probe.predictions[0].default:
            raise RuntimeError(f"the bench stack does not answer: {probe.predictions[0].default_explanation}")

    def _wait(self, ready: Any, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 60) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with status {proc.returncode} (log in {self.tmp})")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{what} did not start within {timeout_s:.0f} s")

    def row(self) -> list[float]:
        """A digits-like input no query has used before (so the frontend's first event is a cache miss)."""
        self.counter += 1
        values = self.rng.integers(0, 17, 64).astype(float)
        values[0] = 1000.0 + self.counter
        return [float(v) for v in values]

    # -- realistic events: two per child (the first, then a warm one) --------------------------------------
    def events(self, function: str) -> list[dict[str, Any]]:
        return [self.event(function) for _ in range(2)]

    def event(self, function: str) -> dict[str, Any]:
        from tests.events import http_event, sqs_event

        if function == "frontend":
            return http_event("POST", "/digits/predict", {"input": self.row()}, "debug=true")
        if function == "admin":
            headers = {"authorization": f"Bearer {self.admin_token}"}
            return http_event("POST", "/admin/get_all_applications", {"verbose": True}, headers=headers)
        if function == "batcher":
            from clipper.core.domain import InputType
            from clipper.core.messages import QueryMessage, encode_rows

            payload, _ = encode_rows(self.rows("digits", self.row()))
            now_ms = int(time.time() * 1000)
            qid = (self.counter << 16) + 7
            msg = QueryMessage(
                query_id=qid,
                app="digits",
                model="mlp",
                version="1",
                input_type=InputType.FLOATS,
                rows=1,
                payload=payload,
                deadline_ms=now_ms + 120_000,
                sent_ms=now_ms,
                reply_to=f"cs-{qid}",
            )
            return sqs_event([self.sqs_message(msg.to_json())], self.queue_arn)
        if function == "feedback":
            from clipper.core.messages import encode_rows
            from clipper.feedback import FeedbackMessage

            row = self.row()
            result = self.processor.predict("digits-exp3", {"input": row})  # records the prediction to join
            if result.predictions[0].default:
                raise RuntimeError(f"no prediction recorded for feedback: {result.predictions[0].default_explanation}")
            payload, _ = encode_rows(self.rows("digits-exp3", row))
            fb = FeedbackMessage(feedback_id=uuid.uuid4().hex, app="digits-exp3", payload=payload, label=3)
            return sqs_event([self.sqs_message(fb.to_json())], self.feedback_arn)
        if function == "model_updater":
            return self.upload_event()
        raise ValueError(function)

    def upload_event(self) -> dict[str, Any]:
        """A new version of the MLP uploaded to the model bucket, as S3 notifies it (events/s3-model-upload.json)."""
        self.counter += 1
        key = f"models/mlp/{self.counter + 1}/model.onnx"
        data = Path(self.model_path).read_bytes()
        put = self.s3.put_object(Bucket="cs-models", Key=key, Body=data)
        event: dict[str, Any] = json.loads((ROOT / "events" / "s3-model-upload.json").read_text())
        record = event["Records"][0]
        record["s3"]["bucket"].update({"name": "cs-models", "arn": "arn:aws:s3:::cs-models"})
        record["s3"]["object"] = {"key": key, "size": len(data), "eTag": put["ETag"].strip('"')}
        if put.get("VersionId"):
            record["s3"]["object"]["versionId"] = put["VersionId"]
        return event

    def rows(self, app: str, row: list[float]) -> Any:
        """The rows as the frontend encodes them (validated against the application)."""
        from clipper.core.validation import validate_query

        return validate_query(self.processor.registry.get_app(app), {"input": row}).rows

    @staticmethod
    def sqs_message(body: str) -> dict[str, Any]:
        now = str(int(time.time() * 1000))
        attributes = {"ApproximateReceiveCount": "1", "SentTimestamp": now, "ApproximateFirstReceiveTimestamp": now}
        return {
            "MessageId": str(uuid.uuid4()),
            "ReceiptHandle": uuid.uuid4().hex,
            "Body": body,
            "Attributes": attributes,
        }

    def state_version(self) -> int:
        from clipper.selection import state_key

        state = self.selection.load(state_key("digits-exp3"))
        return state.version if state is not None else 0


# -- one measurement -----------------------------------------------------------------------------------------
