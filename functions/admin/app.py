"""Admin Lambda: Clipper's management operations under /admin/ (IAM-authorised routes on AWS)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging import correlation_paths
from mangum import Mangum

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.adapters.serving_probe import AwsServingProbe
from clipper.admin.api import create_admin_app
from clipper.admin.service import AdminService
from clipper.settings import AdminSettings
from clipper.wiring import aws_client

logger = Logger(service="clipper-admin")
settings = AdminSettings()  # type: ignore[call-arg]
probe = AwsServingProbe(aws_client("sqs"), aws_client("sagemaker"))
service = AdminService(DynamoDBRegistry(aws_client("dynamodb"), settings.registry_table), probe)
app = create_admin_app(service, settings.admin_auth, settings.admin_token)
_asgi_handler = Mangum(app, lifespan="off", api_gateway_base_path=settings.api_base_path)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _asgi_handler(event, context)  # type: ignore[no-any-return]
