"""Builders of the object graphs the functions run. A handler module calls them once at cold start;
tests call them with other clients (moto, fakes) to assemble the same graph.

Each builder imports what its graph needs inside itself, so a function loads only its own graph (the admin
function, which only calls ``aws_client``, does not load the query processor, the batcher or numpy).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clipper.adapters.resp import RespClient
    from clipper.admin.report import ReportService
    from clipper.batching.core import Batcher
    from clipper.canary.review import CanaryReviewer
    from clipper.feedback import FeedbackProcessor, FeedbackReceiver
    from clipper.frontend.query import QueryListener, QueryProcessor
    from clipper.ports import (
        CanaryDecisionMetrics,
        Clock,
        LookupOrSend,
        PredictionCache,
        PublishAndFill,
        QueueReader,
        Registry,
        ReplyChannel,
        RequestQueue,
        SelectionStore,
    )
    from clipper.report.recorder import FeedbackRecorder
    from clipper.settings import BatcherSettings, CommonSettings, FrontendSettings


_botocore_session: Any = None
_session_lock = threading.Lock()


def aws_client(service: str, session: Any = None, **config: Any) -> Any:
    """An AWS client with short timeouts; ``AWS_ENDPOINT_URL`` (the local stack) is honoured.

    Without a ``session`` it is a botocore client from one botocore session per process: the same client
    ``boto3.client`` returns (boto3 only adds S3 transfer helpers, ``upload_file`` and the like, which the
    functions do not use), without importing boto3 and s3transfer (~60-90 ms of every cold start)."""
    from botocore.config import Config

    cfg = Config(
        connect_timeout=config.pop("connect_timeout", 2),
        read_timeout=config.pop("read_timeout", 10),
        retries={"mode": "standard", "max_attempts": config.pop("max_attempts", 3)},
        max_pool_connections=config.pop("max_pool_connections", 32),
    )
    if session is not None:
        return session.client(service, config=cfg)
    global _botocore_session
    with _session_lock:
        if _botocore_session is None:
            import botocore.session

            _botocore_session = botocore.session.get_session()
        return _botocore_session.create_client(service, config=cfg)


# The frontend's SQS client: a query's and a feedback's send. SQS answers a SendMessage in tens of milliseconds; a
# stalled one held a request's worker thread (and a Lambda invocation) for the default 10 s read timeout a try.
# Three tries (botocore's max_attempts counts the retries: 2 after the first) of at most 1 s to connect and 2 s to
# read: a stalled queue answers a feedback 503 within ~6-9 s (with the back-off), inside the frontend's 10 s
# timeout, and a query (answered with its default at its deadline in any case) frees its thread as soon.
FRONTEND_SQS = {"max_attempts": 2, "connect_timeout": 1, "read_timeout": 2}


class LazyClient:
    """A client created on its first use, once per container, for clients most events never touch (the
    S3 client of claim checks: only inputs over the SQS message limit use it; the SageMaker runtime client:
    only models served by a SageMaker endpoint). Their creation (loading the service's botocore model, tens
    of ms) is then paid by the first event that needs them, not by every cold start."""

    def __init__(self, create: Callable[[], Any]) -> None:
        self._create = create
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def created(self) -> bool:
        return self._client is not None

    def _get(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._create()
        return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)


def lazy_aws_client(service: str, **config: Any) -> LazyClient:
    return LazyClient(lambda: aws_client(service, **config))


def new_query_id() -> int:
    """Clipper's query id of a response: a random 53-bit number (safe as a JSON number in every client), leaving
    room for batch offsets. It keys nothing: replies and duplicate checks use the reply address, a UUID
    (``ReplyChannel.new_address``)."""
    return random.getrandbits(53) & ~0xFFFF


_redis_clients: dict[str, Any] = {}


def redis_client(url: str) -> RespClient:
    """One client (one connection pool) per URL and process: the lean client of ``clipper.adapters.resp``, with
    a 1 s default timeout per call (a query passes its remaining time instead), so a dead or hung Redis fails
    fast."""
    if url not in _redis_clients:
        from clipper.adapters.resp import RespClient

        _redis_clients[url] = RespClient.from_url(url, connect_timeout=1.0, timeout=1.0)
    client: RespClient = _redis_clients[url]
    return client


def redis_clients() -> list[Any]:
    """The Redis clients this process made (the SnapStart restore hook drops their connections)."""
    return list(_redis_clients.values())


def reply_channel(settings: CommonSettings, dynamodb: Any, poll_interval_s: float = 0.01) -> ReplyChannel:
    if settings.redis_url:
        from clipper.adapters.redis_replies import RedisReplyChannel

        return RedisReplyChannel(redis_client(settings.redis_url), ttl_s=settings.reply_ttl_s)
    from clipper.adapters.dynamodb_replies import DynamoDBReplyChannel

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

    ttl = settings.user_state_retention_days * 86400
    return DynamoDBSelectionStore(dynamodb, settings.selection_table, user_state_ttl_s=ttl)


def _queue_redis_url(settings: CommonSettings) -> str:
    if not settings.redis_url:
        raise ValueError("CLIPPER_QUEUE_TRANSPORT=redis needs REDIS_URL (the Redis that holds the request queues)")
    return settings.redis_url


def request_queue(settings: CommonSettings, sqs: Any) -> RequestQueue:
    """The models' request queues, on the transport ``CLIPPER_QUEUE_TRANSPORT`` names: SQS, or Redis Streams
    (``REDIS_URL``). A queue's address is its SQS URL either way."""
    if settings.queue_transport == "redis":
        from clipper.adapters.redis_streams import RedisStreamRequestQueue

        return RedisStreamRequestQueue(redis_client(_queue_redis_url(settings)))
    from clipper.adapters.sqs import SqsRequestQueue

    return SqsRequestQueue(sqs)


