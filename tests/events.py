"""Factories of real Lambda event shapes (API Gateway HTTP API v2, SQS), matching events/*.json."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVENTS = Path(__file__).resolve().parent.parent / "events"


@dataclass
class LambdaContext:
    function_name: str = "clipper-test"
    memory_limit_in_mb: int = 1024
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:clipper-test"
    aws_request_id: str = "00000000-0000-0000-0000-000000000000"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def http_event(
    method: str,
    path: str,
    body: Any = None,
    query: str = "",
    headers: dict[str, str] | None = None,
    route_key: str | None = None,
) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / "predict.json").read_text())
    now = time.time()
    event["routeKey"] = route_key or f"{method} {path}"
    event["rawPath"] = path
    event["rawQueryString"] = query
    event["headers"] = {"content-type": "application/json", **(headers or {})}
    event["requestContext"]["http"].update({"method": method, "path": path})
    event["requestContext"]["routeKey"] = event["routeKey"]
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    event["requestContext"]["timeEpoch"] = int(now * 1000)
    event["pathParameters"] = {}
    if body is None:
        event.pop("body", None)
    else:
        event["body"] = body if isinstance(body, str) else json.dumps(body)
    event["isBase64Encoded"] = False
    return event


def sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    """An SQS event for the Lambda driver, from ReceiveMessage results (with Attributes)."""
    template = json.loads((EVENTS / "sqs-batch.json").read_text())["Records"][0]
    records = []
    for m in messages:
        r = json.loads(json.dumps(template))
        r.update(
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "md5OfBody": hashlib.md5(m["Body"].encode()).hexdigest(),
                "eventSourceARN": queue_arn,
            }
        )
        r["attributes"].update(m.get("Attributes", {}))
        records.append(r)
    return {"Records": records}
