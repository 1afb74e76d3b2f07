"""The long-poll batcher process (``clipper-batcher``, or ``python -m clipper.entrypoints.batcher``): it
reads one model's request queue beside the model server and sends it batches (``clipper.batching.longpoll``).

The queue's transport is the settings' (``CLIPPER_QUEUE_TRANSPORT``: ``sqs``, or ``redis`` for Redis Streams at
``REDIS_URL``); replies, the cache and the controller's saved state come from the same settings as every
function's (``BatcherSettings``). SIGTERM and SIGINT stop it within the long poll's wait.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from clipper.adapters.cloudwatch_metrics import CloudWatchCounters
from clipper.batching.acker import DEFAULT_LINGER_S
from clipper.batching.longpoll import LongPollDriver
from clipper.batching.model_config import (
    FALLBACK_SLO_MS,
    SLO_FRACTION,
    BatcherConfig,
    ConfigFollower,
    RegistryBatcherConfig,
)
from clipper.core.domain import BatchingSettings
from clipper.entrypoints.signals import StopSignals
from clipper.errors import ClipperError, NotFound

if TYPE_CHECKING:
    from clipper.settings import BatcherSettings

logger = logging.getLogger("clipper.batcher")

# Receives in flight at once, per transport: an SQS ReceiveMessage returns at most 10 messages (so a batch
# of more than 10 needs several); a Redis Streams read returns a whole batch, so none runs ahead: the batching
# thread receives itself, its deletes carried by the receive (no thread woken and no hand-off a batch).
RECEIVERS = {"sqs": 4, "redis": 0}
RECEIVE_MAX = {"sqs": 10, "redis": None}  # messages one receive asks for (None: the buffer's room)
ACK_CHUNK = {"sqs": 10, "redis": 100}  # receipt handles per delete call (SQS's DeleteMessageBatch takes 10)
ACK_LINGER_MS = DEFAULT_LINGER_S * 1000  # a delete waits this long for others to share its call


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="clipper-batcher",
        description="The long-poll batcher: batches one model queue's queries for its server. Its environment "
        "(clipper.settings.BatcherSettings): CLIPPER_REGISTRY_TABLE and CLIPPER_REPLIES_TABLE (required), "
        "CLIPPER_QUEUE_TRANSPORT (sqs or redis), REDIS_URL, CLIPPER_CACHE_*, CLIPPER_MODEL_BUCKET, AWS_* as boto3 "
        "reads them; the local stack sets them for its batchers.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--queue-url", required=True, help="the model's request queue")
    p.add_argument("--endpoint-url", required=True, help="the model server, e.g. http://127.0.0.1:8080")
    p.add_argument(
        "--slo-ms",
        type=float,
        default=FALLBACK_SLO_MS,
        help="latency objective of a batch, for every controller, while no application is linked (else "
        "--slo-fraction of the strictest linked one)",
    )
    p.add_argument("--batch-size", type=int, default=0, help="fix the batch size (0: adapt)")
    p.add_argument("--controller", choices=["aimd", "quantile"], default="aimd", help="how the size adapts")
    p.add_argument("--model", default=os.environ.get("CLIPPER_MODEL_NAME", ""), help="model name (state key)")
    p.add_argument("--version", default=os.environ.get("CLIPPER_MODEL_VERSION", ""), help="model version")
    p.add_argument("--max-batch-size", type=int, default=256, help="upper bound of the adaptive size")
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=1.0,
        help="how long a batch waits for more queries after its first arrived (0: cut at once)",
    )
    p.add_argument(
        "--receivers",
        type=int,
        default=None,
        help="receives in flight at once, ahead of the batches; 0: none, the batching thread receives (None: "
        "$CLIPPER_BATCHER_RECEIVERS, else the transport's: 4 on SQS, 0 on Redis Streams)",
    )
    p.add_argument(
        "--buffer-batches",
        type=float,
        default=2.0,
        help="messages received ahead, at most, in batches of the current size (>= 1)",
    )
    p.add_argument(
        "--ack-linger-ms",
        type=float,
        default=ACK_LINGER_MS,
        help="how long a delete waits for others to share its call (0: each batch's own call at once); not used "
        "with --receivers 0 on Redis Streams, whose deletes travel with the next receive",
    )
    p.add_argument(
        "--poll-wait-s",
        type=float,
        default=1.0,
        help="a receive's long poll; a stop takes effect within it (SQS: whole seconds, 20 at most)",
    )
    p.add_argument(
        "--visibility-timeout-s",
        type=float,
        default=180.0,
        help="Redis Streams: when an unacknowledged message is delivered again (on SQS: the queue's attribute)",
    )
    p.add_argument(
        "--max-receive-count",
        type=int,
        default=3,
        help="Redis Streams: deliveries before the dead-letter stream (on SQS: the queue's redrive policy)",
    )
    p.add_argument(
        "--slo-fraction",
        type=float,
        default=SLO_FRACTION,
        help="the batch latency objective as a fraction of the strictest linked application's SLO (registry)",
    )
    p.add_argument(
        "--ignore-registry",
        action="store_true",
        help="batch by these options only; by default, with --model, the model's batching settings "
        "(set_model_batching) and its applications' SLOs are read from the registry and followed",
    )
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    receivers = os.environ.get("CLIPPER_BATCHER_RECEIVERS", "").strip()
    if args.receivers is None and receivers:
        if not (receivers.isascii() and receivers.isdigit()):
            p.error(
                "CLIPPER_BATCHER_RECEIVERS must be a whole number, 0 or more (0: the batching thread receives), "
                f"got {receivers!r}"
            )
        args.receivers = int(receivers)
    if args.receivers is not None and args.receivers < 0:
        p.error("--receivers must be 0 (the batching thread receives) or more")
    if args.buffer_batches < 1:
        p.error("--buffer-batches must be at least 1")
    if not 0 < args.slo_fraction <= 1:
        p.error("--slo-fraction must be in (0, 1]")
    if args.poll_wait_s < 0 or args.batch_wait_ms < 0:
        p.error("--poll-wait-s and --batch-wait-ms must not be negative")
    return args


def endpoint_error_counters(settings: Any, queue_url: str) -> CloudWatchCounters | None:
    """With ``CLIPPER_CLOUDWATCH_METRICS`` (on in the SageMaker container): ``EndpointErrors`` by queue name, the
    metric of infra/model-stack.yaml's EndpointFailuresAlarm, sent with PutMetricData once a minute (zero
    included, so a healthy endpoint shows 0 rather than no data)."""
    if not settings.cloudwatch_metrics:
        return None
    from clipper.wiring import aws_client

    queue = queue_url.rstrip("/").rsplit("/", 1)[-1]
    return CloudWatchCounters(aws_client("cloudwatch"), "Clipper", {"queue": queue})


def config_source(args: argparse.Namespace, settings: Any, dynamodb: Any = None) -> RegistryBatcherConfig | None:
    """Where the batching configuration comes from: the registry, for a named model (unless
    ``--ignore-registry``); None: the command line's options alone. ``dynamodb``: the process's client."""
    if args.ignore_registry or not args.model or not settings.registry_table:
        return None
    from clipper.adapters.dynamodb_registry import DynamoDBRegistry
    from clipper.wiring import aws_client

    registry = DynamoDBRegistry(dynamodb or aws_client("dynamodb"), settings.registry_table)
    return RegistryBatcherConfig(registry, args.model, args.slo_fraction, args.slo_ms / 1000)


def args_config(args: argparse.Namespace) -> BatcherConfig:
    """The configuration the command line's options describe."""
    fixed = args.batch_size > 0
    batching = BatchingSettings(
        controller="fixed" if fixed else args.controller,
        batch_size=args.batch_size,
        max_batch_size=max(args.max_batch_size, args.batch_size),
        batch_wait_ms=args.batch_wait_ms,
    )
    return BatcherConfig(args.slo_ms / 1000, batching)


