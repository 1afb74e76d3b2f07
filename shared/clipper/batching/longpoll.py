"""The long-poll driver: a process beside the model server that long-polls its model's queue and cuts
batches with millisecond precision (the Lambda driver's batching window has whole-second granularity).

After the first message of a batch arrives it keeps receiving while more messages come, until the batch
is full or the oldest message has waited ``batch_wait_s`` (a receive that comes back empty ends the batch
at once: nothing is gained by waiting on an idle queue); then it runs the batch through the batcher core,
deletes what was answered (or dropped as expired or duplicate), and releases failed messages for a retry
after a back-off (the queue's redrive policy moves a message to the dead-letter queue after ``maxReceiveCount`` tries).

The core cuts each batch to what can still meet its earliest deadline (``Batcher.process(defer=True)``);
the messages it defers stay in flight (neither deleted nor released) and lead the next batch.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from clipper.batching.controller import BatchSizeController, make_controller
from clipper.batching.core import Batcher, BatchReport, Inbound
from clipper.errors import ClipperError
from clipper.ports import ControllerStateStore, QueueReader, ReceivedMessage

logger = logging.getLogger("clipper.batcher")


@dataclass
class DriverStats:
    batches: int = 0
    answered: int = 0
    expired: int = 0
    duplicates: int = 0
    failed: int = 0
    deferred: int = 0  # times a message was cut from a batch to meet deadlines (it leads the next one)


class LongPollDriver:
    def __init__(
        self,
        reader: QueueReader,
        batcher: Batcher,
        controller: BatchSizeController,
        batch_wait_s: float = 0.001,
        idle_wait_s: int = 1,
        max_backoff_s: int = 30,
        state_store: ControllerStateStore | None = None,
        state_key: tuple[str, str] | None = None,
        save_every_s: float = 5.0,
    ) -> None:
        self._reader = reader
        self._batcher = batcher
        self._controller = controller
        self._batch_wait = batch_wait_s
        self._idle_wait = idle_wait_s
        self._max_backoff = max_backoff_s
        self._store = state_store if state_key else None
        self._key = state_key
        self._save_every = save_every_s
        self._saved_at = time.monotonic()
        self.stats = DriverStats()
        self._carry: list[ReceivedMessage] = []  # deferred by the last batch: they lead the next one
        self._restore()

    def _restore(self) -> None:
        if self._store is None or self._key is None:
            return
        try:
            state = self._store.load(*self._key)
        except ClipperError as e:
            logger.warning("controller state not loaded: %s", e)
            return
        if state:
            self._controller.restore(state)
            logger.info("controller restored: %s", state)

    def save_state(self) -> None:
        if self._store is None or self._key is None:
            return
        try:
            self._store.save(*self._key, self._controller.state())
        except ClipperError as e:
            logger.warning("controller state not saved: %s", e)
        self._saved_at = time.monotonic()

    def collect(self, stop: threading.Event) -> list[ReceivedMessage]:
        """Receive one batch: block (long poll) until a message arrives, then fill until full or late."""
        batch, self._carry = self._carry, []
        first_at = time.monotonic()
        while not stop.is_set():
            limit = self._controller.max_batch_size()
            if len(batch) >= limit:
                return batch
            wait = 0 if batch else self._idle_wait
            try:
                got = self._reader.receive(limit - len(batch), wait)
            except ClipperError as e:
                logger.warning("receive failed: %s", e)
                if batch:
                    return batch
                stop.wait(1.0)
                continue
            if not got and not batch:
                return batch  # the long poll ended empty: let the caller check for a stop
            if not batch:
                first_at = time.monotonic()
            batch.extend(got)
            if batch and (len(batch) >= limit or not got or time.monotonic() - first_at >= self._batch_wait):
                return batch
        return batch

    def handle(self, batch: list[ReceivedMessage]) -> BatchReport:
        started = time.monotonic()
        report = self._batcher.process([Inbound(m.message_id, m.body, m.received_ms) for m in batch], defer=True)
        latency = time.monotonic() - started
        deferred = set(report.deferred)
        self._controller.observe(len(batch) - len(deferred), latency)
        failed = set(report.failed)
        self._carry = [m for m in batch if m.message_id in deferred]
        done = [m.receipt_handle for m in batch if m.message_id not in failed and m.message_id not in deferred]
        try:
            self._reader.delete(done)
            for m in batch:
                if m.message_id in failed:
                    self._reader.release(m.receipt_handle, min(self._max_backoff, 2 ** (m.receive_count - 1)))
        except ClipperError as e:
            # Not deleting is safe: the message comes back after its visibility timeout and is answered
            # once (the reply channel drops duplicate answers).
            logger.warning("acknowledging failed: %s", e)
        s = self.stats
        s.batches += 1
        s.answered += report.answered
        s.expired += report.expired
        s.duplicates += report.duplicates
        s.failed += len(failed)
        s.deferred += len(deferred)
        if time.monotonic() - self._saved_at >= self._save_every:
            self.save_state()
        return report

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            batch = self.collect(stop)
            if batch:
                self.handle(batch)
        self.release_carried()
        self.save_state()

    def release_carried(self) -> None:
        """Hand the messages deferred by the last batch back to the queue at once (on stop), so another
        batcher answers them within their deadlines instead of after their visibility timeout."""
        carried, self._carry = self._carry, []
        for m in carried:
            try:
                self._reader.release(m.receipt_handle, 0)
            except ClipperError as e:
                logger.warning("releasing a deferred message failed: %s", e)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="clipper-batcher", description=__doc__.split("\n\n")[0])
    p.add_argument("--queue-url", required=True, help="the model's request queue")
    p.add_argument("--endpoint-url", required=True, help="the model server, e.g. http://127.0.0.1:8080")
    p.add_argument("--slo-ms", type=float, default=100.0, help="latency objective of a batch (AIMD)")
    p.add_argument("--batch-size", type=int, default=0, help="fix the batch size (0: adapt)")
    p.add_argument("--controller", choices=["aimd", "quantile"], default="aimd", help="how the size adapts")
    p.add_argument("--model", default=os.environ.get("CLIPPER_MODEL_NAME", ""), help="model name (state key)")
    p.add_argument("--version", default=os.environ.get("CLIPPER_MODEL_VERSION", ""), help="model version")
    p.add_argument("--max-batch-size", type=int, default=256, help="upper bound of the adaptive size")
    p.add_argument("--batch-wait-ms", type=float, default=1.0, help="how long a batch waits to fill")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import urllib3

    from clipper.adapters.endpoints import FixedEndpointResolver, HttpModelEndpoint
    from clipper.settings import BatcherSettings
    from clipper.wiring import aws_client, prediction_cache, reply_channel

    settings = BatcherSettings()  # type: ignore[call-arg]
    dynamodb = aws_client("dynamodb")
    from clipper.adapters.clock import SystemClock
    from clipper.adapters.s3_claims import S3ClaimStore

    endpoint = HttpModelEndpoint(args.endpoint_url, urllib3.PoolManager(maxsize=2), settings.endpoint_timeout_s)
    batcher = Batcher(
        endpoints=FixedEndpointResolver(endpoint),
        replies=reply_channel(settings, dynamodb),
        clock=SystemClock(),
        claims=S3ClaimStore(aws_client("s3"), settings.model_bucket) if settings.model_bucket else None,
        cache=prediction_cache(settings, dynamodb),
    )
    controller = make_controller(args.controller, args.slo_ms / 1000, args.batch_size, args.max_batch_size)
    from clipper.adapters.dynamodb_registry import DynamoDBControllerStore

    store = DynamoDBControllerStore(dynamodb, settings.registry_table)
    key = (args.model, args.version) if args.model and args.version else None
    from clipper.wiring import queue_reader

    reader = queue_reader(settings, aws_client("sqs", read_timeout=30), args.queue_url)
    driver = LongPollDriver(
        reader, batcher, controller, batch_wait_s=args.batch_wait_ms / 1000, state_store=store, state_key=key
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    import gc

    gc.freeze()  # start-up objects never need collecting: keeps full collections (tens of ms) off batches
    logger.info("batcher polling %s for %s", args.queue_url, args.endpoint_url)
    driver.run(stop)
    logger.info("batcher stopped: %s", driver.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
