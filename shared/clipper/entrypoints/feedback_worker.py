"""``clipper-feedback`` (``python -m clipper.entrypoints.feedback_worker --queue-url URL``): the long-poll
feedback worker of the local stack (on AWS, ``functions/feedback`` consumes the same queue).

It receives feedback messages and applies each with ``clipper.feedback.FeedbackProcessor``. What happens to one
message never stops the worker:

- applied, a duplicate, no recorded prediction, an app that does not learn or no longer exists: deleted;
- a dependency unavailable, a malformed message, or any unexpected error (logged with its traceback): left in
  the queue, so it comes back after its visibility timeout and, after the queue's maxReceiveCount, goes to the
  dead-letter queue;
- with the prediction cache off (``CLIPPER_CACHE_ENABLED=false``) or no selection table, feedback cannot be
  joined with the predictions it is about: the worker says so once at start and deletes each message it skips.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable

from clipper.errors import ClipperError, MalformedMessage, Unavailable
from clipper.feedback import FeedbackMessage, Outcome
from clipper.ports import QueueReader, ReceivedMessage

logger = logging.getLogger("clipper.feedback_worker")


class FeedbackWorker:
    def __init__(self, reader: QueueReader, apply: Callable[[FeedbackMessage], Outcome] | None, why_not: str = ""):
        """``apply``: the processor's ``process``; None when feedback cannot be learned (``why_not`` says why)."""
        self._reader = reader
        self._apply = apply
        self._why_not = why_not
        self.counts: dict[str, int] = {}

    def handle(self, messages: list[ReceivedMessage]) -> list[str]:
        """Process one batch; returns the receipt handles it deleted (the others stay for a retry)."""
        done = []
        for m in messages:
            outcome = self._one(m)
            if outcome is not None:
                self.counts[outcome] = self.counts.get(outcome, 0) + 1
                done.append(m.receipt_handle)
        if done:
            try:
                self._reader.delete(done)
            except ClipperError as e:  # they come back and are applied once (applied ids are recorded)
                logger.warning("processed feedback not deleted (it will come back): %s", e)
                return []
        return done

    def _one(self, m: ReceivedMessage) -> str | None:
        if self._apply is None:
            logger.info("feedback skipped: %s", self._why_not)
            return "skipped"
        try:
            outcome = self._apply(FeedbackMessage.from_json(m.body))
        except (Unavailable, MalformedMessage) as e:
            logger.warning("feedback %s failed (retried, then dead-lettered): %s", m.message_id, e)
            return None
        except Exception:  # a bug or an unforeseen error: this message only, the worker goes on
            logger.exception("feedback %s failed unexpectedly (retried, then dead-lettered)", m.message_id)
            return None
        logger.info("feedback %s: %s", m.message_id, outcome)
        return outcome

    def run(self, stop: threading.Event, wait_s: int = 1, retry_s: float = 1.0) -> None:
        while not stop.is_set():
            try:
                messages = self._reader.receive(10, wait_s)
            except Exception as e:  # the queue unreachable (moto restarting...): try again in a second
                logger.warning("feedback not received: %s", e)
                stop.wait(retry_s)
                continue
            self.handle(messages)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="clipper-feedback", description=__doc__.split("\n\n")[0])
    p.add_argument("--queue-url", required=True, help="the feedback queue")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    from clipper.adapters.sqs import SqsQueueReader
    from clipper.settings import CommonSettings
    from clipper.wiring import aws_client, build_feedback_processor, prediction_cache, selection_store

    settings = CommonSettings()  # type: ignore[call-arg]
    dynamodb = aws_client("dynamodb")
    store, cache = selection_store(settings, dynamodb), prediction_cache(settings, dynamodb)
    apply = None
    why_not = ""
    if cache is None:
        why_not = "the prediction cache is off (CLIPPER_CACHE_ENABLED=false), so no prediction is recorded to join with"
    elif store is None:
        why_not = "no selection table (CLIPPER_SELECTION_TABLE) holds bandit states"
    else:
        apply = build_feedback_processor(settings, dynamodb).process
    if why_not:
        logger.warning("feedback is not learned: %s; each message is deleted unapplied", why_not)
    worker = FeedbackWorker(SqsQueueReader(aws_client("sqs"), args.queue_url), apply, why_not)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    logger.info("feedback worker polling %s", args.queue_url)
    worker.run(stop)
    logger.info("feedback worker stopped: %s", worker.counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
