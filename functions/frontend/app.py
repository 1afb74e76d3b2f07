"""Frontend Lambda: Clipper's query API (FastAPI) behind API Gateway's HTTP API, through Mangum.

Module scope is the composition root: settings -> boto3 clients -> adapters -> core -> app. The local
stack serves this same ``app`` object with uvicorn.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging import correlation_paths
from mangum import Mangum

from clipper.frontend.api import create_app
from clipper.frontend.metrics import EmfQueryMetrics, InProcessMetrics, Observers
from clipper.settings import FrontendSettings
from clipper.wiring import aws_client, build_feedback_receiver, build_query_processor

logger = Logger(service="clipper-frontend")
settings = FrontendSettings()  # type: ignore[call-arg]
sqs = aws_client("sqs", max_attempts=2)
processor = build_query_processor(
    settings, dynamodb=aws_client("dynamodb", max_attempts=2), sqs=sqs, s3=aws_client("s3")
)
metrics = InProcessMetrics()
app = create_app(
    processor,
    settings.max_body_bytes,
    inline=settings.inline_predict,
    feedback=build_feedback_receiver(settings, processor.registry, sqs),
    observe=Observers(EmfQueryMetrics(), metrics),
    metrics=metrics,
)
_asgi_handler = Mangum(app, lifespan="off", api_gateway_base_path=settings.api_base_path)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _asgi_handler(event, context)  # type: ignore[no-any-return]