def build_driver(
    args: argparse.Namespace,
    settings: Any,
    counters: CloudWatchCounters | None = None,
    config: BatcherConfig | None = None,
    dynamodb: Any = None,
) -> LongPollDriver:
    """The process's object graph (the composition root): the batcher core with its adapters, the controller
    and the queue reader of ``args.queue_url`` on the settings' transport; ``counters`` count each batch's
    endpoint errors; ``config`` (default: the options') sets the controller and the batch wait; ``dynamodb``
    (default: a new one) is the process's DynamoDB client."""
    import urllib3

    from clipper.adapters.clock import SystemClock
    from clipper.adapters.dynamodb_registry import DynamoDBControllerStore
    from clipper.adapters.endpoints import FixedEndpointResolver, HttpModelEndpoint
    from clipper.adapters.s3_claims import S3ClaimStore
    from clipper.batching.core import Batcher
    from clipper.wiring import aws_client, prediction_cache, publish_and_fill, queue_reader, reply_channel

    dynamodb = dynamodb or aws_client("dynamodb")
    endpoint = HttpModelEndpoint(args.endpoint_url, urllib3.PoolManager(maxsize=2), settings.endpoint_timeout_s)
    replies = reply_channel(settings, dynamodb)
    cache = prediction_cache(settings, dynamodb)
    batcher = Batcher(
        endpoints=FixedEndpointResolver(endpoint),
        replies=replies,
        clock=SystemClock(),
        claims=S3ClaimStore(aws_client("s3"), settings.model_bucket) if settings.model_bucket else None,
        cache=cache,
        publish_and_fill=publish_and_fill(settings, replies, cache),
    )
    config = config or args_config(args)
    transport = settings.queue_transport
    receivers = RECEIVERS[transport] if args.receivers is None else args.receivers
    if receivers == 0 and RECEIVE_MAX[transport] is not None:
        logger.warning(
            "--receivers 0 on %s: a batch holds what one receive returns (at most %d messages) and what the "
            "short receives within its batch wait add; receivers ahead fill larger batches",
            transport,
            RECEIVE_MAX[transport],
        )
    # the SQS client's read timeout outlasts a long poll (SQS's longest: 20 s)
    sqs = aws_client("sqs", read_timeout=30) if transport == "sqs" else None
    reader = queue_reader(
        settings,
        sqs,
        args.queue_url,
        visibility_timeout_s=args.visibility_timeout_s,
        max_receive_count=args.max_receive_count,
    )
    return LongPollDriver(
        reader,
        batcher,
        config.controller(),
        batch_wait_s=config.batch_wait_s,
        idle_wait_s=args.poll_wait_s,
        state_store=DynamoDBControllerStore(dynamodb, settings.registry_table),
        state_key=(args.model, args.version) if args.model and args.version else None,
        receivers=receivers,
        receive_max=RECEIVE_MAX[transport],
        buffer_batches=args.buffer_batches,
        ack_chunk=ACK_CHUNK[transport],
        ack_linger_s=args.ack_linger_ms / 1000,
        on_report=None if counters is None else lambda report: counters.add("EndpointErrors", report.endpoint_errors),
    )


