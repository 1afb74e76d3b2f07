"""Builders of the object graphs the functions run. A handler module calls them once at cold start;
tests call them with other clients (moto, fakes) to assemble the same graph."""

from __future__ import annotations

import random
from typing import Any

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.adapters.dynamodb_replies import DynamoDBReplyChannel
from clipper.adapters.s3_claims import S3ClaimStore
from clipper.adapters.sqs import SqsRequestQueue
from clipper.batching.core import Batcher
from clipper.core.registry_cache import CachedRegistry
from clipper.feedback import FeedbackProcessor, FeedbackReceiver
from clipper.frontend.query import QueryProcessor
from clipper.frontend.selection import Selector
from clipper.ports import Clock, PredictionCache, Registry, ReplyChannel, SelectionStore
from clipper.settings import BatcherSettings, CommonSettings, FrontendSettings


def aws_client(service: str, session: Any = None, **config: Any) -> Any:
    """A boto3 client with short timeouts; ``AWS_ENDPOINT_URL`` (the local stack) is honoured by boto3."""
    import boto3
    from botocore.config import Config

    cfg = Config(
        connect_timeout=config.pop("connect_timeout", 2),
        read_timeout=config.pop("read_timeout", 10),
        retries={"mode": "standard", "max_attempts": config.pop("max_attempts", 3)},
        max_pool_connections=config.pop("max_pool_connections", 32),
    )
    return (session or boto3).client(service, config=cfg)


def new_query_id() -> int:
    """A random 53-bit query id (safe as a JSON number in every client), leaving room for batch offsets."""
    return random.getrandbits(53) & ~0xFFFF


_redis_clients: dict[str, Any] = {}


def redis_client(url: str) -> Any:
    """One client (one connection pool) per URL and process."""
    if url not in _redis_clients:
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        # Few, short retries: a query's whole budget is its SLO, so a dead Redis must fail fast.
        _redis_clients[url] = redis.Redis.from_url(
            url, socket_timeout=35, socket_connect_timeout=1, retry=Retry(ExponentialBackoff(cap=0.05, base=0.005), 2)
        )
    return _redis_clients[url]


def reply_channel(settings: CommonSettings, dynamodb: Any, poll_interval_s: float = 0.01) -> ReplyChannel:
    if settings.redis_url:
        from clipper.adapters.redis_replies import RedisReplyChannel

        return RedisReplyChannel(redis_client(settings.redis_url), ttl_s=settings.reply_ttl_s)
    return DynamoDBReplyChannel(dynamodb, settings.replies_table, settings.reply_ttl_s, poll_interval_s)


def prediction_cache(settings: CommonSettings, dynamodb: Any) -> PredictionCache | None:
    """Redis when configured, else the DynamoDB cache table when configured, else no cache."""
    if not settings.cache_enabled:
        return None
    if settings.redis_url:
        from clipper.adapters.redis_cache import RedisPredictionCache

        return RedisPredictionCache(redis_client(settings.redis_url), ttl_s=settings.cache_ttl_s)
    if settings.cache_table:
        from clipper.adapters.dynamodb_cache import DynamoDBPredictionCache

        return DynamoDBPredictionCache(dynamodb, settings.cache_table, ttl_s=settings.cache_ttl_s)
    return None


def selection_store(settings: CommonSettings, dynamodb: Any) -> SelectionStore | None:
    if not settings.selection_table:
        return None
    from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore

    return DynamoDBSelectionStore(dynamodb, settings.selection_table)


def build_feedback_processor(settings: CommonSettings, dynamodb: Any) -> FeedbackProcessor:
    store = selection_store(settings, dynamodb)
    cache = prediction_cache(settings, dynamodb)
    if store is None or cache is None:
        raise ValueError(
            "feedback needs CLIPPER_SELECTION_TABLE and a prediction cache (REDIS_URL or CLIPPER_CACHE_TABLE)"
        )
    registry = CachedRegistry(DynamoDBRegistry(dynamodb, settings.registry_table), SystemClock(), 2.0)
    return FeedbackProcessor(registry, store, cache)


def build_feedback_receiver(settings: FrontendSettings, registry: Registry, sqs: Any) -> FeedbackReceiver:
    return FeedbackReceiver(registry, SqsRequestQueue(sqs), settings.feedback_queue_url)


def build_query_processor(
    settings: FrontendSettings,
    dynamodb: Any,
    sqs: Any,
    s3: Any,
    clock: Clock | None = None,
    replies: ReplyChannel | None = None,
) -> QueryProcessor:
    clock = clock or SystemClock()
    registry = CachedRegistry(DynamoDBRegistry(dynamodb, settings.registry_table), clock, settings.config_ttl_s)
    selector = Selector(registry, selection_store(settings, dynamodb), clock, random.Random(), settings.selection_ttl_s)
    return QueryProcessor(
        registry=registry,
        queue=SqsRequestQueue(sqs),
        replies=replies or reply_channel(settings, dynamodb, settings.reply_poll_interval_s),
        clock=clock,
        new_query_id=new_query_id,
        claims=S3ClaimStore(s3, settings.model_bucket) if settings.model_bucket else None,
        max_batch=settings.max_batch,
        cache=prediction_cache(settings, dynamodb),
        cache_poll_s=0.002 if settings.redis_url else 0.01,
        selector=selector,
    )


def build_batcher(
    settings: BatcherSettings,
    dynamodb: Any,
    s3: Any,
    sagemaker: Any = None,
    clock: Clock | None = None,
    replies: ReplyChannel | None = None,
) -> Batcher:
    import urllib3

    from clipper.adapters.endpoints import EndpointFactory, RegistryEndpointResolver

    clock = clock or SystemClock()
    registry = CachedRegistry(DynamoDBRegistry(dynamodb, settings.registry_table), clock, settings.config_ttl_s)
    factory = EndpointFactory(urllib3.PoolManager(maxsize=8), sagemaker)
    return Batcher(
        endpoints=RegistryEndpointResolver(registry, factory),
        replies=replies or reply_channel(settings, dynamodb),
        clock=clock,
        claims=S3ClaimStore(s3, settings.model_bucket) if settings.model_bucket else None,
        cache=prediction_cache(settings, dynamodb),
    )
