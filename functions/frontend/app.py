"""Frontend Lambda: Clipper's query API (FastAPI) behind API Gateway's HTTP API, through Mangum.

Module scope is the composition root: settings -> boto3 clients -> adapters -> core -> app. The local
stack serves this same ``app`` object with uvicorn.

Cold start: the cyclic garbage collector is off while the composition root runs, and the objects it made
are frozen afterwards (``gc.freeze``), so no collection traverses them during the import or a query (a
full collection over them took ~100 ms here); the S3 client, used only by claim checks (inputs over the SQS
message limit), is created on its first use; the X-Ray SDK is imported only where tracing is on.

Each query's log lines carry its query id as the correlation id (the ``clipper`` package's loggers write
through this function's Powertools handler), and its trace the ``app`` and ``model`` annotations. Under
SnapStart, ``clipper.frontend.restore.after_restore`` runs after each restore (re-seeds the generators,
drops connections and cached state).
"""

from __future__ import annotations

import gc

gc.disable()

import os  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

from aws_lambda_powertools import Logger  # noqa: E402
from aws_lambda_powertools.logging import correlation_paths  # noqa: E402
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers  # noqa: E402
from mangum import Mangum  # noqa: E402

from clipper.frontend.api import create_app  # noqa: E402
from clipper.frontend.invocation import invocation  # noqa: E402
from clipper.frontend.metrics import EmfQueryMetrics, InProcessMetrics, Observers  # noqa: E402
from clipper.frontend.observability import QueryCorrelation, make_tracer  # noqa: E402
from clipper.frontend.restore import after_restore, register_after_restore  # noqa: E402
from clipper.settings import FrontendSettings  # noqa: E402
from clipper.wiring import (  # noqa: E402
    FRONTEND_SQS,
    aws_client,
    build_feedback_receiver,
    build_query_processor,
    lazy_aws_client,
    redis_clients,
)

logger = Logger(service="clipper-frontend")
copy_config_to_registered_loggers(source_logger=logger, include={"clipper"})
tracer = make_tracer("clipper-frontend", os.environ)
settings = FrontendSettings()  # type: ignore[call-arg]
sqs = aws_client("sqs", **FRONTEND_SQS)
processor = build_query_processor(
    settings,
    dynamodb=aws_client("dynamodb", max_attempts=2),
    sqs=sqs,
    s3=lazy_aws_client("s3"),
    listener=QueryCorrelation(logger, tracer),
)
metrics = InProcessMetrics()
app = create_app(
    processor,
    settings.max_body_bytes,
    query_threads=settings.query_threads,
    feedback=build_feedback_receiver(settings, processor.registry, sqs, processor.cache),
    observe=Observers(EmfQueryMetrics(), metrics),
    metrics=metrics,
)
_asgi_handler = Mangum(app, lifespan="off", api_gateway_base_path=settings.api_base_path)
register_after_restore(partial(after_restore, processor, redis_clients(), metrics))

gc.freeze()
gc.enable()


def _handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    with invocation(context):  # a query's deadline is at most the invocation's end (FrontendTimeout)
        return _asgi_handler(event, context)


# the "## handler" subsegment the annotations go to (Lambda's own segment cannot be annotated)
_traced = tracer.capture_lambda_handler(_handle) if tracer is not None else _handle
handler = logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)(_traced)
