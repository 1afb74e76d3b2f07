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
