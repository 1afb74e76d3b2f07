"""The batcher core: decode query messages, drop expired and duplicate ones, call the model endpoint
once per group of compatible rows, and deliver one reply per message.

Deadline-aware cutting (``process(..., defer=True)``, the long-poll driver's way): a group's members are
taken earliest deadline first while the batch's predicted latency (``LatencyModel``, fitted per model on
the batches so far) still lets the earliest of them meet its deadline; the others are *deferred*: reported
apart, for the driver to hold and offer again with its next batch. The Lambda driver cannot hold messages,
so it processes everything it gets.

Invariant (Ray Serve's): a batched call yields exactly one output per input row, or fails every message
of the batch with the same error; a batch the endpoint refuses (its input checks, or the model failing on it:
``BatchRefused``) is sent again in halves, so one query's bad input fails that query alone (``_halve``, bounded).
A message that fails is reported to the driver, which leaves it for retry (and, after the queue's
``maxReceiveCount``, the dead-letter queue); one bad message never fails the others.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clipper.batching.latency import LatencyModel
from clipper.core.cache_keys import row_keys
from clipper.core.messages import QueryMessage, Reply, decode_rows, no_answer
from clipper.core.validation import Rows
from clipper.errors import BatchRefused, ClipperError, EndpointError, MalformedMessage, NotFound, RowTooLarge
from clipper.ports import ClaimStore, Clock, EndpointResolver, PredictionCache, PublishAndFill, ReplyPublisher

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inbound:
    """A message as a driver received it."""

    message_id: str
    body: str
    # epoch ms at which the driver received it: the batch wait (until its batch starts) is reported apart
    # from the queue wait when known
    received_ms: float | None = None
    # The queue says this is the message's first delivery (receive count 1): no earlier delivery can have
    # answered it, so the duplicate check (one round trip a batch) is skipped for it. A copy the queue
    # delivers twice as "first" (SQS's at-least-once) is computed twice and its second reply dropped by the
    # channel's once-per-(reply_to, model) rule: a wasted row, never a second answer.
    first_delivery: bool = False

    @classmethod
    def from_sqs_record(cls, record: dict[str, Any]) -> Inbound:
        """A record of an SQS event source's event. Its batch wait starts when the event source took the
        message from the queue (``ApproximateFirstReceiveTimestamp``; the batching window and the invocation
        follow); a redelivery's first receive is older than its wait, so it reports none."""
        attributes = record.get("attributes", {})
        stamp = attributes.get("ApproximateFirstReceiveTimestamp")
        first = attributes.get("ApproximateReceiveCount") == "1"
        return cls(record["messageId"], record["body"], float(stamp) if stamp and first else None, first)


@dataclass
class BatchReport:
    failed: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)  # cut from this batch to meet deadlines (defer=True)
    answered: int = 0
    expired: int = 0
    duplicates: int = 0
    batches: list[tuple[str, int, float]] = field(default_factory=list)  # (model, rows, seconds)
    endpoint_errors: int = 0  # messages whose batch the endpoint failed (each is left for a retry)


@dataclass
class _Work:
    message_id: str
    message: QueryMessage
    rows: Rows
    received_ms: float | None = None


GroupKey = tuple[str, str, Any, tuple[int, ...]]


def _group_key(work: _Work) -> GroupKey:
    rows = work.rows
    if isinstance(rows, np.ndarray):
        return (work.message.model, work.message.version, rows.dtype, rows.shape[1:])
    kind = "bytes" if rows and isinstance(rows[0], bytes) else "str"
    return (work.message.model, work.message.version, kind, ())


def _concat(parts: list[Rows]) -> Rows:
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    out: list[str] | list[bytes] = []
    for p in parts:
        out.extend(p)  # type: ignore[arg-type]
    return out