def queue_reader(
    settings: CommonSettings,
    sqs: Any,
    queue_url: str,
    visibility_timeout_s: float = 180.0,  # the model stack's VisibilityTimeoutSeconds and MaxReceiveCount
    max_receive_count: int = 3,
) -> QueueReader:
    """A reader of one model queue on ``CLIPPER_QUEUE_TRANSPORT``. The visibility timeout and the receive count
    before dead-lettering apply to Redis Streams; on SQS they are the queue's attributes (its stack's)."""
    if settings.queue_transport == "redis":
        from clipper.adapters.redis_streams import RedisStreamQueueReader

        client = redis_client(_queue_redis_url(settings))
        return RedisStreamQueueReader(client, queue_url, visibility_timeout_s, max_receive_count)
    from clipper.adapters.sqs import SqsQueueReader

    return SqsQueueReader(sqs, queue_url)


def stream_depths(settings: CommonSettings) -> Callable[[str], dict[str, int]] | None:
    """On Redis Streams queues, a queue's depth by its URL as the management API shows it (waiting, in flight,
    and the dead letters its stream keeps beside it); None on SQS (the queue's attributes say it)."""
    if settings.queue_transport != "redis":
        return None
    from clipper.adapters.redis_streams import queue_depth

    client = redis_client(_queue_redis_url(settings))

    def depth(queue_url: str) -> dict[str, int]:
        d = queue_depth(client, queue_url)
        return {"waiting": d.ready + d.delayed, "in_flight": d.in_flight, "dead_lettered": d.dead_lettered}

    return depth


_refresher: Any = None


def background_runner() -> Callable[[Callable[[], None]], Any]:
    """One thread per process that reloads the frontend's registry copy and bandit states off the query path (its
    thread starts with the first reload)."""
    global _refresher
    with _session_lock:
        if _refresher is None:
            from concurrent.futures import ThreadPoolExecutor

            _refresher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clipper-registry-refresh")
    return _refresher.submit  # type: ignore[no-any-return]


def _registry(
    settings: CommonSettings,
    dynamodb: Any,
    clock: Clock,
    ttl_s: float,
    refresh: Callable[[Callable[[], None]], Any] | None = None,
    unknown_reads_per_s: float = 0.0,
    keep_warm_s: float = 0.0,
) -> Any:
    from clipper.adapters.dynamodb_registry import DynamoDBRegistry
    from clipper.core.registry_cache import CachedRegistry

    inner = DynamoDBRegistry(dynamodb, settings.registry_table)
    return CachedRegistry(
        inner, clock, ttl_s, refresh=refresh, unknown_reads_per_s=unknown_reads_per_s, keep_warm_s=keep_warm_s
    )


