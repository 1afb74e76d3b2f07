"""Request queues on Redis Streams: the local stack's transport, with SQS's semantics behind the same ports
(``RequestQueue``, ``QueueReader``). SQS stays the transport on AWS.

A model version's queue address stays its SQS queue URL; this transport names its keys after the queue name
(the URL's last path segment), all under one hash tag so a queue's keys share a cluster slot:

    clipper:queue:{<name>}           the stream (field ``body``); its consumer group ``batchers``
    clipper:queue:{<name>}:delayed   released messages (sorted set: entry id -> epoch ms visible again)
    clipper:queue:{<name>}:dlq       dead letters (fields body, source_id, receive_count)

``send`` is one ``XADD`` (trimming entries older than the retention, like SQS's retention period). The
receive script (``clipper.adapters.redis_streams_lua.RECEIVE``) takes messages visible again after the
visibility timeout, released messages that are due, then new ones; a message delivered ``max_receive_count``
times is dead-lettered instead of delivered again. When nothing is ready and the caller waits, a blocking
``XREADGROUP`` follows (the second round trip), in slices that end when a pending message can be visible
again. The script's scan is needed only when something can have become visible again, so a reader runs it
when the last scan said so (its hint) and at least every ``rescan_s``; between scans a receive is the one
blocking ``XREADGROUP`` for new messages (a busy queue pays one round trip per receive, not two, and no
script). A release at once (a stopping batcher handing its messages back) also adds a wake-up entry (field
``wake``) that a blocked reader takes, drops and answers with a scan, so another replica has those messages
within a round trip, not at its next scan. Delete acknowledges and removes the entries in one ``MULTI``, so the
stream holds only unanswered messages. A receipt handle is ``<entry id>:<delivery count>``: a release by a reader
whose delivery is no longer the current one changes nothing (the current holder keeps the message); a delete by any
holder deletes it (it was answered), and deleting twice is harmless. ``receive_and_delete`` sends a batch's
deletes in the same round trip as the next receive (a batcher that receives on its own thread acknowledges
without a call of its own); a first delivery's ``sent_ms`` is its entry id's time (the server's clock, the
middle of that millisecond).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clipper.adapters.redis_streams_lua import DEPTH, RECEIVE, RELEASE
from clipper.adapters.resp import RespClient, RespError
from clipper.errors import NotFound, Unavailable
from clipper.ports import ReceivedMessage

# The model stack's defaults (infra/model-stack.yaml): VisibilityTimeoutSeconds, MessageRetentionSeconds; and
# MaxReceiveCount's before it became 5 for a Lambda event source (whose throttled receives count as deliveries:
# no reader of these streams is throttled so).
VISIBILITY_TIMEOUT_S = 180.0
MAX_RECEIVE_COUNT = 3
RETENTION_S = 3600.0
GROUP = "batchers"
MAX_WAIT_S = 20.0  # SQS's longest long poll; under the Redis client's socket timeout
DEAD_LETTER_MAX_LEN = 100_000
RESCAN_S = 1.0  # the longest a reader goes without the receive script's scan (capped at half the visibility timeout)

logger = logging.getLogger(__name__)

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,80}")


@dataclass(frozen=True)
class StreamKeys:
    stream: str
    delayed: str
    dead_letter: str

    @property
    def all(self) -> list[str]:
        return [self.stream, self.delayed, self.dead_letter]


@dataclass(frozen=True)
class QueueDepth:
    ready: int  # undelivered, or visible again (visibility timeout over, or released and due)
    in_flight: int  # received and neither deleted nor visible again yet
    delayed: int  # released with a delay that has not passed yet
    dead_lettered: int


def queue_name(queue_url: str) -> str:
    """The queue's name: the last path segment of its SQS URL (a bare name is its own name)."""
    name = queue_url.rsplit("/", 1)[-1]
    if not _QUEUE_NAME.fullmatch(name):
        raise NotFound("queue", queue_url)
    return name


def stream_keys(queue_url: str, prefix: str = "clipper") -> StreamKeys:
    base = f"{prefix}:queue:{{{queue_name(queue_url)}}}"
    return StreamKeys(base, f"{base}:delayed", f"{base}:dlq")


