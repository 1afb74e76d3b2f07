"""One query's trip to its models: the prediction cache first (a cached output, else a claim: this query computes
the row and concurrent identical queries wait for it), then one message per model with the rows it must compute,
then the replies.

The round trips do not grow with the models: one cache lookup for every model's rows, one send for every model's
message (``RequestQueue.send_many``: a pipeline on Redis Streams, concurrent calls on SQS). Each call is bounded
by the query's remaining time.

Single flight: a row another query computes is awaited in the cache (``await_followers``). When the owner's model
fails on it, the owner leaves the cause in its claims (``PredictionCache.fail_many``), so its followers stop at
once with it; when the owner runs out of time (or its own dependencies fail), it ends its claims
(``PredictionCache.release``), and a follower with time left claims the row and computes it itself, as it does
when the owner's claim expired with the owner (its frontend died). Only a claim's owner ends it: a claim holds
its query's token.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from clipper.core.cache_keys import row_keys
from clipper.core.domain import Application, ModelVersion
from clipper.core.log_sampling import SampledLog
from clipper.core.messages import QueryMessage, Reply, encode_rows, no_answer
from clipper.core.polling import poll_gap
from clipper.core.validation import QueryInput, Rows
from clipper.errors import AccessDenied, NotFound, Unavailable
from clipper.frontend.results import UNCHARGED, ModelAnswer, QueryTicket
from clipper.frontend.steps import Steps, call
from clipper.frontend.steps import run as run_steps
from clipper.ports import ClaimStore, Clock, LookupOrSend, PredictionCache, ReplyChannel, RequestQueue

logger = logging.getLogger(__name__)

# Time kept back from the SLO for answering the client after the wait for replies ends.
ANSWER_MARGIN_S = 0.002
# How long a claim whose owner got no output holds its cause for the queries waiting on it.
FAILED_CLAIM_TTL_S = 0.25
# The shortest timeout a dependency call gets (a call with no time left still fails fast).
MIN_CALL_S = 0.001
# A query waiting on an identical query's computation computes the input itself when that query gave it up and
# this one has at least this share of its application's SLO left, and this long (less: the default). Identical
# queries of one application that arrive together end together: a follower with a few ms left would only send a
# message its batcher drops as expired, to a model that is already late.
TAKEOVER_SHARE = 0.25
TAKEOVER_MIN_S = 0.005
# Nor with less than the model's usual time to answer (send to reply, a moving average of this frontend's queries):
# on SQS a send alone takes 5-10 ms locally, and a follower sending with less left only ran into its own timeout.
ANSWER_TIME_WEIGHT = 0.1

UNSERVED = "registered without serving resources (deploy a model file)"


def _take(rows: Rows, index: list[int]) -> Rows:
    if len(index) == len(rows):
        return rows
    if isinstance(rows, np.ndarray):
        return rows[index]
    return [rows[i] for i in index]  # type: ignore[return-value]


@dataclass
class Fanout:
    """Where a query's rows went: per model, the cache keys of its rows, the rows it computes (claimed), the rows
    other queries compute, and the message sent."""

    answers: list[ModelAnswer]
    deadline: float
    keys: dict[str, list[str]] = field(default_factory=dict)
    owned: dict[str, list[int]] = field(default_factory=dict)
    waiting: dict[str, list[int]] = field(default_factory=dict)
    sent: dict[str, tuple[ModelAnswer, list[int]]] = field(default_factory=dict)
    reply_to: str | None = None
    cache_problem: str | None = None  # why the cache could not be read (it cost the time it took)
    owner: str = "1"  # the token this query's cache claims hold (its reply address: unique)
    query: QueryInput | None = None  # the input, as the models take it (a follower may have to send it)
    query_id: int = 0

    @property
    def followers(self) -> bool:
        """Whether some rows wait on other queries' computations."""
        return any(a.outputs[i] is None for a in self.answers for i in self.waiting.get(a.model.name, []))

    def stage(self) -> str:
        """What the query waits for once sent, as a late default names it: the replies of the models it sent
        to, and the answers that other queries are computing for its inputs (it sent nothing for those rows)."""
        parts = []
        if self.sent:
            parts.append("replies from " + ", ".join(f"model {m}:{a.model.version}" for m, (a, _) in self.sent.items()))
        followed = [a.model for a in self.answers if self.waiting.get(a.model.name)]
        if followed:
            models = ", ".join(f"model {m.name}:{m.version}" for m in followed)
            parts.append(f"the answers of {models} for inputs that other queries are computing")
        return "waiting for " + " and ".join(parts) if parts else "answering from the cache"


