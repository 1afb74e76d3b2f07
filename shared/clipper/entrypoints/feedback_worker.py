"""``clipper-feedback`` (``python -m clipper.entrypoints.feedback_worker --queue-url URL``): the long-poll
feedback worker of the local stack (on AWS, ``functions/feedback`` consumes the same queue).

It receives feedback messages and applies each with ``clipper.feedback.FeedbackProcessor``. What happens to one
message never stops the worker, nor does a failure of the queue itself (a failed receive or delete is logged,
and the loop goes on):

- applied, a duplicate, no recorded prediction, an app that does not learn or no longer exists: acknowledged
  (deleted), since nothing is left to do;
- a dependency unavailable (the store, the cache, the registry): left in the queue, so it comes back after its
  visibility timeout; after the queue's maxReceiveCount the redrive policy moves it to the dead-letter queue;
- a message that does not decode (poison: no retry can help): moved to the dead-letter queue at once, with the
  reason in its ``clipper-error`` attribute, then deleted; it is kept there for inspection, not acknowledged
  and lost (left in the queue when the queue has no dead-letter queue or the move fails);
- any other error (a bug, a deployment fault such as a missing table; logged with its traceback): left in the
  queue like an unavailable dependency. It may pass once the cause is fixed, so it is retried, then
  dead-lettered by the redrive policy, and never acknowledged unapplied;
- with the prediction cache off (``CLIPPER_CACHE_ENABLED=false``) or no selection table, feedback cannot be
  joined with the predictions it is about: the worker says so once at start and deletes each message it skips.

Beside the loop, a thread reviews the running canaries each second (``clipper.canary.review``): those found by
a scan of the registry's models each ``SWEEP_S`` and those whose evidence the feedback applied since grew (a canary
started since the last scan is reviewed once its feedback comes, as the feedback function does on AWS, or at the
next scan). It promotes or rolls back a canary once the evidence says so (``CanaryDecisions`` sent with
PutMetricData); no failure stops it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable

from clipper.entrypoints.signals import StopSignals
from clipper.errors import ClipperError, MalformedMessage, Unavailable
from clipper.feedback import FeedbackMessage, Outcome
from clipper.ports import QueueReader, ReceivedMessage

logger = logging.getLogger("clipper.feedback_worker")
# Each receive's long poll (SQS's longest): on an idle queue three requests a minute.
POLL_S = 20
# The local stack names a Redis key here (``infra.local.stack``): the time up to which moto's state is on disk.
LOCAL_DURABLE_KEY_ENV = "CLIPPER_LOCAL_DURABLE_KEY"
# ... and a key with the times between which moto's state was lost (it died; its restore put back an older copy)
LOCAL_LOST_KEY_ENV = "CLIPPER_LOCAL_LOST_KEY"
HELD_POLL_S = 2  # a receive's long poll while applied messages wait for the state copy
HOLD_MAX_S = 120.0  # the longest a message is held (the feedback queue's visibility timeout is 180 s)
# How often the registry's models are scanned for running canaries (each found is then reviewed each second, as is
# one whose evidence grew): the scan each second was most of the idle stack's requests to moto.
SWEEP_S = 10.0


class FeedbackWorker:
    def __init__(
        self,
        reader: QueueReader,
        apply: Callable[[FeedbackMessage], Outcome] | None,
        why_not: str = "",
        dead_letter: Callable[[str, str], None] | None = None,
        durable_at: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.time,
        lost: Callable[[], tuple[float, float] | None] | None = None,
    ):
        """``apply``: the processor's ``process``; None when feedback cannot be learned (``why_not`` says why).
        ``dead_letter(body, reason)``: moves a message that can never be processed to the dead-letter queue.
        ``durable_at``: the local stack's (``LOCAL_DURABLE_KEY``): the time (``clock``'s) up to which what the
        worker applied is on disk; a message handled later is acknowledged only once that time passes it.
        ``lost``: the local stack's (``LOCAL_LOST_KEY``): the times between which what was applied went with a
        moto that died (its restore put back a copy from before): those messages are let go unacknowledged, to
        come back after the visibility timeout and be applied to the restored state."""
        self._reader = reader
        self._apply = apply
        self._why_not = why_not
        self._dead_letter = dead_letter
        self._durable_at = durable_at
        self._lost = lost
        self._clock = clock
        self._held: list[tuple[float, list[str]]] = []  # (handled at, receipts) not acknowledged yet
        self._held_lock = threading.Lock()
        self._handling = threading.Lock()  # held while received messages are handled
        self.counts: dict[str, int] = {}

    def handle(self, messages: list[ReceivedMessage]) -> list[str]:
        """Process one batch; returns the receipt handles it deleted (the others stay for a retry, or, with
        ``durable_at``, until what they did is on disk: ``release``)."""
        done = []
        for m in messages:
            outcome = self._one(m)
            if outcome is not None:
                self.counts[outcome] = self.counts.get(outcome, 0) + 1
                done.append(m.receipt_handle)
        if self._durable_at is not None:
            if done:
                handled_at = self._clock()  # after their writes: a copy that began later holds them
                with self._held_lock:
                    self._held.append((handled_at, done))
            return self.release(self._reader)
        if done:
            try:
                self._reader.delete(done)
            except ClipperError as e:  # they come back and are applied once (applied ids are recorded)
                logger.warning("processed feedback not deleted (it will come back): %s", e)
                return []
        return done

    def release(self, reader: QueueReader) -> list[str]:
        """With ``durable_at``: acknowledge (through ``reader``) the messages handled before it; the rest stay held.
        On the local stack moto keeps the bandit states in memory and its state is copied to disk every few
        seconds: a message acknowledged as soon as it was applied was lost with moto (a ``kill -9`` of the stack)
        though the client had been answered 200. Held, it comes back after its visibility timeout and is applied
        to the state the copy restored."""
        if self._durable_at is None:
            return []
        try:
            durable = self._durable_at()
            gone = self._lost() if self._lost is not None else None
        except Exception as e:  # held on: the next batch asks again
            logger.debug("durable time not read: %s", e)
            return []
        if gone is not None:
            with self._held_lock:
                lost = [(at, receipts) for at, receipts in self._held if gone[0] <= at <= gone[1]]
                self._held = [(at, receipts) for at, receipts in self._held if not gone[0] <= at <= gone[1]]
            if lost:
                logger.warning(
                    "%d applied feedback message(s) went with moto's restart: not acknowledged, they come back after "
                    "the visibility timeout and are applied to the restored state",
                    sum(len(receipts) for _, receipts in lost),
                )
        # held no longer than HOLD_MAX_S, under the visibility timeout: a copy that keeps failing (a full disk)
        # would otherwise have every applied message delivered again and again, then dead-lettered though applied
        oldest = self._clock() - HOLD_MAX_S
        with self._held_lock:
            ready = [r for at, receipts in self._held if at < durable or at < oldest for r in receipts]
            aged = sum(len(receipts) for at, receipts in self._held if durable <= at < oldest)
            self._held = [(at, receipts) for at, receipts in self._held if at >= durable and at >= oldest]
        if aged:
            logger.warning(
                "%d applied feedback message(s) acknowledged without a state copy after %.0f s (the copy is not "
                "being written): a kill -9 of the stack now would lose them",
                aged,
                HOLD_MAX_S,
            )
        if ready:
            try:
                reader.delete(ready)
            except ClipperError as e:  # they come back after their visibility timeout, and are found applied
                logger.warning("applied feedback not acknowledged (it will come back): %s", e)
                return []
        return ready

    @property
    def held(self) -> int:
        """Messages handled and not acknowledged yet (``durable_at``)."""
        with self._held_lock:
            return sum(len(receipts) for _, receipts in self._held)

    def _one(self, m: ReceivedMessage) -> str | None:
        if self._apply is None:
            logger.info("feedback skipped: %s", self._why_not)
            return "skipped"
        try:
            message = FeedbackMessage.from_json(m.body)
        except MalformedMessage as e:
            return self._poison(m, str(e))
        # the feedback id is what the client was answered (POST /<app>/update): it names the feedback in the log
        which = f"{message.feedback_id} (message {m.message_id})"
        try:
            outcome = self._apply(message)
        except MalformedMessage as e:
            return self._poison(m, str(e))
        except Unavailable as e:
            # not dead-lettered now: the message comes back after its visibility timeout, and only a message that
            # fails every one of its deliveries goes to the dead-letter queue (it read as if this one had)
            logger.warning("feedback %s not applied yet, retried after the visibility timeout: %s", which, e)
            return None
        except Exception:  # a bug or an unforeseen error: this message only, the worker goes on
            logger.exception("feedback %s failed unexpectedly (retried after the visibility timeout)", which)
            return None
        logger.info("feedback %s: %s", which, outcome)
        return outcome

    def _poison(self, m: ReceivedMessage, reason: str) -> str | None:
        if self._dead_letter is None:
            logger.error("feedback %s can never be applied (left to the redrive policy): %s", m.message_id, reason)
            return None
        try:
            self._dead_letter(m.body, reason)
        except Exception as e:  # left in the queue: the redrive policy moves it after maxReceiveCount
            logger.error(
                "feedback %s can never be applied, and was not dead-lettered: %s (%s)", m.message_id, reason, e
            )
            return None
        logger.error("feedback %s can never be applied, moved to the dead-letter queue: %s", m.message_id, reason)
        return "dead_lettered"

    def run(self, stop: threading.Event, wait_s: int = POLL_S, retry_s: float = 1.0) -> None:
        """Receive and handle until ``stop``; each receive long-polls up to ``wait_s`` (20 s, SQS's longest: on an
        idle queue three requests a minute). A stop does not wait for a receive: see ``finish``."""
        while not stop.is_set():
            # with messages held, back sooner to acknowledge them once the queue goes quiet
            wait = min(wait_s, HELD_POLL_S) if self._durable_at is not None and self.held else wait_s
            try:
                messages = self._reader.receive(10, wait)
            except Exception as e:  # the queue unreachable (moto restarting...): try again in a second
                logger.warning("feedback not received: %s", e)
                stop.wait(retry_s)
                continue
            if not messages:
                self.release(self._reader)  # held ones whose effects reached the disk since
                continue
            with self._handling:
                try:
                    self.handle(messages)
                    continue
                except Exception:  # the batch's messages come back after their visibility timeout; the worker goes on
                    logger.exception("feedback batch of %d not handled (it will come back)", len(messages))
            stop.wait(retry_s)  # the pause after a failed batch holds nothing a stop waits for

    def finish(self, timeout_s: float) -> bool:
        """After ``stop``: wait up to ``timeout_s`` for the messages in hand to be handled, not for a receive that
        waits for some (those it may still get come back after the queue's visibility timeout). False: still
        handling."""
        if not self._handling.acquire(timeout=timeout_s):
            return False
        self._handling.release()
        return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="clipper-feedback", description=__doc__.split("\n\n")[0])
    p.add_argument("--queue-url", required=True, help="the feedback queue")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    signals = StopSignals()
    signals.listen()  # first, on the main thread: until the worker runs, a signal ends the process at once
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    from clipper.adapters.canary_metrics import CloudWatchCanaryMetrics
    from clipper.adapters.sqs import SqsQueueReader
    from clipper.adapters.sqs_dead_letter import SqsDeadLetterQueue
    from clipper.settings import CommonSettings
    from clipper.wiring import (
        aws_client,
        build_canary_reviewer,
        build_feedback_processor,
        prediction_cache,
        queue_reader,
        selection_store,
    )

    settings = CommonSettings()  # type: ignore[call-arg]
    dynamodb = aws_client("dynamodb")
    store, cache = selection_store(settings, dynamodb), prediction_cache(settings, dynamodb)
    apply = None
    touched: Callable[[], Iterable[str]] = tuple  # no feedback applied: no evidence grows (the sweeps find canaries)
    why_not = ""
    if cache is None:
        why_not = "the prediction cache is off (CLIPPER_CACHE_ENABLED=false), so no prediction is recorded to join with"
    elif store is None:
        why_not = "no selection table (CLIPPER_SELECTION_TABLE) holds bandit states"
    else:
        processor = build_feedback_processor(settings, dynamodb)
        apply, touched = processor.process, processor.take_touched
    if why_not:
        logger.warning("feedback is not learned: %s; each message is deleted unapplied", why_not)
    # the client waits longer than a long poll: one that gave up first left moto's poll open, and a message that
    # arrived then went to the abandoned request (invisible for the visibility timeout, and again and again)
    sqs = aws_client("sqs", read_timeout=POLL_S + 10)
    dlq: SqsDeadLetterQueue | None = None
    if settings.queue_transport == "redis":  # the frontend's feedback queue is a Redis stream (wiring)
        # the FeedbackQueue's VisibilityTimeout and maxReceiveCount (template.yaml): a message that keeps failing
        # goes to the stream's dead letters after 5 deliveries, one that cannot be decoded too
        reader = queue_reader(settings, sqs, args.queue_url, visibility_timeout_s=180.0, max_receive_count=5)
    else:
        reader = SqsQueueReader(sqs, args.queue_url)
        try:
            dlq = SqsDeadLetterQueue.of(sqs, args.queue_url)
        except ClipperError as e:  # the queue unreachable now: the redrive policy still dead-letters poison, later
            logger.warning("the feedback queue's dead-letter queue not found: %s", e)
        if dlq is None:
            logger.warning("no dead-letter queue known: a message that cannot be decoded waits for the redrive policy")
    durable_at = lost = None
    durable_key = os.environ.get(LOCAL_DURABLE_KEY_ENV, "")
    if durable_key and settings.queue_transport == "redis":  # the local stack's: moto's state reaches the disk late
        durable_at, lost = _durability(settings.redis_url, durable_key, os.environ.get(LOCAL_LOST_KEY_ENV, ""))
        logger.info("feedback acknowledged once moto's state copy holds what it did (%s)", durable_key)
    worker = FeedbackWorker(reader, apply, why_not, dlq.send if dlq else None, durable_at=durable_at, lost=lost)
    signals.ready()
    stop = signals.stop
    reviewer = build_canary_reviewer(settings, dynamodb, CloudWatchCanaryMetrics(aws_client("cloudwatch")))
    reviews = threading.Thread(
        target=reviewer.run,
        args=(stop,),
        kwargs={"touched": touched, "sweep_s": SWEEP_S},
        name="clipper-canary-review",
        daemon=True,
    )
    reviews.start()
    logger.info(
        "feedback worker polling %s; reviewing running canaries each second (looked for every %g s)",
        args.queue_url,
        SWEEP_S,
    )
    receiving = threading.Thread(target=worker.run, args=(stop,), name="clipper-feedback", daemon=True)
    receiving.start()
    while not stop.wait(0.5):  # the signals' thread sets stop; the loop's long poll is not interrupted by them
        if not receiving.is_alive():
            logger.error("the feedback loop ended unexpectedly")
            return 1
    if not worker.finish(timeout_s=5):
        logger.warning("feedback still being handled at exit: it comes back after the visibility timeout")
    if durable_at is not None and worker.held:
        # the launcher copied moto's state before it stopped this worker: what was applied before that copy is
        # acknowledged now, through a connection of its own (the receiving thread may be in a blocking read)
        released = worker.release(queue_reader(settings, sqs, args.queue_url, visibility_timeout_s=180.0))
        if worker.held:
            logger.info(
                "%d applied feedback message(s) not acknowledged at exit (after the last state copy): they come "
                "back after the visibility timeout and are found applied, or applied again to the state restored",
                worker.held,
            )
        logger.debug("%d acknowledged at exit", len(released))
    reviews.join(timeout=5)
    logger.info("feedback worker stopped: %s", worker.counts)
    return 0


def _durability(
    redis_url: str, key: str, lost_key: str
) -> tuple[Callable[[], float], Callable[[], tuple[float, float] | None]]:
    """Readers of the time in ``key`` (0 when unset) and of the lost range in ``lost_key`` ("<from> <to>"; None when
    unset), from any thread."""
    from clipper.adapters.resp import RespClient

    client = RespClient.from_url(redis_url)

    def get(name: str) -> str:
        (value,) = client.execute([("GET", name)])
        if isinstance(value, Exception):
            raise Unavailable(f"redis GET {name}: {value}")
        return value.decode() if isinstance(value, bytes) else str(value or "")

    def durable_at() -> float:
        return float(get(key) or 0.0)

    def lost() -> tuple[float, float] | None:
        text = get(lost_key) if lost_key else ""
        if not text:
            return None
        start, end = (float(x) for x in text.split())
        return start, end

    return durable_at, lost


if __name__ == "__main__":
    sys.exit(main())