# The shortest pause between two reads of the batching settings: a config TTL of 0 (read every time) must not
# make the follower read the registry in a loop.
FOLLOW_MIN_S = 0.5


def follow_interval(settings: BatcherSettings) -> float:
    return max(settings.config_ttl_s, FOLLOW_MIN_S)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signals = StopSignals()
    signals.listen()  # first, on the main thread: until the driver runs, a signal ends the process at once
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from clipper.settings import BatcherSettings

    try:
        settings = BatcherSettings()  # type: ignore[call-arg]
    except ValidationError as e:
        problems = "; ".join(f"CLIPPER_{'_'.join(map(str, x['loc'])).upper()}: {x['msg']}" for x in e.errors())
        print(f"clipper-batcher: missing or invalid environment: {problems} (--help lists it)", file=sys.stderr)
        return 2
    from clipper.wiring import aws_client

    dynamodb = aws_client("dynamodb")  # one client (its service model loaded once) for the registry and the rest
    counters = endpoint_error_counters(settings, args.queue_url)
    source = config_source(args, settings, dynamodb)
    config = args_config(args)
    if source is not None:
        try:
            config = source.load()
        except NotFound as e:  # the launcher starts a demo model's batcher before it registers the model
            logger.info("batching settings of %s not registered yet (by the options until they are): %s", args.model, e)
        except ClipperError as e:
            logger.warning("batching settings of %s not read (by the options until they are): %s", args.model, e)
    driver = build_driver(args, settings, counters, config, dynamodb)
    logger.info("batching: %s", config.describe())
    follower = None
    if source is not None:
        follower = ConfigFollower(source, driver, follow_interval(settings), current=config)
        follower.start()
    signals.ready(on_stop=driver.wake)
    stop = signals.stop
    gc.freeze()  # start-up objects never need collecting: keeps full collections (tens of ms) off batches
    mode = "received ahead" if driver.receivers else "received by the batching thread"
    transport = {"redis": "Redis Streams", "sqs": "SQS"}.get(settings.queue_transport, settings.queue_transport)
    logger.info("batcher polling %s (%s, %s) for %s", args.queue_url, transport, mode, args.endpoint_url)
    driver.run(stop)
    if follower is not None:
        follower.stop()
    if counters is not None:
        counters.flush()
    logger.info("batcher stopped: %s", driver.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