def receipt_handle(entry_id: str, count: int) -> str:
    return f"{entry_id}:{count}"


def parse_receipt_handle(handle: str) -> tuple[str, int]:
    entry_id, sep, count = handle.rpartition(":")
    if not sep or not entry_id or not count.isdigit():
        raise ValueError(f"not a Redis Streams receipt handle: {handle!r}")
    return entry_id, int(count)


def sent_ms(entry_id: str) -> float:
    """When an entry entered its stream, in epoch ms: its id's time (whole ms of the server's clock), plus half a
    millisecond, the middle of the ms it names."""
    return int(entry_id.split("-", 1)[0]) + 0.5


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _one(client: RespClient, command: tuple[Any, ...], timeout: float | None = None) -> Any:
    (reply,) = client.execute([command], timeout)
    if isinstance(reply, RespError):
        raise Unavailable(f"redis queue: {reply}")
    return reply


class RedisStreamRequestQueue:
    """The frontend's side: one ``XADD`` per message."""

    def __init__(self, client: RespClient, prefix: str = "clipper", retention_s: float | None = RETENTION_S) -> None:
        self._client = client
        self._prefix = prefix
        self._retention_ms = None if retention_s is None else int(retention_s * 1000)
        self._keys: dict[str, str] = {}

    @property
    def client(self) -> RespClient:
        return self._client

    def stream_key(self, queue_url: str) -> str:
        key = self._keys.get(queue_url)
        if key is None:
            key = self._keys[queue_url] = stream_keys(queue_url, self._prefix).stream
        return key

    def minid(self) -> int | None:
        """The oldest entry id a send keeps (the retention), or None when messages are kept until answered."""
        return None if self._retention_ms is None else int(time.time() * 1000) - self._retention_ms

    def _xadd(self, queue_url: str, body: str) -> tuple[Any, ...]:
        key, minid = self.stream_key(queue_url), self.minid()
        if minid is None:
            return ("XADD", key, "*", "body", body)
        return ("XADD", key, "MINID", "~", minid, "*", "body", body)

    def send(self, queue_url: str, body: str, timeout: float | None = None) -> None:
        _one(self._client, self._xadd(queue_url, body), timeout)

    def send_many(self, messages: Sequence[tuple[str, str]], timeout: float | None = None) -> list[Exception | None]:
        """Every message in one pipeline (an ensemble's fan-out is one round trip)."""
        replies = self._client.execute([self._xadd(url, body) for url, body in messages], timeout)
        return [Unavailable(f"redis queue: {r}") if isinstance(r, RespError) else None for r in replies]

    async def send_many_async(
        self, messages: Sequence[tuple[str, str]], timeout: float | None = None
    ) -> list[Exception | None]:
        replies = await self._client.aio.execute([self._xadd(url, body) for url, body in messages], timeout)
        return [Unavailable(f"redis queue: {r}") if isinstance(r, RespError) else None for r in replies]


