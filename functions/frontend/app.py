"""Frontend Lambda: Clipper's query API (FastAPI) behind API Gateway's HTTP API, through Mangum.

Module scope is the composition root: settings -> boto3 clients -> adapters -> core -> app. The local
stack serves this same ``app`` object with uvicorn.

Cold start: the cyclic garbage collector is off while the composition root runs, and the objects it made
are frozen afterwards (``gc.freeze``), so no collection traverses them during the import or a query (a
full collection over them took ~100 ms here); the S3 client, used only by claim checks (inputs over the SQS
message limit), is created on its first use.
"""

from __future__ import annotations

import gc

gc.disable()

from typing import Any  # noqa: E402

from aws_lambda_powertools import Logger  # noqa: E402
from aws_lambda_powertools.logging import correlation_paths  # noqa: E402
from mangum import Mangum  # noqa: E402

from clipper.frontend.api import create_app  # noqa: E402
from clipper.frontend.metrics import EmfQueryMetrics, InProcessMetrics, Observers  # noqa: E402
from clipper.settings import FrontendSettings  # noqa: E402
from clipper.wiring import aws_client, build_feedback_receiver, build_query_processor, lazy_aws_client  # noqa: E402

logger = Logger(service="clipper-frontend")
settings = FrontendSettings()  # type: ignore[call-arg]
sqs = aws_client("sqs", max_attempts=2)
processor = build_query_processor(
    settings, dynamodb=aws_client("dynamodb", max_attempts=2), sqs=sqs, s3=lazy_aws_client("s3")
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

gc.freeze()
gc.enable()


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _asgi_handler(event, context)  # type: ignore[no-any-return]
