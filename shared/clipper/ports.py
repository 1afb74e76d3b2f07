"""Ports: the narrow interfaces the core calls. Adapters in ``clipper.adapters`` implement them."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from clipper.canary.evidence import VersionEvidence
from clipper.core.domain import Application, Canary, ModelVersion
from clipper.core.messages import Reply
from clipper.core.validation import Rows

if TYPE_CHECKING:  # the batcher never loads the selection package
    from clipper.report.entry import FeedbackEntry
    from clipper.selection.state import SelectionState


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch (deadlines cross machines, so they are wall-clock)."""
        ...


class RequestQueue(Protocol):
    def send(self, queue_url: str, body: str, timeout: float | None = None) -> None: ...

    def send_many(self, messages: Sequence[tuple[str, str]], timeout: float | None = None) -> list[Exception | None]:
        """Send each ``(queue_url, body)`` (an ensemble's fan-out) in one round trip where the transport allows,
        concurrently where it does not; for each, None or the ``Unavailable`` that kept it from its queue.
        ``timeout`` bounds the call where the transport can (a query passes its remaining time)."""
        ...


@dataclass(frozen=True)
class ReceivedMessage:
    message_id: str
    receipt_handle: str
    body: str
    receive_count: int = 1
    received_ms: float | None = None  # epoch ms at which the driver got it (the batch wait starts there, or at sent_ms)
    # epoch ms at which it entered the queue, where the transport says (a first delivery from a Redis stream:
    # its entry id); a batcher that receives on its own thread dates the batch wait from it (``LongPollDriver``)
    sent_ms: float | None = None


class QueueReader(Protocol):
    """One model queue, as the long-poll driver consumes it."""

    def receive(self, max_messages: int, wait_s: float) -> list[ReceivedMessage]: ...

    def delete(self, receipt_handles: list[str]) -> None: ...

    def release(self, receipt_handle: str, delay_s: int) -> None:
        """Make a failed message visible again after ``delay_s`` seconds."""
        ...


