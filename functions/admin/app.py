"""Admin Lambda: Clipper's management operations under /admin/ (IAM-authorised routes on AWS)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging import correlation_paths
from mangum import Mangum

from clipper.adapters.cloudformation_stacks import build_model_stacks
from clipper.adapters.dynamodb_canary import DynamoDBCanaryEvidence
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.adapters.s3_uploads import S3ModelUploads
from clipper.adapters.serving_probe import AwsServingProbe
from clipper.admin.api import create_admin_app
from clipper.admin.service import AdminService
from clipper.settings import AdminSettings, ModelStackSettings
from clipper.wiring import aws_client, build_report_service, stream_depths


class AdminFunctionSettings(AdminSettings, ModelStackSettings):
    """The admin settings and the per-version model stacks that set_num_replicas scales and version
    deletion removes."""


def build(config: AdminFunctionSettings, dynamodb: Any, s3: Any, sqs: Any, sagemaker: Any, cfn: Any) -> AdminService:
    """The service over these clients (the handler's graph; tests pass moto's)."""
    uploads = S3ModelUploads(s3, config.model_bucket) if config.model_bucket else None
    stacks = build_model_stacks(cfn, config)
    registry = DynamoDBRegistry(dynamodb, config.registry_table)
    evidence = DynamoDBCanaryEvidence(dynamodb, config.registry_table)  # a canary's live evidence (get_canary)
    depths = stream_depths(config)
    feedback = {"queue": config.feedback_queue_url, "dead_letter": config.feedback_dead_letter_queue_url}
    if depths is not None:  # the feedback stream keeps its dead letters: the SQS dead-letter queue stays empty
        feedback = {"queue": config.feedback_queue_url}
    probe = AwsServingProbe(sqs, sagemaker, depths=depths)
    return AdminService(registry, probe, uploads, stacks, evidence, feedback_queues=feedback)


logger = Logger(service="clipper-admin")
settings = AdminFunctionSettings()  # type: ignore[call-arg]
dynamodb = aws_client("dynamodb")
service = build(
    settings,
    dynamodb,
    aws_client("s3") if settings.model_bucket else None,  # clients cost cold-start time: only those used
    aws_client("sqs"),
    aws_client("sagemaker"),
    aws_client("cloudformation") if settings.service_stack_name else None,
)
app = create_admin_app(service, settings.admin_auth, settings.admin_token, build_report_service(settings, dynamodb))
_asgi_handler = Mangum(app, lifespan="off", api_gateway_base_path=settings.api_base_path)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _asgi_handler(event, context)  # type: ignore[no-any-return]