def _claims(settings: CommonSettings, s3: Any) -> Any:
    if not settings.model_bucket:
        return None
    from clipper.adapters.s3_claims import S3ClaimStore

    return S3ClaimStore(s3, settings.model_bucket)


def build_feedback_processor(settings: CommonSettings, dynamodb: Any) -> FeedbackProcessor:
    from clipper.adapters.clock import SystemClock
    from clipper.feedback import FeedbackProcessor

    store = selection_store(settings, dynamodb)
    cache = prediction_cache(settings, dynamodb)
    if store is None or cache is None:
        raise ValueError(
            "feedback needs CLIPPER_SELECTION_TABLE and a prediction cache (REDIS_URL or CLIPPER_CACHE_TABLE)"
        )
    from clipper.adapters.dynamodb_canary import DynamoDBCanaryEvidence

    # the per-feedback markers in the selection table: the registry's scans would read them all
    evidence = DynamoDBCanaryEvidence(dynamodb, settings.registry_table, marker_table=settings.selection_table)
    log = feedback_recorder(settings, dynamodb)
    registry = _registry(settings, dynamodb, SystemClock(), 2.0)
    return FeedbackProcessor(registry, store, cache, evidence=evidence, log=log)


def build_canary_reviewer(settings: CommonSettings, dynamodb: Any, metrics: CanaryDecisionMetrics) -> CanaryReviewer:
    """The canary reviewer over the registry table, read fresh (no copy: a decision acts on the trial it read):
    the registry ends trials and keeps their events (it implements ``CanaryControl``), the evidence is the
    trial's counters (``clipper.adapters.dynamodb_canary``)."""
    from clipper.adapters.clock import SystemClock
    from clipper.adapters.dynamodb_canary import DynamoDBCanaryEvidence
    from clipper.adapters.dynamodb_registry import DynamoDBRegistry
    from clipper.canary.review import CanaryReviewer

    registry = DynamoDBRegistry(dynamodb, settings.registry_table)
    evidence = DynamoDBCanaryEvidence(dynamodb, settings.registry_table)
    # each round reviews the models with a running canary (one scan), not every model (a scan, then a query each)
    names = registry.canaried_model_names
    return CanaryReviewer(registry, evidence, registry, metrics, SystemClock(), model_names=names)


def feedback_recorder(settings: CommonSettings, dynamodb: Any) -> FeedbackRecorder | None:
    """The feedback log of the selection report, in the selection table (none without one)."""
    if not settings.selection_table:
        return None
    from clipper.adapters.clock import SystemClock
    from clipper.adapters.dynamodb_feedback_log import DynamoDBFeedbackLog
    from clipper.report.recorder import FeedbackRecorder

    return FeedbackRecorder(DynamoDBFeedbackLog(dynamodb, settings.selection_table), SystemClock())


def build_report_service(settings: CommonSettings, dynamodb: Any) -> ReportService:
    """The admin API's selection report over the registry and the feedback log (``clipper.admin.report``)."""
    from clipper.adapters.clock import SystemClock
    from clipper.adapters.dynamodb_feedback_log import DynamoDBFeedbackLog
    from clipper.adapters.dynamodb_registry import DynamoDBRegistry
    from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
    from clipper.admin.report import ReportService

    table = settings.selection_table
    log = DynamoDBFeedbackLog(dynamodb, table) if table else None
    states = DynamoDBSelectionStore(dynamodb, table) if table else None
    return ReportService(DynamoDBRegistry(dynamodb, settings.registry_table), log, SystemClock(), states=states)


def build_feedback_receiver(
    settings: FrontendSettings, registry: Registry, sqs: Any, cache: Any = None
) -> FeedbackReceiver:
    """The feedback queue is on the request queues' transport: SQS, or on the local stack a Redis stream, kept in
    Redis's append-only file (moto's queues live in its memory: a restart of the emulator or of the stack lost
    the feedback accepted and not yet applied)."""
    from clipper.feedback import FeedbackReceiver

    return FeedbackReceiver(registry, request_queue(settings, sqs), settings.feedback_queue_url, cache)