@runtime_checkable
class DeletingReader(QueueReader, Protocol):
    """A queue whose receive can carry the deletes of the batch before it (Redis Streams): they travel in the
    round trip of the receive's first command, so a batcher that receives on its own thread acknowledges without
    a call or a thread of its own."""

    def receive_and_delete(self, receipt_handles: list[str], max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        """``delete(receipt_handles)``, then ``receive(max_messages, wait_s)``, the deletes in the round trip of
        the receive's first command (a receive that waits may take a second). A delete that
        the queue refuses is logged and counted (``delete_errors``), never raised: the messages received are
        returned (the refused ones come back after their visibility timeout, as after any failed delete). When
        the call fails as a whole it raises, and it is not known whether the deletes were done (deleting twice
        is harmless: the caller may send them again)."""
        ...


class ClaimStore(Protocol):
    """Holds inputs too large for a queue message (the claim-check pattern)."""

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...


class ReplyPublisher(Protocol):
    """The batcher's side of the reply channel: publish replies, check what was answered."""

    def publish(self, reply_to: str, reply: Reply) -> bool:
        """Deliver a reply. A successful reply is delivered once per (reply_to, model): a duplicate
        returns False and changes nothing. Error replies are always delivered."""
        ...

    def answered(self, reply_to: str, model: str) -> bool:
        """Whether a successful reply for this model was already delivered."""
        ...

    def publish_many(self, replies: Sequence[tuple[str, Reply]]) -> list[bool]:
        """``publish`` for each ``(reply_to, reply)`` of a batch, in as few round trips as the channel allows.
        Raises ``Unavailable`` when the channel cannot be reached (then none is known delivered)."""
        ...

    def answered_many(self, keys: Sequence[tuple[str, str]]) -> list[bool]:
        """``answered`` for each ``(reply_to, model)`` of a batch."""
        ...


class ReplyChannel(ReplyPublisher, Protocol):
    """Both sides: the batcher publishes (``ReplyPublisher``), the frontend waits for its queries' replies."""

    def new_address(self) -> str:
        """A fresh reply address for one query: unique (UUID-class), so no two live queries share one."""
        ...

    def expect(self, reply_to: str) -> None:
        """Start collecting the replies to ``reply_to``; called before the query's messages are sent."""
        ...

    def forget(self, reply_to: str) -> None:
        """End the expectation of ``reply_to`` without waiting: the query failed between ``expect`` and ``wait``
        (its replies, if any come, are dropped)."""
        ...

    def wait(self, reply_to: str, models: Collection[str], timeout_s: float) -> list[Reply]:
        """The replies to ``reply_to`` that arrive within ``timeout_s``, at most one per model (a success wins
        over an error); returns as soon as each of ``models`` has replied. Ends the expectation. Raises
        ``Unavailable`` when the channel could not be read and replies are missing."""
        ...

    async def wait_async(self, reply_to: str, models: Collection[str], timeout_s: float) -> list[Reply]:
        """``wait`` on an event loop."""
        ...


class PredictionCache(Protocol):
    """Model outputs by cache key (``clipper.core.cache_keys``), with single-flight claims. ``timeout`` bounds a
    call where the store can (a query passes its remaining time).

    A claim holds its ``owner``'s token (the query's own, unique), so only its owner ends it: a release or a
    failure sent late, after the claim expired and another query claimed the key, leaves that query's claim be."""

    def get_many(self, keys: list[str], timeout: float | None = None) -> dict[str, Any]:
        """The cached outputs of those keys that hit."""
        ...

    def lookup(
        self, keys: list[str], claim_ttl_s: float, timeout: float | None = None, owner: str = "1"
    ) -> tuple[dict[str, Any], set[str]]:
        """``get_many``, then ``claim`` of the misses, in as few round trips as the store allows: the cached
        outputs, and the keys this caller now computes."""
        ...

    def put_many(self, entries: dict[str, Any], timeout: float | None = None) -> None: ...

    def put_new(self, entries: dict[str, Any], timeout: float | None = None) -> None:
        """``put_many`` of the entries whose key holds nothing (or only an expired entry); the others are kept."""
        ...

    def claim(self, keys: list[str], ttl_s: float, timeout: float | None = None, owner: str = "1") -> set[str]:
        """Mark keys as being computed by ``owner``; returns the keys it now owns. A key already claimed by a
        concurrent query is not returned: that query's answer will fill the cache."""
        ...

    def fail_many(self, failures: dict[str, str], ttl_s: float, timeout: float | None = None, *, owner: str) -> None:
        """The owner of these claims got no output from its model: the claims it still holds hold the cause for
        ``ttl_s``, so the queries waiting on them stop at once with it."""
        ...

    def release(self, keys: list[str], owner: str, timeout: float | None = None) -> None:
        """The owner of these claims got no output for want of time (or of its own dependencies): the claims it
        still holds end, so a query waiting on them with time left computes the input itself."""
        ...

    def poll(self, keys: list[str], timeout: float | None = None) -> tuple[dict[str, Any], dict[str, str]]:
        """For keys other queries compute: ``(outputs of those that hit, causes of those whose owner failed)``."""
        ...

    def poll_or_claim(
        self, keys: list[str], claim_ttl_s: float, owner: str, timeout: float | None = None
    ) -> tuple[dict[str, Any], dict[str, str], set[str]]:
        """``poll``, and a claim by ``owner`` of the keys that nobody holds any more (their owner released them,
        or its claim expired): ``(outputs, causes, the keys ``owner`` now computes)``."""
        ...


class LookupOrSend(Protocol):
    """The cache lookup and the sends of a single-input query in one call (one standalone Redis holding both)."""

    def lookup_or_send(
        self,
        requests: Sequence[tuple[str, str, str]],
        claim_ttl_s: float,
        timeout: float | None = None,
        owner: str = "1",
    ) -> list[tuple[str, Any]]:
        """For each ``(cache key, queue URL, message body)``: ``("hit", output)``, ``("sent", None)`` (claimed by
        ``owner``, message sent: this query computes it) or ``("waiting", None)`` (another query computes it)."""
        ...


class PublishAndFill(Protocol):
    """A batch's cache entries written and its replies published in one call (one standalone Redis holding
    both): the entries first, so a query told of an answer finds it cached."""

    def publish_and_fill(self, replies: Sequence[tuple[str, Reply]], entries: dict[str, Any]) -> list[bool]:
        """``ReplyChannel.publish_many`` of ``replies`` (raises ``Unavailable`` when they were not published),
        with ``PredictionCache.put_many`` of ``entries`` (a failure of that is logged, not raised)."""
        ...


class ControllerStateStore(Protocol):
    """Where a batching controller's state survives cold starts."""

    def load(self, model: str, version: str) -> dict[str, Any] | None: ...

    def save(self, model: str, version: str, state: dict[str, Any]) -> None: ...


class SelectionStore(Protocol):
    """Bandit state per key (``clipper.selection.state_key``), written with optimistic concurrency."""

    def load(self, key: str) -> SelectionState | None: ...

    def save(self, key: str, state: SelectionState, expected_version: int, feedback_id: str | None = None) -> bool:
        """Write ``state`` if the stored version is still ``expected_version`` (0: none stored yet), and
        mark ``feedback_id`` applied in the same transaction. Returns False when that feedback was already
        applied (a redelivery: nothing changes); raises ``Conflict`` when another writer got there first."""
        ...


class FeedbackLog(Protocol):
    """Append-only: one entry per applied feedback, joined with the prediction it is about (the selection report's
    source). Entries expire after the log's retention."""

    def append(self, entry: FeedbackEntry) -> None: ...

    def count_skipped(self, app: str, outcome: str, at: float, feedback_id: str | None = None) -> bool:
        """Count a feedback that was not learned (``no_record``, ``label_mismatch``...), by application, outcome and
        UTC day: the report shows what was not learned, and why. With its ``feedback_id``, once: a delivery of the
        same feedback again counts nothing (False)."""
        ...


class Registry(Protocol):
    def get_app(self, name: str) -> Application: ...

    def linked_models(self, app: str) -> list[str]: ...

    def active_version(self, model: str) -> ModelVersion: ...

    def get_version(self, model: str, version: str) -> ModelVersion: ...

    def canary(self, model: str) -> Canary | None:
        """The model's running canary, or None (also for an unknown model: ``active_version`` says that)."""
        ...


class CanaryEvidenceStore(Protocol):
    """Per-version counters of a canary trial (``Canary.trial``), added atomically from many writers (the
    frontends' query outcomes, the feedback worker's losses) and read whole by the one that decides."""

    def add(self, model: str, trial: str, version: str, delta: VersionEvidence) -> None: ...

    def load(self, model: str, trial: str) -> dict[str, VersionEvidence]:
        """The evidence of each version counted in the trial so far (versions with none are absent)."""
        ...


class CanaryFeedbackEvidence(Protocol):
    """Where the feedback worker adds a canary trial's losses: once per feedback id, though a message is
    delivered at least once."""

    def add_once(self, model: str, trial: str, version: str, delta: VersionEvidence, token: str) -> bool:
        """Add ``delta`` unless ``token`` was added to this trial of ``model`` before; True when this call added."""
        ...


class CanaryControl(Protocol):
    """What ends a canary trial and keeps its record (the registry, on the model's item)."""

    def end_canary(self, model: str, trial: str, promote: bool) -> bool:
        """End the model's canary if ``trial`` is still the one running: promote makes the canary's version the
        active one (a version switch, in the history that rollback walks back), else the active version keeps
        every query. True when this call ended it; False when that trial was no longer running (another
        reviewer, or an operator, ended it first)."""
        ...

    def add_canary_event(self, model: str, event: dict[str, Any]) -> None:
        """Keep a decision (or a start, an abort) with its evidence, for ``inspect`` and the CLI."""
        ...


class CanaryDecisionMetrics(Protocol):
    """Counts a canary decision that ended a trial (``CanaryDecisions`` by model and kind; by kind alone too,
    for an alarm on every rollback)."""

    def decision(self, model: str, kind: str) -> None: ...


class ModelEndpoint(Protocol):
    def predict(self, rows: Rows) -> list[Any]:
        """Exactly one output per row, or raise ``EndpointError`` for the whole batch."""
        ...


class EndpointResolver(Protocol):
    def endpoint_for(self, model: str, version: str) -> ModelEndpoint: ...