class Batcher:
    def __init__(
        self,
        endpoints: EndpointResolver,
        replies: ReplyPublisher,
        clock: Clock,
        claims: ClaimStore | None = None,
        cache: PredictionCache | None = None,
        publish_and_fill: PublishAndFill | None = None,
    ) -> None:
        """``publish_and_fill``: where the cache and the reply channel are one Redis, a batch's cache fill and
        replies in one round trip (used only with ``cache``)."""
        self._endpoints = endpoints
        self._replies = replies
        self._clock = clock
        self._claims = claims
        self._cache = cache
        self._fused = publish_and_fill if cache is not None else None
        # The fastest recent batches: no query whose remaining time is under this can still be answered.
        self._recent_latency: deque[float] = deque(maxlen=50)
        self._latency: dict[tuple[str, str], LatencyModel] = {}

    def latency_model(self, model: str, version: str) -> LatencyModel:
        """The fitted batch latency of one model version (created empty on first use)."""
        key = (model, version)
        fitted = self._latency.get(key)
        if fitted is None:
            fitted = self._latency[key] = LatencyModel()
        return fitted

    @property
    def latency_floor_s(self) -> float:
        return min(self._recent_latency, default=0.0)

    def rows_of(self, message: QueryMessage) -> Rows:
        """The message's rows (fetching a claim-checked payload from S3)."""
        claimed = None
        if message.payload.s3_key is not None:
            if self._claims is None:
                raise MalformedMessage("claim-check message but no claim store is configured")
            claimed = self._claims.get(message.payload.s3_key)
        rows = decode_rows(message.payload, claimed)
        if len(rows) != message.rows:
            raise MalformedMessage(f"message says {message.rows} rows, payload has {len(rows)}")
        return rows

    def process(self, inbound: Sequence[Inbound], defer: bool = False) -> BatchReport:
        """Answer ``inbound``; with ``defer``, cut each group to what can meet its earliest deadline and
        report the rest as ``deferred`` (not answered, not failed: the caller offers them again)."""
        report = BatchReport()
        now_ms = self._clock.now() * 1000
        floor_ms = self.latency_floor_s * 1000
        seen: set[tuple[str, str]] = set()
        live: list[tuple[Inbound, QueryMessage]] = []
        for item in inbound:
            try:
                msg = QueryMessage.from_json(item.body)
            except ClipperError as e:
                logger.warning("undecodable message", extra={"message_id": item.message_id, "error": str(e)})
                report.failed.append(item.message_id)
                continue
            # The cheap checks first: an expired or duplicate message costs no payload decoding.
            if msg.deadline_ms <= now_ms + floor_ms:  # expired, or cannot be answered in time any more
                report.expired += 1
                continue
            key = (msg.reply_to, msg.model)
            if key in seen:
                report.duplicates += 1
                continue
            seen.add(key)
            live.append((item, msg))
        groups: dict[GroupKey, list[_Work]] = {}
        for (item, msg), duplicate in zip(live, self._answered(live, report), strict=True):
            if duplicate is None:
                report.failed.append(item.message_id)
                continue
            if duplicate:
                report.duplicates += 1
                continue
            try:
                work = _Work(item.message_id, msg, self.rows_of(msg), item.received_ms)
            except (MalformedMessage, NotFound) as e:  # no retry decodes it: its query hears why now, not at its SLO
                logger.warning("undecodable payload", extra={"message_id": item.message_id, "error": str(e)})
                invalid = Reply(
                    query_id=msg.query_id, model=msg.model, version=msg.version, error=str(e), error_kind="invalid"
                )
                # left for the retries all the same: after the queue's maxReceiveCount it is dead-lettered
                self._deliver([_Work(item.message_id, msg, [], item.received_ms)], [invalid], report, failed=True)
                continue
            except ClipperError as e:  # the claim-check store unavailable: a retry may read it
                logger.warning("payload not read", extra={"message_id": item.message_id, "error": str(e)})
                report.failed.append(item.message_id)
                continue
            groups.setdefault(_group_key(work), []).append(work)
        for (model, version, _, _), members in groups.items():
            if defer:  # budgeted from now: the lookups, claim-check reads and earlier groups' calls took their time
                members = self._cut(model, version, members, self._clock.now() * 1000, report)
            if members:
                self._run_group(model, version, members, report)
        return report

    def _cut(self, model: str, version: str, members: list[_Work], now_ms: float, report: BatchReport) -> list[_Work]:
        """Earliest deadline first, as many members as the predicted batch latency lets the earliest meet its
        deadline; the rest are deferred. Once the latency line is fitted, a member that could not meet its
        deadline even alone is dropped as expired (in an overload it would only slow the others down), but the
        group's last member always runs: a line fitted on an outlier (a cold first batch) would otherwise
        drop every query and, seeing no batch, never be corrected."""
        members = sorted(members, key=lambda w: w.message.deadline_ms)
        fitted = self.latency_model(model, version)
        total = sum(w.message.rows for w in members)
        while members:
            budget_s = (members[0].message.deadline_ms - now_ms) / 1000
            fits = fitted.rows_within(budget_s, total)
            if fits >= total:
                return members
            if fits >= members[0].message.rows or not fitted.fitted or len(members) == 1:
                break
            report.expired += 1
            total -= members.pop(0).message.rows
        taken, rows = 1, members[0].message.rows
        while taken < len(members) and rows + members[taken].message.rows <= fits:
            rows += members[taken].message.rows
            taken += 1
        report.deferred.extend(w.message_id for w in members[taken:])
        return members[:taken]

    def _answered(self, live: list[tuple[Inbound, QueryMessage]], report: BatchReport) -> list[bool | None]:
        """Whether each message was answered already (a redelivery); None where the channel is down. Only
        redeliveries are looked up: a first delivery is known unanswered."""
        out: list[bool | None] = [False] * len(live)
        asked = [i for i, (item, _) in enumerate(live) if not item.first_delivery]
        if not asked:
            return out
        found: list[bool | None]
        try:
            found = list(self._replies.answered_many([(live[i][1].reply_to, live[i][1].model) for i in asked]))
        except ClipperError as e:
            logger.warning("reply channel unavailable", extra={"error": str(e)})
            found = [None] * len(asked)
        for i, answered in zip(asked, found, strict=True):
            out[i] = answered
        return out

    def _run_group(self, model: str, version: str, members: list[_Work], report: BatchReport) -> None:
        refused = self._attempt(model, version, members, report)
        if refused is None:
            return
        if len(members) == 1:
            self._fail_group(model, version, members, refused, report)
            return
        logger.warning("batch refused, sent again in halves", extra={"model": model, "error": str(refused)})
        self._halve(model, version, members, refused, report)

    def _halve(
        self, model: str, version: str, members: list[_Work], refused: BatchRefused, report: BatchReport
    ) -> None:
        """A batch of several queries the endpoint refused (``BatchRefused``: one query's input may be the cause):
        each half is sent again; a half answered is done, a refused half is halved again, and a query refused alone
        fails alone, so one bad input costs about 2 log2(n) calls and its batch's other queries are answered.
        Bounded: when both halves are refused (a model that refuses every input, or bad inputs in both) both fail
        with no further call, and a half whose queries are all past their deadlines (their frontends answered the
        default) fails without a call."""
        cut = len(members) // 2
        halves = (members[:cut], members[cut:])
        outcomes: list[BatchRefused | None] = []
        for half in halves:
            now_ms = self._clock.now() * 1000
            if all(w.message.deadline_ms <= now_ms for w in half):
                outcomes.append(refused)
                continue
            outcomes.append(self._attempt(model, version, half, report))
        if all(o is not None for o in outcomes):
            for half, o in zip(halves, outcomes, strict=True):
                self._fail_group(model, version, half, o or refused, report)
            return
        for half, o in zip(halves, outcomes, strict=True):
            if o is None:
                continue
            if len(half) == 1:
                self._fail_group(model, version, half, o, report)
            else:
                self._halve(model, version, half, o, report)

    def _attempt(self, model: str, version: str, members: list[_Work], report: BatchReport) -> BatchRefused | None:
        """Call the endpoint with the members' rows and deliver their replies, or their failure; a refusal of the
        batch is returned, undelivered, for the caller to split (``_halve``)."""
        rows = _concat([w.rows for w in members])
        start = self._clock.now()
        try:
            outputs = self._call(model, version, rows)
        except RowTooLarge as e:  # one query's row the endpoint cannot take: it fails alone, the rest go on
            self._fail_oversized(model, version, members, e, report)
            return None
        except BatchRefused as e:
            return e
        except ClipperError as e:
            self._fail_group(model, version, members, e, report)
            return None
        end = self._clock.now()
        self._recent_latency.append(end - start)
        self.latency_model(model, version).observe(len(rows), end - start)
        report.batches.append((model, len(rows), end - start))
        start_ms, inference_ms, size = start * 1000, (end - start) * 1000, float(len(rows))
        replies = []
        offset = 0
        for w in members:
            n = w.message.rows
            timings = {
                "queue_ms": max(0.0, start_ms - w.message.sent_ms),
                "inference_ms": inference_ms,
                "batch_size": size,
            }
            if w.received_ms is not None:
                timings["batch_wait_ms"] = max(0.0, start_ms - w.received_ms)
            replies.append(
                # validated: pydantic-core's checks cost less than model_construct's Python (1.3 us against 4.4)
                Reply(
                    query_id=w.message.query_id,
                    model=model,
                    version=version,
                    outputs=list(outputs[offset : offset + n]),
                    timings=timings,
                )
            )
            offset += n
        entries = _cache_entries(model, version, members, outputs) if self._cache is not None else None
        self._deliver(members, replies, report, failed=False, entries=entries)
        return None

    def _fail_group(self, model: str, version: str, members: list[_Work], e: ClipperError, report: BatchReport) -> None:
        logger.warning("batch failed", extra={"model": model, "version": version, "error": str(e)})
        report.endpoint_errors += len(members)
        error = str(e)
        replies = [
            Reply(query_id=w.message.query_id, model=model, version=version, error=error, error_kind="endpoint")
            for w in members
        ]
        self._deliver(members, replies, report, failed=True)

    def _call(self, model: str, version: str, rows: Rows) -> list[Any]:
        """The endpoint's outputs, one a row. Anything else it raises is an endpoint error too: a client that let
        an unexpected answer through (a TypeError) took the batcher's process down, and the batch's messages with
        it at each redelivery."""
        try:
            outputs = self._endpoints.endpoint_for(model, version).predict(rows)
        except ClipperError:
            raise
        except Exception as e:
            logger.exception("endpoint client failed", extra={"model": model, "version": version})
            raise EndpointError(f"endpoint client failed: {type(e).__name__}: {e}") from e
        if not isinstance(outputs, list) or len(outputs) != len(rows):
            got = f"{len(outputs)} outputs" if isinstance(outputs, list) else type(outputs).__name__
            raise EndpointError(f"endpoint returned {got} for {len(rows)} inputs")
        return outputs

    def _fail_oversized(
        self, model: str, version: str, members: list[_Work], e: RowTooLarge, report: BatchReport
    ) -> None:
        """Answer the member holding row ``e.index`` with the error (a retry cannot shrink it: it is answered,
        not left for one), and run the others as a batch of their own."""
        k, offset = 0, members[0].message.rows
        while offset <= e.index and k < len(members) - 1:
            k += 1
            offset += members[k].message.rows
        logger.warning("input too large for the endpoint", extra={"model": model, "version": version, "error": str(e)})
        error = Reply(
            query_id=members[k].message.query_id, model=model, version=version, error=str(e), error_kind="endpoint"
        )
        self._deliver([members[k]], [error], report, failed=False)
        rest = members[:k] + members[k + 1 :]
        if rest:
            self._run_group(model, version, rest, report)

    def _deliver(
        self,
        members: list[_Work],
        replies: list[Reply],
        report: BatchReport,
        failed: bool,
        entries: dict[str, Any] | None = None,
    ) -> None:
        """Publish one reply per member in one call, and fill the cache with ``entries`` (in the same round trip
        where the channel and the cache are one Redis); when the channel fails, every member is reported failed
        (left for a retry: one delivered meanwhile is a duplicate then, answered once); so is a failed batch. A
        reply the channel dropped as a duplicate (a copy delivered as a first delivery twice) counts as a
        duplicate, not an answer."""
        addressed = [(w.message.reply_to, r) for w, r in zip(members, replies, strict=True)]
        delivered: list[bool] = []
        fused = self._fused if entries is not None else None
        try:
            if fused is not None and entries is not None:
                delivered = fused.publish_and_fill(addressed, entries)
            else:
                delivered = self._replies.publish_many(addressed)
        except ClipperError as e:
            logger.warning("replies not delivered", extra={"count": len(replies), "error": str(e)})
            failed = True
        if entries and fused is None and self._cache is not None:
            try:
                self._cache.put_many(entries)
            except ClipperError as e:  # a cache miss later only costs a recomputation
                logger.warning("cache not filled", extra={"error": str(e)})
        if failed:
            report.failed.extend(w.message_id for w in members)
        else:
            dropped = sum(1 for ok in delivered if not ok)
            report.answered += len(members) - dropped
            report.duplicates += dropped


def _cache_entries(model: str, version: str, members: list[_Work], outputs: list[Any]) -> dict[str, Any]:
    """The cache entries of a batch's outputs: each row's key (the one its message carries, else its hash) and
    its output. A row the model gave no answer for (``null``, or a score that is not a finite number: NaN and
    infinities travel as ``null`` in JSON) is not cached: it would be a hit that answers nothing, for the cache's
    TTL, and the queries waiting on its claim would wait out their SLO instead of hearing that it failed (its
    owner releases the claim with the cause)."""
    entries: dict[str, Any] = {}
    offset = 0
    for w in members:
        keys = w.message.cache_keys
        if keys is None or len(keys) != len(w.rows):
            keys = row_keys(model, version, w.rows)
        for key, output in zip(keys, outputs[offset : offset + len(keys)], strict=True):
            if not no_answer(output):
                entries[key] = output
        offset += len(keys)
    return entries