def queue_refused(failure: Exception) -> bool:
    """Whether a send failed on the version's own request queue, not on the transport: the queue does not exist
    (its stack deleted) or the frontend may not use it (outside its grants). The model's error, not a transport
    failure: no retry of the transport brings an answer."""
    return isinstance(failure, (NotFound, AccessDenied))


class Gatherer:
    def __init__(
        self,
        queue: RequestQueue,
        replies: ReplyChannel,
        clock: Clock,
        claims: ClaimStore | None,
        cache: PredictionCache | None,
        cache_poll_s: float,
        fused: LookupOrSend | None = None,
        log: SampledLog | None = None,
    ) -> None:
        """``fused``: the cache lookup and the sends of a single-input query in one call, where the cache and the
        queues are one standalone Redis (``clipper.adapters.redis_fused``). ``log``: where the lines every query
        would write in an outage go (at most one a second for each kind and application)."""
        self._log = log or SampledLog(logger, clock=clock.now)
        self._queue = queue
        self._replies = replies
        self._clock = clock
        self._claims = claims
        self._cache = cache
        self._cache_poll = cache_poll_s
        self._fused = fused if cache is not None else None
        # (model, version) -> its usual time from send to reply (a moving average)
        self._answer_s: dict[tuple[str, str], float] = {}

    @property
    def fused(self) -> bool:
        """Whether a single-input query's lookup and send are one call (a standalone Redis holds both)."""
        return self._fused is not None

    def _left(self, deadline: float) -> float:
        return max(MIN_CALL_S, deadline - self._clock.now())

    def observe(self, answer: ModelAnswer) -> None:
        """A version's reply to a message this frontend sent: its time from the send to the batch's end, as its
        batcher reports it (``queue_ms``, from the message's stamp, and ``inference_ms``), averaged. The model's
        own time: a query's wait ends with its slowest model's reply."""
        reported = answer.reply_timings
        if "queue_ms" in reported:
            self._average(answer.model, (reported["queue_ms"] + reported.get("inference_ms", 0.0)) / 1000)

    def observe_timeout(self, answer: ModelAnswer, now: float) -> None:
        """A version that did not reply to this query's message by its deadline: at least that long, averaged (a
        version slower than the SLO is not asked again by a follower with less time left)."""
        if answer.sent_at is not None:
            self._average(answer.model, now - answer.sent_at + answer.timings_ms.get("send", 0.0) / 1000)

    def _average(self, model: ModelVersion, took: float) -> None:
        key = (model.name, model.version)
        usual = self._answer_s.get(key)
        self._answer_s[key] = took if usual is None else usual + ANSWER_TIME_WEIGHT * (took - usual)

    def usual_answer_s(self, model: ModelVersion) -> float:
        """The version's usual time from send to reply (0 before its first)."""
        return self._answer_s.get((model.name, model.version), 0.0)

    # -- out: the cache, then the models ---------------------------------------------------------------------
    def send_steps(
        self,
        app: Application,
        models: list[ModelVersion],
        query: QueryInput,
        query_id: int,
        deadline: float,
        timings: dict[str, float],
        ticket: QueryTicket,
    ) -> Steps[Fanout]:
        """The cache lookup and the sends, as steps (``clipper.frontend.steps``: run on a thread or a loop)."""
        n = query.count
        answers = [ModelAnswer(m, [None] * n) for m in models]
        fan = Fanout(answers, deadline, owner=self._replies.new_address(), query=query, query_id=query_id)
        try:
            yield from self._send_steps(app, fan, query, query_id, timings, ticket)
        except BaseException:  # a failure no default covers (a 500) or the steps abandoned: nothing will wait
            if fan.reply_to is not None:
                self._replies.forget(fan.reply_to)
            raise
        return fan

    def _send_steps(
        self,
        app: Application,
        fan: Fanout,
        query: QueryInput,
        query_id: int,
        timings: dict[str, float],
        ticket: QueryTicket,
    ) -> Steps[None]:
        n = query.count
        if self._fused is not None and n == 1:
            yield from self._lookup_or_send(app, fan, query, query_id, timings, ticket)
            return
        t0 = self._clock.now()
        todo = {a.model.name: list(range(n)) for a in fan.answers}
        if self._cache is not None:
            ticket.stage = "reading the prediction cache"
            todo = yield from self._from_cache(fan, query.rows)
        t1 = self._clock.now()
        timings["cache"] = (t1 - t0) * 1000
        outgoing = [(a, todo[a.model.name]) for a in fan.answers if todo[a.model.name]]
        if outgoing:
            names = ", ".join(f"model {a.model.name}:{a.model.version}" for a, _ in outgoing)
            ticket.stage = f"sending to {names} (request queue)"
            yield from self._enqueue(app, fan, outgoing, query, query_id)
        timings["enqueue"] = (self._clock.now() - t1) * 1000

    def _lookup_or_send(
        self,
        app: Application,
        fan: Fanout,
        query: QueryInput,
        query_id: int,
        timings: dict[str, float],
        ticket: QueryTicket,
    ) -> Steps[None]:
        """One input: each model's cached output, or its message sent, or another query's computation awaited,
        in one call. Its time is the enqueue stage's (the cache stage is part of it)."""
        assert self._fused is not None
        t0 = self._clock.now()
        fan.reply_to = fan.owner
        self._replies.expect(fan.reply_to)
        requests: list[tuple[str, str, str]] = []
        sending: list[ModelAnswer] = []
        for a in fan.answers:
            if not a.model.queue_url:  # as _enqueue says it (the fused call's empty queue name was a 404)
                a.fail(f"model {a.model.name}:{a.model.version}: {UNSERVED}", "error")
                continue
            key = row_keys(a.model.name, a.model.cache_version, query.rows)
            fan.keys[a.model.name] = key
            try:
                body, a.sent_ms = self._message(app, a.model, query.rows, query_id, fan, key)
            except Unavailable as e:
                a.fail(f"model {a.model.name}:{a.model.version}: queue unavailable ({e})", "unavailable")
                continue
            requests.append((key[0], a.model.queue_url, body))
            sending.append(a)
        ticket.stage = "reading the prediction cache and sending to the request queues"
        left = self._left(fan.deadline)
        try:
            outcomes = yield call(self._fused, "lookup_or_send", requests, left, timeout=left, owner=fan.owner)
        except Unavailable as e:  # Redis down: every model's row is a default with this cause, never a 5xx
            for a in sending:
                a.fail(f"model {a.model.name}:{a.model.version}: queue unavailable ({e})", "unavailable")
            timings["cache"], timings["enqueue"] = 0.0, (self._clock.now() - t0) * 1000
            return
        t1 = self._clock.now()
        for a, (what, value) in zip(sending, outcomes, strict=True):
            name = a.model.name
            fan.owned[name], fan.waiting[name] = [], []
            if what == "hit":
                a.outputs[0] = value
                a.hits = 1
            elif what == "sent":
                fan.owned[name] = [0]
                fan.sent[name] = (a, [0])
                a.sent_at, a.timings_ms["send"] = t1, (t1 - t0) * 1000
            else:
                fan.waiting[name] = [0]
        timings["cache"], timings["enqueue"] = 0.0, (t1 - t0) * 1000

    def _from_cache(self, fan: Fanout, rows: Rows) -> Steps[dict[str, list[int]]]:
        """Fill cached outputs and claim the misses, for every model in one call; returns per model the rows this
        query computes (a claimed key's first row), and notes the rows other queries compute."""
        assert self._cache is not None
        for a in fan.answers:
            fan.keys[a.model.name] = row_keys(a.model.name, a.model.cache_version, rows)
        every = [k for a in fan.answers for k in fan.keys[a.model.name]]
        left = self._left(fan.deadline)
        try:
            hits, owned = yield call(self._cache, "lookup", every, left, timeout=left, owner=fan.owner)
        except Unavailable as e:
            self._log.warning("cache", "cache unavailable: %s", e)
            fan.cache_problem = str(e)
            return {a.model.name: list(range(len(rows))) for a in fan.answers}
        todo: dict[str, list[int]] = {}
        for a in fan.answers:
            name, first_row = a.model.name, dict[str, int]()
            todo[name], fan.waiting[name] = [], []
            for i, k in enumerate(fan.keys[name]):
                if k in hits:
                    a.outputs[i] = hits[k]
                    a.hits += 1
                elif k in owned and first_row.setdefault(k, i) == i:
                    todo[name].append(i)
                else:
                    fan.waiting[name].append(i)  # a concurrent query, or an identical row of this one, computes it
            fan.owned[name] = todo[name]
        return todo

    def _enqueue(
        self,
        app: Application,
        fan: Fanout,
        outgoing: list[tuple[ModelAnswer, list[int]]],
        query: QueryInput,
        query_id: int,
    ) -> Steps[None]:
        """One message per model, sent together; stamps each model's ``send`` time."""
        if fan.reply_to is None:
            fan.reply_to = fan.owner
        self._replies.expect(fan.reply_to)
        messages: list[tuple[ModelAnswer, list[int], str]] = []
        for a, rows in outgoing:
            m = a.model
            if not m.queue_url:
                a.fail(f"model {m.name}:{m.version}: {UNSERVED}", "error")
                continue
            try:
                known = fan.keys.get(m.name)
                keys = [known[i] for i in rows] if known is not None else None
                body, a.sent_ms = self._message(app, m, _take(query.rows, rows), query_id, fan, keys)
            except Unavailable as e:
                a.fail(f"model {m.name}:{m.version}: queue unavailable ({e})", "unavailable")
                continue
            messages.append((a, rows, body))
        if not messages:
            return
        t0 = self._clock.now()
        try:
            failures = yield call(
                self._queue,
                "send_many",
                [(a.model.queue_url, body) for a, _, body in messages],
                timeout=self._left(fan.deadline),
            )
        except Unavailable as e:
            failures = [e] * len(messages)
        t1 = self._clock.now()
        for (a, rows, _), failure in zip(messages, failures, strict=True):
            if failure is not None:
                if queue_refused(failure):  # the version's own queue is gone or not ours: it cannot be asked
                    a.fail(f"model {a.model.name}:{a.model.version}: its request queue refused it ({failure})", "error")
                else:
                    a.fail(f"model {a.model.name}:{a.model.version}: queue unavailable ({failure})", "unavailable")
                continue
            fan.sent[a.model.name] = (a, rows)
            a.sent_at, a.timings_ms["send"] = t1, (t1 - t0) * 1000

    def _message(
        self,
        app: Application,
        model: ModelVersion,
        rows: Rows,
        query_id: int,
        fan: Fanout,
        cache_keys: list[str] | None = None,
    ) -> tuple[str, int]:
        """The query message of ``rows`` for ``model`` (its rows through the claim-check store when too large for
        a queue message), and its ``sent_ms``. ``cache_keys``: the rows' cache keys, when this query computed them
        (the batcher fills the cache under them instead of hashing the rows again)."""
        assert fan.reply_to is not None
        payload, blob = encode_rows(rows)
        if blob is not None:
            if self._claims is None:
                raise Unavailable("input too large for a queue message and no claim-check store is set")
            key = f"claims/{fan.reply_to}-{model.name}"
            self._claims.put(key, blob)
            payload.s3_key = key
        sent_ms = int(self._clock.now() * 1000)
        body = QueryMessage.encode(
            query_id=query_id,
            app=app.name,
            model=model.name,
            version=model.version,
            input_type=app.input_type,
            rows=len(rows),
            payload=payload,
            deadline_ms=int(fan.deadline * 1000),
            sent_ms=sent_ms,
            reply_to=fan.reply_to,
            cache_keys=cache_keys,
        )
        return body, sent_ms

    # -- back: the replies, then the rows other queries compute -----------------------------------------------
    def wait_timeout(self, fan: Fanout) -> float:
        return fan.deadline - ANSWER_MARGIN_S - self._clock.now()

    def absorb(self, app: Application, fan: Fanout, replies: list[Reply] | Unavailable) -> Steps[None]:
        """Take in the replies (or the reply channel's failure), mark the models that gave no output, and release
        the claims of rows this query got no output for."""
        if isinstance(replies, Unavailable):
            for a, _ in fan.sent.values():
                a.fail(f"model {a.model.name}:{a.model.version}: reply channel unavailable ({replies})", "unavailable")
            replies = []
        for reply in replies:
            if reply.model not in fan.sent:
                continue
            a, rows = fan.sent[reply.model]
            a.reply_timings = dict(reply.timings)
            name = f"model {a.model.name}:{a.model.version}"
            if not reply.ok:
                kind = "timeout" if reply.error_kind == "expired" else "error"  # expired: dropped, late
                if reply.error_kind == "invalid":  # the batcher could not read the query's message
                    a.fail(f"{name}: invalid query message: {reply.error}", kind)
                else:
                    a.fail(f"{name}: {reply.error_kind or 'endpoint'} error: {reply.error}", kind)
            elif len(reply.outputs or []) != len(rows):
                a.fail(f"{name}: endpoint error: {len(reply.outputs or [])} outputs for {len(rows)} inputs", "error")
            else:
                self.observe(a)
                empty = 0
                for i, out in zip(rows, reply.outputs or [], strict=True):
                    if no_answer(out):  # null (NaN and infinities travel as null): the model's failure for the row
                        empty += 1
                    else:
                        a.outputs[i] = out
                if empty:
                    why = f"no answer for {empty} of {len(rows)} inputs (null or not a finite number)"
                    a.fail(f"{name}: {why}", "error")
        n = len(fan.answers[0].outputs) if fan.answers else 0
        for a in fan.answers:
            if a.problem is None and any(a.outputs[i] is None for i in fan.owned.get(a.model.name, range(n))):
                problem = (
                    f"model {a.model.name}:{a.model.version}: timeout, no reply within the SLO of "
                    f"{app.latency_slo_micros / 1000:g} ms"
                )
                if fan.cache_problem is not None:
                    problem += f" (the prediction cache did not answer first: {fan.cache_problem})"
                a.fail(problem, "timeout")
                if a.model.name in fan.sent:
                    self.observe_timeout(a, self._clock.now())
        if self._cache is not None:
            yield from self._settle_claims(fan)

    def _settle_claims(self, fan: Fanout) -> Steps[None]:
        """Rows this query claimed but got no output for: where the model failed on them, the claims hold the cause
        (followers take it); where time ran out or a dependency failed, the claims end (a follower with time left
        computes the row). Rows repeated within the query take their first occurrence's output."""
        failures: dict[str, str] = {}
        released: list[str] = []
        for a in fan.answers:
            keys, mine = fan.keys.get(a.model.name, []), fan.owned.get(a.model.name, [])
            if a.problem is not None:
                lost = [keys[i] for i in mine if a.outputs[i] is None]
                if a.failure == "error":
                    failures.update((k, a.problem) for k in lost)
                else:
                    released.extend(lost)
            by_key = {keys[i]: a.outputs[i] for i in mine if a.outputs[i] is not None}
            for i in fan.waiting.get(a.model.name, []):
                a.outputs[i] = by_key.get(keys[i], a.outputs[i])
        if failures or released:
            assert self._cache is not None
            left = fan.deadline - self._clock.now()
            try:
                if failures:
                    ttl, timeout = FAILED_CLAIM_TTL_S, self._left(fan.deadline)
                    yield call(self._cache, "fail_many", failures, ttl, timeout=timeout, owner=fan.owner)
                if released:
                    yield call(self._cache, "release", released, fan.owner, timeout=self._left(fan.deadline))
            except Unavailable as e:
                if left > 2 * ANSWER_MARGIN_S:
                    self._log.warning("claims", "failed claims not released: %s", e)
                else:  # a timed-out query's release, sent within its answer margin: under overload it is not
                    # confirmed in time, and a warning per late query would cost the frontend more of the core
                    logger.debug("failed claims released at the deadline, not confirmed: %s", e)

    def await_followers(self, app: Application, fan: Fanout, ticket: QueryTicket | None = None) -> None:
        """Rows a concurrent query computes: poll the cache (at ``clipper.core.polling``'s pace) until each is
        filled, its owner reports its model's failure on it (its cause becomes this row's), or the deadline. A row
        whose owner gave it up (its claim ended or expired) is claimed by this query and computed here while it has
        ``takeover_time(app)`` left and the model's usual time to answer. Each row ends on its own: a failure on one
        input (this query's own, or another owner's) does not end the wait for the others. Blocks (sleeps between
        polls, waits for the replies of what it sends). ``ticket``: the query's, whose stage names a takeover's
        send and wait (a late default says it)."""
        assert self._cache is not None
        by_name = {a.model.name: a for a in fan.answers}
        enough = takeover_time(app)
        begun = self._clock.now()
        # per model, the followed rows that ended without an output, and why: (cause, kind)
        ended: dict[str, dict[int, tuple[str, str]]] = {name: {} for name in fan.waiting}
        for name, rows in fan.waiting.items():  # a repeat of an input this query computed ends as that one did
            a, keys = by_name[name], fan.keys[name]
            mine = {keys[i] for i in fan.owned.get(name, ())}
            lost = (a.problem or f"model {a.model.name}:{a.model.version}: no output", a.failure or "error")
            ended[name].update((i, lost) for i in rows if a.outputs[i] is None and keys[i] in mine)

        def pending(name: str) -> list[int]:
            outputs, done = by_name[name].outputs, ended[name]
            return [i for i in fan.waiting[name] if outputs[i] is None and i not in done]

        while True:
            taken: list[tuple[ModelAnswer, list[int]]] = []
            for name in fan.waiting:
                rows = pending(name)
                if not rows:
                    continue
                a = by_name[name]
                keys = [fan.keys[name][i] for i in rows]
                owned: set[str] = set()
                take = fan.query is not None and self.wait_timeout(fan) >= max(enough, self.usual_answer_s(a.model))
                try:
                    if take:
                        left = self._left(fan.deadline)
                        hits, failed, owned = self._cache.poll_or_claim(keys, left, fan.owner, timeout=left)
                    else:
                        hits, failed = self._cache.poll(keys, timeout=self._left(fan.deadline))
                except Unavailable as e:
                    why = f"model {a.model.name}:{a.model.version}: prediction cache unavailable ({e})"
                    ended[name].update((i, (why, "unavailable")) for i in rows)
                    continue
                first: dict[str, int] = {}
                for i, k in zip(rows, keys, strict=True):
                    a.outputs[i] = hits.get(k, a.outputs[i])
                    if k in failed:
                        ended[name][i] = (failed[k], "followed")  # the owner query's failure, counted there
                    elif k in owned:
                        first.setdefault(k, i)
                if first:
                    taken.append((a, sorted(first.values())))
            if taken:
                self._take_over(app, fan, taken, ended, ticket)
            if not any(pending(name) for name in fan.waiting):
                break
            remaining = self.wait_timeout(fan)
            if remaining <= 0:
                if not taken:
                    break
                continue  # a takeover's wait may have run to the deadline: the other rows are read once more
            time.sleep(min(poll_gap(self._cache_poll, self._clock.now() - begun), remaining))
        for name in fan.waiting:
            self._end_rows(by_name[name], fan.waiting[name], ended[name])

    @staticmethod
    def _end_rows(a: ModelAnswer, rows: list[int], ended: dict[int, tuple[str, str]]) -> None:
        """The followed ``rows`` of ``a`` still without an output: each with its own cause (``ended``, else its
        owner's timeout). The model's failure is the first of them where it had none, or a takeover's own failure
        (charged to the model) where it had only the frontend's (not charged)."""
        timeout = (
            f"model {a.model.name}:{a.model.version}: timeout, the identical query computing this input gave no "
            "answer within the SLO",
            "followed",  # the owner query's timeout, counted there
        )
        causes = {i: ended.get(i, timeout) for i in rows if a.outputs[i] is None}
        if not causes:
            return
        charged = [c for c in causes.values() if c[1] not in UNCHARGED]  # a takeover's own: the model's failure
        if a.problem is not None and a.failure in UNCHARGED and charged:
            # the rows the frontend's own failure left without an output keep that cause (and are not charged)
            kept = {i: (a.problem, a.failure) for i, out in enumerate(a.outputs) if out is None and i not in causes}
            a.row_problems = {**(a.row_problems or {}), **kept}
            a.problem = None
        if a.problem is None:
            a.fail(*(charged or list(causes.values()))[0])
        if any(cause != (a.problem, a.failure) for cause in causes.values()):
            a.row_problems = {**(a.row_problems or {}), **causes}

    def _take_over(
        self,
        app: Application,
        fan: Fanout,
        taken: list[tuple[ModelAnswer, list[int]]],
        ended: dict[str, dict[int, tuple[str, str]]],
        ticket: QueryTicket | None,
    ) -> None:
        """Rows this query claimed after their owner gave them up: sent as this query's own (one message per
        model), their replies awaited, and taken in as ``absorb`` takes a query's (a failure is this query's own,
        and ends or marks the claims; the rows it left without an output go into ``ended``). Blocks."""
        assert fan.query is not None
        n = len(fan.answers[0].outputs)
        sub = Fanout([ModelAnswer(a.model, [None] * n) for a, _ in taken], fan.deadline, owner=fan.owner)
        sub.keys = {a.model.name: fan.keys[a.model.name] for a, _ in taken}
        sub.owned = {a.model.name: rows for a, rows in taken}
        sub.reply_to = self._replies.new_address()  # the query's own address may have had its wait already
        names = ", ".join(f"model {a.model.name}:{a.model.version}" for a, _ in taken)
        why = "for inputs whose computing query gave them up"
        if ticket is not None:
            ticket.stage = f"sending to {names} {why} (request queue)"
        try:
            outgoing = [(mine, rows) for mine, (_, rows) in zip(sub.answers, taken, strict=True)]
            run_steps(self._enqueue(app, sub, outgoing, fan.query, fan.query_id))
            replies: list[Reply] | Unavailable = []
            if sub.sent:
                if ticket is not None:
                    ticket.stage = f"waiting for replies from {names}, sent {why}"
                try:
                    replies = self._replies.wait(sub.reply_to, list(sub.sent), self.wait_timeout(fan))
                except Unavailable as e:
                    replies = e
            else:
                self._replies.forget(sub.reply_to)
            run_steps(self.absorb(app, sub, replies))
        except BaseException:
            self._replies.forget(sub.reply_to)
            raise
        now = self._clock.now()
        for (a, rows), mine in zip(taken, sub.answers, strict=True):
            name, keys = a.model.name, fan.keys[a.model.name]
            by_key = {keys[i]: mine.outputs[i] for i in rows if mine.outputs[i] is not None}
            lost = {keys[i] for i in rows if mine.outputs[i] is None}
            for i in fan.waiting[name]:  # the rows taken, and the same inputs repeated in the query
                if a.outputs[i] is None:
                    a.outputs[i] = by_key.get(keys[i])
                    if keys[i] in lost and mine.problem is not None:  # its own send: the model's failure here
                        ended[name][i] = (mine.problem, mine.failure or "error")
            if name in sub.sent:
                split_model_time(mine, now)
                a.timings_ms.update(mine.timings_ms)


