"""The OpenAPI documents of the query and admin APIs, fuzzed with Schemathesis against the apps in process: no 5xx,
every response's status, content type and body as documented. Bounded: a fixed number of examples per
operation, derandomized (the same examples every run), no deadline (this machine is shared)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from clipper.adapters.clock import SystemClock
from clipper.batching.core import Batcher
from clipper.core.registry_cache import CachedRegistry
from clipper.feedback import FeedbackReceiver
from clipper.frontend.api import create_app
from clipper.frontend.query import QueryProcessor
from tests.fakes import (
    FakeEndpoint,
    FakeResolver,
    InMemoryRegistry,
    InMemoryReplies,
    ListQueue,
    digits_app,
    model_version,
)
from tests.unit.test_query_processor import InlineQueue

pytestmark = pytest.mark.integration

EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


def query_app():
    registry = InMemoryRegistry()
    registry.apps["digits"] = digits_app(latency_slo_micros=1_000_000)
    registry.links["digits"] = ["mlp"]
    registry.versions[("mlp", "1")] = model_version()
    registry.active["mlp"] = "1"
    clock, replies = SystemClock(), InMemoryReplies()
    queue = InlineQueue(batcher=Batcher(FakeResolver(FakeEndpoint()), replies, clock))
    cached = CachedRegistry(registry, clock, ttl_s=60)
    processor = QueryProcessor(cached, queue, replies, clock, lambda: 1 << 16)
    feedback = FeedbackReceiver(cached, ListQueue(), "https://sqs.local/feedback")
    return create_app(processor, max_body_bytes=64 * 1024, feedback=feedback)


query_schema = schemathesis.openapi.from_asgi("/openapi.json", query_app())


@query_schema.parametrize()
@EXAMPLES
def test_the_query_api_answers_as_documented(case):
    # Whether a schema-valid input is accepted depends on the application (its input type and shape, set at
    # registration), which a static schema cannot say: a well-formed list for an app of strings is a 400. Every
    # other check runs: no 5xx, statuses, content types and bodies as documented, schema-violating bodies refused.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


# The admin API: each operation fuzzed on its own (so a failure names it), fewer examples each (29 operations).
ADMIN_EXAMPLES = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
TOKEN = "fuzz-token"


@pytest.fixture(scope="module")
def admin_app():
    """The admin API over a registry in moto (one for the module: the fuzz adds and deletes what it likes)."""
    import os

    import boto3
    from moto import mock_aws

    from clipper.adapters.clock import SystemClock
    from clipper.adapters.dynamodb_feedback_log import DynamoDBFeedbackLog
    from clipper.adapters.dynamodb_registry import DynamoDBRegistry
    from clipper.adapters.s3_uploads import S3ModelUploads
    from clipper.admin.api import create_admin_app
    from clipper.admin.report import ReportService
    from clipper.admin.service import AdminService
    from tests.integration.conftest import create_tables

    env = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_tables(dynamodb, "fuzz-registry", "fuzz-replies")
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="fuzz-models")
        service = AdminService(DynamoDBRegistry(dynamodb, "fuzz-registry"), uploads=S3ModelUploads(s3, "fuzz-models"))
        create_tables(dynamodb, "fuzz-selection", "fuzz-unused")  # the feedback log's table: pk, sk like the registry
        log = DynamoDBFeedbackLog(dynamodb, "fuzz-selection")
        report = ReportService(DynamoDBRegistry(dynamodb, "fuzz-registry"), log, SystemClock())
        yield create_admin_app(service, "token", TOKEN, report)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def admin_operations():
    """The admin document's operations, read from the app once (its routes do not depend on the registry)."""
    from clipper.adapters.clock import SystemClock
    from clipper.admin.api import create_admin_app
    from clipper.admin.report import ReportService

    app = create_admin_app(None, "token", TOKEN, ReportService(None, None, SystemClock()))  # type: ignore[arg-type]
    schema = schemathesis.openapi.from_asgi("/admin/openapi.json", app)
    return sorted(f"{op.ok().method.upper()} {op.ok().path}" for op in schema.get_all_operations())


@pytest.mark.parametrize("operation", admin_operations())
def test_the_admin_api_answers_as_documented(admin_app, operation):
    from hypothesis import given

    schema = schemathesis.openapi.from_asgi("/admin/openapi.json", admin_app)
    method, path = operation.split(" ", 1)
    op = schema[path][method]

    @given(case=op.as_strategy())
    @ADMIN_EXAMPLES
    def fuzz(case):
        # as for queries: whether a well-formed request is accepted depends on what is registered
        case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, excluded_checks=[positive_data_acceptance])

    fuzz()
