"""Settings of each function, from the environment, validated once at cold start.

A bad value fails initialisation with a message naming the variable (pydantic-settings does that)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class CommonSettings(BaseSettings):
    # defer_build: each function builds only the settings class it instantiates, not all four at import
    model_config = SettingsConfigDict(env_prefix="CLIPPER_", extra="ignore", defer_build=True)

    registry_table: str = Field(min_length=3)
    replies_table: str = Field(min_length=3)
    model_bucket: str = ""
    redis_url: str = Field("", validation_alias=AliasChoices("REDIS_URL", "CLIPPER_REDIS_URL"))
    reply_ttl_s: int = Field(300, ge=10)
    cache_table: str = Field("", description="DynamoDB prediction cache table (used when Redis is not)")
    cache_ttl_s: int = Field(3600, ge=1)
    cache_enabled: bool = True
    selection_table: str = Field("", description="DynamoDB table of bandit states (empty: no learning)")
    # A user's bandit state is removed (DynamoDB TTL) this many days after its last feedback; 0 keeps it.
    user_state_retention_days: int = Field(0, ge=0, le=36500)
    aws_endpoint_url: str = Field("", validation_alias=AliasChoices("AWS_ENDPOINT_URL"))
    # The request queues' transport: SQS on AWS; Redis Streams (REDIS_URL) on one machine. A version's queue
    # address stays its SQS queue URL either way (the Redis transport names its stream after the queue).
    queue_transport: Literal["sqs", "redis"] = "sqs"
    # Whether REDIS_URL is a cluster (ElastiCache Serverless is): scripts may then only name keys of one slot.
    redis_cluster: bool = False


class FrontendSettings(CommonSettings):
    api_base_path: str = Field("/", pattern=r"^/")
    feedback_queue_url: str = ""
    selection_ttl_s: float = Field(1.0, ge=0, description="how long a warm frontend reuses a bandit state")
    # Queries running at once in one process (each holds a worker thread until its replies come or its deadline).
    query_threads: int = Field(64, ge=1)
    config_ttl_s: float = Field(2.0, ge=0)
    # Reads a second of application names this process does not hold; past it a name missing from the registry's
    # list of names (one keys-only scan, trusted for a second) is a 404 without its own read. 0 (AWS: each request
    # its own invocation; API Gateway's throttling bounds a flood) reads every name; the local stack sets 20.
    unknown_app_reads_per_s: float = Field(0.0, ge=0)
    # How long after a query used them its application's registry entries and bandit states are reloaded off the
    # query path while no query comes, so the first queries after a quiet spell read nothing (clipper.core.keep_warm).
    # 0 (AWS: a function is frozen between invocations); the local stack, one process that keeps running, sets 60.
    keep_warm_s: float = Field(0.0, ge=0)
    max_body_bytes: int = Field(5 * 1024 * 1024, ge=1024)
    max_batch: int = Field(1000, ge=1)
    reply_poll_interval_s: float = Field(0.01, gt=0)


class BatcherSettings(CommonSettings):
    # how long the registry's answers are trusted (0: read every time); the long-poll batcher also reads its
    # model's batching settings again this often (at least every FOLLOW_MIN_S, however small this is)
    config_ttl_s: float = Field(10.0, ge=0)
    endpoint_timeout_s: float = Field(25.0, gt=0)
    # The Lambda batcher's own timeout (template.yaml sets it from BatcherTimeout): an endpoint call ends well
    # before it (``endpoint_call_timeout_s``), so a hung endpoint fails the batch's messages, reported as item
    # failures and counted in EndpointErrors, instead of the function being stopped with nothing reported.
    function_timeout_s: float | None = Field(None, gt=0)

    @property
    def endpoint_call_timeout_s(self) -> float:
        """An endpoint call's timeout: ``endpoint_timeout_s``, within the function's timeout when there is one."""
        if self.function_timeout_s is None:
            return self.endpoint_timeout_s
        return max(1.0, min(self.endpoint_timeout_s, 0.8 * self.function_timeout_s - 1.0))

    # The long-poll batcher's counters (EndpointErrors by queue) sent with PutMetricData, namespace Clipper: on
    # in the SageMaker container (infra/model-stack.yaml), off locally.
    cloudwatch_metrics: bool = False


class AdminSettings(CommonSettings):
    # "token": a bearer token (CLIPPER_ADMIN_TOKEN; none set refuses every call). "iam": API Gateway
    # authorises the caller's IAM signature before the request reaches the function.
    admin_auth: Literal["token", "iam"] = "token"
    admin_token: str = ""
    api_base_path: str = Field("/", pattern=r"^/")
    # get_state shows their depths: feedback accepted and not yet applied, and feedback that failed for good
    feedback_queue_url: str = ""
    feedback_dead_letter_queue_url: str = ""


class ModelStackSettings(CommonSettings):
    """The per-version serving stacks (infra/model-stack.yaml) of the functions that create, scale or delete
    them (admin, model updater). No service stack named: versions are not managed as stacks."""

    service_stack_name: str = ""
    # empty: infra/model-stack.yaml as packaged with the shared layer (the template of the code that runs)
    model_stack_template: str = Field("", description="https URL or path overriding the packaged template")
    model_stack_parameters: str = Field("", description="JSON object of the parameters every version shares")
    model_endpoint: str = Field("", description="address of a version without SageMaker ({model}, {version})")
    model_stack_role_arn: str = Field("", description="CloudFormation service role of the model stacks")
    # under the model updater's 900 s Lambda timeout, so a stack that takes longer fails with its reason
    model_stack_wait_s: float = Field(600.0, gt=0, description="how long creating a version's stack may take")