def build_query_processor(
    settings: FrontendSettings,
    dynamodb: Any,
    sqs: Any,
    s3: Any,
    clock: Clock | None = None,
    replies: ReplyChannel | None = None,
    listener: QueryListener | None = None,
    background_refresh: bool = True,
) -> QueryProcessor:
    """``background_refresh``: the registry copy and the bandit states are reloaded off the query path once past
    their TTLs (``clipper.core.registry_cache``, ``clipper.frontend.selection``), and the canaries' tally flushed
    each second by its thread; tests that step a fake clock can turn both off (the tally is then flushed by
    whoever calls its ``flush``)."""
    from clipper.adapters.clock import SystemClock
    from clipper.adapters.dynamodb_canary import DynamoDBCanaryEvidence
    from clipper.frontend.canary_tally import CanaryTally
    from clipper.frontend.query import QueryProcessor
    from clipper.frontend.selection import Selector

    clock = clock or SystemClock()
    refresh = background_runner() if background_refresh else None
    registry = _registry(
        settings,
        dynamodb,
        clock,
        settings.config_ttl_s,
        refresh,
        settings.unknown_app_reads_per_s,
        settings.keep_warm_s,
    )
    tally = CanaryTally(DynamoDBCanaryEvidence(dynamodb, settings.registry_table))
    if background_refresh:
        tally.start()
    store = selection_store(settings, dynamodb)
    ttl = settings.selection_ttl_s
    selector = Selector(registry, store, clock, random.Random(), ttl, refresh=refresh, keep_warm_s=settings.keep_warm_s)
    queue, cache = request_queue(settings, sqs), prediction_cache(settings, dynamodb)
    return QueryProcessor(
        registry=registry,
        queue=queue,
        replies=replies or reply_channel(settings, dynamodb, settings.reply_poll_interval_s),
        clock=clock,
        new_query_id=new_query_id,
        claims=_claims(settings, s3),
        max_batch=settings.max_batch,
        cache=cache,
        cache_poll_s=0.002 if settings.redis_url else 0.01,
        selector=selector,
        listener=listener,
        # on the event loop only when every query-path dependency is Redis (the lean client bounds each call)
        inline=replies is None and bool(settings.redis_url) and settings.queue_transport == "redis",
        fused=_lookup_or_send(settings, cache, queue),
        tally=tally,
    )


def _lookup_or_send(settings: CommonSettings, cache: Any, queue: Any) -> LookupOrSend | None:
    """The one-round-trip lookup and send, where the cache and the Streams queues share one standalone Redis."""
    from clipper.adapters.redis_cache import RedisPredictionCache
    from clipper.adapters.redis_streams import RedisStreamRequestQueue

    if settings.redis_cluster or not isinstance(cache, RedisPredictionCache):
        return None
    if not isinstance(queue, RedisStreamRequestQueue) or cache.client is not queue.client:
        return None
    from clipper.adapters.redis_fused import RedisLookupOrSend

    return RedisLookupOrSend(cache, queue)


def publish_and_fill(settings: CommonSettings, replies: Any, cache: Any) -> PublishAndFill | None:
    """The batcher's one-round-trip cache fill and reply publish, where both are one standalone Redis."""
    from clipper.adapters.redis_cache import RedisPredictionCache
    from clipper.adapters.redis_replies import RedisReplyChannel

    if settings.redis_cluster or not isinstance(cache, RedisPredictionCache):
        return None
    if not isinstance(replies, RedisReplyChannel) or replies.client is not cache.client:
        return None
    from clipper.adapters.redis_fused import RedisPublishAndFill

    return RedisPublishAndFill(replies, cache)


def build_batcher(
    settings: BatcherSettings,
    dynamodb: Any,
    s3: Any,
    sagemaker: Any = None,
    clock: Clock | None = None,
    replies: ReplyChannel | None = None,
) -> Batcher:
    import urllib3

    from clipper.adapters.clock import SystemClock
    from clipper.adapters.endpoints import EndpointFactory, RegistryEndpointResolver
    from clipper.batching.core import Batcher

    clock = clock or SystemClock()
    registry = _registry(settings, dynamodb, clock, settings.config_ttl_s)
    factory = EndpointFactory(urllib3.PoolManager(maxsize=8), sagemaker, settings.endpoint_call_timeout_s)
    replies = replies or reply_channel(settings, dynamodb)
    cache = prediction_cache(settings, dynamodb)
    return Batcher(
        endpoints=RegistryEndpointResolver(registry, factory),
        replies=replies,
        clock=clock,
        claims=_claims(settings, s3),
        cache=cache,
        publish_and_fill=publish_and_fill(settings, replies, cache),
    )