def takeover_time(app: Application) -> float:
    """How long a follower of ``app`` must have left to compute an input whose owner gave it up."""
    return max(TAKEOVER_MIN_S, TAKEOVER_SHARE * app.slo_seconds)


def split_model_time(answer: ModelAnswer, replied_at: float) -> None:
    """A model's time from the end of its send to the frontend holding the replies, cut by what its batcher
    reported: ``queue_ms`` (sent_ms to the batch's start: the send, the queue, the receive and the batch wait),
    ``batch_wait_ms`` when the batcher reports it apart, ``inference_ms``, ``batch_size``."""
    reported = answer.reply_timings
    t = answer.timings_ms
    if "queue_ms" not in reported or answer.sent_at is None or answer.sent_ms is None:
        return
    batch_wait = reported.get("batch_wait_ms")
    # queue_ms runs from the message's sent_ms (whole ms, stamped before the send): take off up to the send's end
    queue = reported["queue_ms"] - (answer.sent_at * 1000 - answer.sent_ms) - (batch_wait or 0.0)
    t["queue"] = max(0.0, queue)
    if batch_wait is not None:
        t["batch_wait"] = batch_wait
    inference = reported.get("inference_ms", 0.0)
    t["inference"] = inference
    if "batch_size" in reported:
        t["batch_size"] = reported["batch_size"]
    elapsed = (replied_at - answer.sent_at) * 1000
    t["reply"] = max(0.0, elapsed - t["queue"] - (batch_wait or 0.0) - inference)


__all__ = ["ANSWER_MARGIN_S", "FAILED_CLAIM_TTL_S", "Fanout", "Gatherer", "split_model_time", "takeover_time"]
