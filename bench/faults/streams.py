"""Faults on the demo MLP's request stream (Redis Streams: ``clipper.adapters.redis_streams``) and what became of
the messages they touched: a batcher killed while it holds a batch, copies of messages (an at-least-once
queue's duplicates), malformed messages (poison).

A batcher's consumer in the stream's group is named ``<host>:<pid>:<token>``, so the entries a killed batcher
had read and not acknowledged are its consumer's pending entries. They come back after the visibility timeout
(the batcher's ``--visibility-timeout-s``, 180 s in the local stack), are read again and acknowledged (dropped
as expired: their queries got their default long before). ``redelivery`` checks that, at the end of the run.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from bench.faults.load import Load
from bench.faults.plan import Plan
from bench.faults.world import World

MLP_QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/clipper-model-mlp"  # the demo MLP's (moto's URL)
BATCHER = "batcher-mlp"


def _keys() -> Any:
    from clipper.adapters.redis_streams import stream_keys

    return stream_keys(MLP_QUEUE)


def _group() -> str:
    from clipper.adapters.redis_streams import GROUP

    return GROUP


def _visibility_s() -> float:
    from clipper.adapters.redis_streams import VISIBILITY_TIMEOUT_S  # the batcher's default; the stack sets none

    return VISIBILITY_TIMEOUT_S


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _of_pid(consumer: Any, pid: int) -> bool:
    parts = _text(consumer).rsplit(":", 2)
    return len(parts) == 3 and parts[1] == str(pid)


def pending_of(r: Any, key: str, pid: int) -> list[str]:
    """The entries the consumers of process ``pid`` read and did not acknowledge."""
    ids: list[str] = []
    for c in r.xpending(key, _group())["consumers"]:
        if _of_pid(c["name"], pid):
            ids += [_text(p["message_id"]) for p in r.xpending_range(key, _group(), "-", "+", 10_000, c["name"])]
    return ids


def batcher_killed_mid_batch(world: World, load: Load, plan: Plan) -> dict[str, Any]:
    """SIGKILL to the MLP's batcher at a moment its consumer holds messages it read and has not acknowledged (a
    batch on its way through the model), then the supervisor restarts it."""
    r, key = world.redis(), _keys().stream
    before = world.processes()[BATCHER]
    pid = before["pid"]
    give_up = time.monotonic() + 10.0
    while time.monotonic() < give_up:
        summary = r.xpending(key, _group())
        if any(_of_pid(c["name"], pid) and c["pending"] > 0 for c in summary["consumers"]):
            break
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    start, killed_at = load.now(), time.time()
    in_flight = pending_of(r, key, pid)  # the process is gone: nothing more is read or acknowledged
    took = world.wait_restarted(BATCHER, before)
    return {
        "fault_start": start,
        "fault_end": load.now(),
        "restarted_after_s": round(took, 2),
        "in_flight_at_kill": len(in_flight),
        "redelivery": held(_keys(), in_flight, killed_at, _visibility_s()),
        "checks": {"the kill came while the batcher held messages": bool(in_flight)},
    }


def held(keys: Any, ids: list[str], killed_at: float, visibility_s: float) -> dict[str, Any]:
    """What ``redelivery`` follows: the entries a batcher held when it was killed (epoch s), on which stream."""
    return {
        "ids": ids,
        "killed_at": killed_at,
        "stream": keys.stream,
        "dead_letter": keys.dead_letter,
        "visibility_s": visibility_s,
    }


def redelivery(r: Any, pending: dict[str, Any], max_wait_s: float, grace_s: float = 10.0) -> dict[str, Any]:
    """What became of the entries a killed batcher held (``held``): acknowledged after their redelivery (gone from
    the stream and its pending list), dead-lettered, or still pending. Waits for the visibility timeout and
    ``grace_s`` to pass (at most ``max_wait_s``); when it cannot, says so instead of judging."""
    ids: list[str] = pending["ids"]
    due = pending["killed_at"] + pending["visibility_s"] + grace_s  # a receive comes within the batcher's poll
    if due - time.time() > max_wait_s:
        return {"checked": False, "why": f"the visibility timeout ({pending['visibility_s']:g} s) outlasts this run"}
    while True:
        left = _still_held(r, pending["stream"], ids)
        if not left or time.time() >= due:
            break
        time.sleep(min(1.0, grace_s / 10))
    dead = {_text(f.get(b"source_id", b"")) for _, f in r.xrange(pending["dead_letter"], "-", "+")}
    left = [i for i in left if i not in dead]
    return {
        "checked": True,
        "after_s": round(time.time() - pending["killed_at"], 1),
        "acknowledged": len(ids) - len(left) - len(dead & set(ids)),
        "dead_lettered": len(dead & set(ids)),
        "still_pending": len(left),
    }


def _still_held(r: Any, key: str, ids: list[str]) -> list[str]:
    """The ids still in the stream (a deleted entry was acknowledged: the batcher deletes what it answers)."""
    pipe = r.pipeline(transaction=False)
    for i in ids:
        pipe.xrange(key, i, i)
    return [i for i, got in zip(ids, pipe.execute(), strict=True) if got]


def duplicate_delivery(world: World, load: Load, plan: Plan) -> dict[str, Any]:
    """Through the fault window, each message seen on the MLP's stream (it is there from the frontend's send until
    the batcher acknowledges it) is added again, the same body: what an at-least-once queue does. Afterwards no
    copy may be left in the stream or dead-lettered (the batcher drops or answers it)."""
    r, keys = world.redis(), _keys()
    dead_before = r.xlen(keys.dead_letter)
    start, copies, seen = load.now(), [], set()
    end = time.monotonic() + plan.fault_s
    while time.monotonic() < end:
        for entry_id, fields in r.xrevrange(keys.stream, count=5):
            if entry_id not in seen and b"body" in fields:
                seen.add(entry_id)
                copy = r.xadd(keys.stream, fields)
                seen.add(copy)  # a copy is not copied again
                copies.append(_text(copy))
        time.sleep(0.001)
    fault_end = load.now()
    time.sleep(2.0)
    left, dead = _still_held(r, keys.stream, copies), r.xlen(keys.dead_letter) - dead_before
    return {
        "fault_start": start,
        "fault_end": fault_end,
        "duplicates_added": len(copies),
        "duplicates_left_after_2s": len(left),
        "dead_lettered": dead,
        "checks": {"every copy consumed": not left, "no copy dead-lettered": dead == 0},
    }


def poison_message(world: World, load: Load, plan: Plan) -> dict[str, Any]:
    """Malformed messages on the MLP's stream: they must go to its dead-letter stream (after their deliveries:
    the batcher releases each with a back-off) while the batcher answers the rest, not block it."""
    r, keys = world.redis(), _keys()
    before = r.xlen(keys.dead_letter)
    start = load.now()
    poison = ("not json", '{"v": 1}', '{"v": 1, "query_id": "x", "rows": -1}', "\x00\xff")
    for body in poison:
        r.xadd(keys.stream, {"body": body})
    time.sleep(plan.fault_s)
    fault_end = load.now()
    waited = time.monotonic()
    while r.xlen(keys.dead_letter) - before < len(poison) and time.monotonic() - waited < 60:
        time.sleep(0.2)
    dead = r.xlen(keys.dead_letter) - before
    return {
        "fault_start": start,
        "fault_end": fault_end,
        "poison_sent": len(poison),
        "dead_lettered": dead,
        "dead_lettered_within_s": round(load.now() - start, 1),
        "checks": {"every poison message dead-lettered": dead == len(poison)},
    }