class RedisStreamQueueReader:
    """One queue as a long-poll driver consumes it: a consumer of the queue's group.

    ``visibility_timeout_s`` and ``max_receive_count`` play the SQS queue attributes' part (every reader of a
    queue should use the same values): a message received and neither deleted nor released within the
    visibility timeout is visible again; one delivered ``max_receive_count`` times goes to the dead-letter
    stream instead of a next delivery."""

    def __init__(
        self,
        client: RespClient,
        queue_url: str,
        visibility_timeout_s: float = VISIBILITY_TIMEOUT_S,
        max_receive_count: int = MAX_RECEIVE_COUNT,
        consumer: str | None = None,
        prefix: str = "clipper",
        dead_letter_max_len: int = DEAD_LETTER_MAX_LEN,
    ) -> None:
        if visibility_timeout_s <= 0 or max_receive_count < 1:
            raise ValueError("visibility_timeout_s must be > 0 and max_receive_count >= 1")
        self._client = client
        self.queue_url = queue_url
        self.keys = stream_keys(queue_url, prefix)
        self._visibility_ms = max(1, int(visibility_timeout_s * 1000))
        self._max_receive = max_receive_count
        self._dead_letter_max_len = dead_letter_max_len
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._receive = client.script(RECEIVE)
        self._release = client.script(RELEASE)
        self._depth = client.script(DEPTH)
        self._rescan_s = min(RESCAN_S, visibility_timeout_s / 2)
        self._scan_at = 0.0  # monotonic time from which the next receive runs the script (0: at once)
        self._carried: list[str] = []  # entry ids to delete with the next command sent (``receive_and_delete``)
        self.delete_errors = 0  # deletes carried by a receive that the server refused

    def receive_and_delete(self, receipt_handles: list[str], max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        """Delete the messages (``delete``) in the same round trip as the receive's first command, then receive
        (``receive``). A delete the server refuses is logged and counted in ``delete_errors``; the messages
        received are returned all the same. Raises when the call fails as a whole (then whether the deletes
        were done is not known: deleting twice is harmless)."""
        self._carried = [parse_receipt_handle(h)[0] for h in receipt_handles]
        try:
            return self.receive(max_messages, wait_s)
        finally:
            self._carried = []

    def _execute(self, commands: list[tuple[Any, ...]], timeout: float | None = None) -> list[Any]:
        """``commands`` in one round trip, after the deletes a ``receive_and_delete`` carries (the first command
        of the receive takes them)."""
        ids, self._carried = self._carried, []
        if not ids:
            return self._client.execute(commands, timeout)
        head = self._delete_commands(ids)
        replies = self._client.execute([*head, *commands], timeout)
        refused = _refused(replies[: len(head)])
        if refused is not None:
            self.delete_errors += 1
            logger.warning(
                "%d deletes refused (their messages come back after the visibility timeout): %s", len(ids), refused
            )
        return replies[len(head) :]

    def _delete_commands(self, ids: list[str]) -> list[tuple[Any, ...]]:
        return [
            ("MULTI",),
            ("XACK", self.keys.stream, GROUP, *ids),
            ("XDEL", self.keys.stream, *ids),
            ("ZREM", self.keys.delayed, *ids),
            ("EXEC",),
        ]

    def receive(self, max_messages: int, wait_s: float) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages; when none is ready, waits up to ``wait_s`` (at most 20 s) and
        returns as soon as one is."""
        count = max(1, max_messages)
        deadline = time.monotonic() + max(0.0, min(MAX_WAIT_S, wait_s))
        while True:
            now = time.monotonic()
            remaining_ms = int((deadline - now) * 1000)
            scanned = now >= self._scan_at
            if scanned:
                got = self._receive_ready(count, hint=remaining_ms > 0)
                if isinstance(got, list):
                    # A full receive may have left more visible again: scan again next time.
                    self._scan_at = 0.0 if len(got) >= count else now + self._rescan_s
                    return got
                # until the hint (ms until a pending message can be visible again; -1: none pending), at most rescan_s
                self._scan_at = now + (self._rescan_s if got < 0 else min(got / 1000, self._rescan_s))
            if remaining_ms <= 0:
                return [] if scanned else self._read_new(count, None) or []  # a short poll: new ones only
            block_ms = max(1, min(remaining_ms, int((self._scan_at - time.monotonic()) * 1000)))
            new = self._read_new(count, block_ms)
            if new is None:
                return []  # the group is gone (Redis lost it): the next receive's script recreates it
            if new:
                return new

    def _receive_ready(self, count: int, hint: bool) -> list[ReceivedMessage] | int:
        """The messages ready now (one script call), or when there are none, the ms until a pending one can be
        visible again (-1: none pending; 0 when no hint was asked for)."""
        args: list[str | int] = [
            GROUP,
            self.consumer,
            count,
            self._visibility_ms,
            self._max_receive,
            self._dead_letter_max_len,
        ]
        (out,) = self._execute([self._receive.command(self.keys.all, [*args, "1" if hint else "0"])])
        if isinstance(out, RespError):
            raise Unavailable(f"redis queue: {out}")
        if len(out) == 2:
            return int(out[0])
        received_ms = time.time() * 1000
        got: list[ReceivedMessage] = []
        for i in range(2, len(out), 3):
            entry_id, body, deliveries = _text(out[i]), _text(out[i + 1]), int(out[i + 2])
            handle, sent = receipt_handle(entry_id, deliveries), sent_ms(entry_id) if deliveries == 1 else None
            got.append(ReceivedMessage(entry_id, handle, body, deliveries, received_ms, sent))
        return got

    def _read_new(self, count: int, block_ms: int | None) -> list[ReceivedMessage] | None:
        """New messages within ``block_ms`` (None: those there now); None when the server refuses the read (its
        group was destroyed, or Redis restarted without it)."""
        command: tuple[Any, ...] = ("XREADGROUP", "GROUP", GROUP, self.consumer, "COUNT", count)
        if block_ms is not None:
            command = (*command, "BLOCK", block_ms)
        wait_s = 0.0 if block_ms is None else block_ms / 1000
        (resp,) = self._execute([(*command, "STREAMS", self.keys.stream, ">")], wait_s + 2.0)
        if isinstance(resp, RespError):
            self._scan_at = 0.0  # the next receive's script recreates the group
            return None
        received_ms = time.time() * 1000
        out: list[ReceivedMessage] = []
        wakes: list[str] = []
        for _key, entries in resp or []:  # [[key, [[id, [field, value, ...]], ...]]]
            for entry_id, fields in entries:
                mid = _text(entry_id)
                values = dict(zip(fields[::2], fields[1::2], strict=True)) if fields else {}
                if b"wake" in values:  # a message handed back at once (RELEASE): scan for it now
                    wakes.append(mid)
                    continue
                body = _text(values.get(b"body", b""))
                out.append(ReceivedMessage(mid, receipt_handle(mid, 1), body, 1, received_ms, sent_ms(mid)))
        if wakes:
            self._scan_at = 0.0
            # not deleted: the next scan takes them (and drops them); the messages read still come back now
            with contextlib.suppress(Unavailable):
                self.delete([receipt_handle(w, 1) for w in wakes])
        return out

    def delete(self, receipt_handles: list[str]) -> None:
        """Acknowledge and remove the messages (one ``MULTI``): nothing redelivers them and the stream keeps
        only unanswered messages. A handle of a message already deleted changes nothing."""
        if not receipt_handles:
            return
        ids = [parse_receipt_handle(h)[0] for h in receipt_handles]
        refused = _refused(self._client.execute(self._delete_commands(ids)))
        if refused is not None:
            raise Unavailable(f"redis queue: {refused}")

    def release(self, receipt_handle: str, delay_s: int) -> None:
        """Make a received message visible again after ``delay_s`` seconds (0: at once), its delivery count
        kept. A stale handle (the message was deleted, or delivered again since) changes nothing."""
        entry_id, count = parse_receipt_handle(receipt_handle)
        _one(
            self._client,
            self._release.command(
                self.keys.all[:2], [GROUP, entry_id, count, max(0, int(delay_s * 1000)), "1" if delay_s <= 0 else "0"]
            ),
        )
        self._scan_at = min(self._scan_at, time.monotonic() + max(0, delay_s))  # this reader sees it when due

    def depth(self) -> QueueDepth:
        """The queue's depth as an operator sees it (see ``queue_depth``)."""
        ready, in_flight, delayed, dead = _one(
            self._client, self._depth.command(self.keys.all, [GROUP, self._visibility_ms])
        )
        return QueueDepth(int(ready), int(in_flight), int(delayed), int(dead))


def _refused(replies: list[Any]) -> RespError | None:
    """The first error among a delete transaction's replies (an error inside it, a key of the wrong type, comes
    in EXEC's array, not as a reply of its own)."""
    inside = replies[-1] if replies and isinstance(replies[-1], list) else []
    return next((r for r in [*replies, *inside] if isinstance(r, RespError)), None)


def queue_depth(
    client: RespClient, queue_url: str, visibility_timeout_s: float = VISIBILITY_TIMEOUT_S, prefix: str = "clipper"
) -> QueueDepth:
    """How many messages of a queue are ready, in flight, delayed and dead-lettered (one atomic script; the
    visibility timeout is the readers')."""
    reader = RedisStreamQueueReader(client, queue_url, visibility_timeout_s, consumer="depth", prefix=prefix)
    return reader.depth()
