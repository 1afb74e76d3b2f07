"""The query path's core: validate, select, look up the cache, enqueue the misses, wait for replies
until the deadline, answer.

It never raises for a model failure: a model that fails, is slow or cannot be reached yields the
application's default output with an explanation. It raises ``NotFound`` for an unknown application and
``InvalidInput`` for bad input, before anything is sent to a model.

Every query is timed stage by stage (``QueryResult.timings_ms``: validate, select, cache, enqueue, wait,
combine, record) and model by model (``QueryResult.model_timings_ms``: per model, ``send`` its SendMessage,
``queue`` from the end of the send to the start of its batch less the batch wait, ``batch_wait`` when the
batcher reports it, ``inference`` the endpoint call, ``batch_size``, and ``reply`` from the end of the
inference to the frontend holding every reply: the reply's publication and pick-up, and for an ensemble the
wait for the slower models' replies too).
"""

from __future__ import annotations

import copy
import functools
import logging
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import orjson

from clipper.core.cache_keys import record_keys, row_keys
from clipper.core.domain import Application, ModelVersion
from clipper.core.messages import QueryMessage, encode_rows, output_value
from clipper.core.validation import DEFAULT_MAX_BATCH, QueryInput, Rows, validate_query
from clipper.errors import ClipperError, InvalidInput, Unavailable
from clipper.frontend.results import ModelAnswer, Prediction, QueryResult, QueryTicket
from clipper.frontend.selection import Choice, Selector
from clipper.ports import ClaimStore, Clock, PredictionCache, Registry, ReplyChannel, RequestQueue
from clipper.selection import resolve

logger = logging.getLogger(__name__)

# Time kept back from the SLO for answering the client after the wait for replies ends.
ANSWER_MARGIN_S = 0.002
# How long a claim whose owner got no output holds its cause for the queries waiting on it.
FAILED_CLAIM_TTL_S = 0.25


class QueryListener(Protocol):
    """Told when a query gets its id and when its models are chosen (logs' correlation id, trace annotations)."""

    def started(self, app: str, query_id: int) -> None: ...

    def selected(self, app: str, models: list[ModelVersion]) -> None: ...


def user_id(body: Any) -> str | None:
    """Clipper's optional ``uid``: an integer or a non-empty string; per-user selection keys on it."""
    uid = body.get("uid") if isinstance(body, dict) else None
    if uid is None:
        return None
    if isinstance(uid, bool) or not isinstance(uid, int | str) or uid == "":
        raise InvalidInput("uid", "an integer or a non-empty string", type(uid).__name__)
    return str(uid)


def _take(rows: Rows, index: list[int]) -> Rows:
    if isinstance(rows, np.ndarray):
        return rows[index]
    return [rows[i] for i in index]  # type: ignore[return-value]


class QueryProcessor:
    def __init__(
        self,
        registry: Registry,
        queue: RequestQueue,
        replies: ReplyChannel,
        clock: Clock,
        new_query_id: Callable[[], int],
        claims: ClaimStore | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        cache: PredictionCache | None = None,
        cache_poll_s: float = 0.002,
        selector: Selector | None = None,
        listener: QueryListener | None = None,
    ) -> None:
        self._registry = registry
        self._queue = queue
        self._replies = replies
        self._clock = clock
        self._new_id = new_query_id
        self._claims = claims
        self._max_batch = max_batch
        self._cache = cache
        self._cache_poll = cache_poll_s
        self._selector = selector or Selector(registry, None, clock, random.Random(), 0.0)
        self._listener = listener

    @property
    def registry(self) -> Registry:
        return self._registry

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def selector(self) -> Selector:
        return self._selector

    def after_restore(self) -> None:
        """After a SnapStart restore: the selector's RNG is re-seeded (every container restored from one
        snapshot would otherwise draw the same models), the cached registry and bandit states dropped (the
        snapshot may be days old) and the reply channel's inbox renewed (every restored container would share
        the snapshot's)."""
        self._selector.after_restore()
        for part in (self._registry, self._replies):
            reset = getattr(part, "invalidate", None) or getattr(part, "reset", None)
            if reset is not None:
                reset()

    def admit(self, app_name: str, body: Any, ticket: QueryTicket) -> None:
        """Start the query without waiting for anything (on the caller's thread): when the application is in the
        registry copy, validate the body and fill ``ticket`` (ids, deadline), so a watchdog knows the deadline
        even before a worker takes the query up. Raises ``NotFound`` / ``InvalidInput`` like ``predict``."""
        nowait = getattr(self._registry, "get_app_nowait", None)
        app = nowait(app_name) if nowait is not None else None
        if app is not None:
            self._begin(app, body, ticket, self._clock.now())

    def _begin(self, app: Application, body: Any, ticket: QueryTicket, start: float) -> None:
        query = validate_query(app, body, self._max_batch)
        user = user_id(body)
        first_id = self._new_id()
        ticket.begin(app, [first_id + i for i in range(query.count)], query.batch, start + app.slo_seconds)
        ticket.query, ticket.user, ticket.started = query, user, start
        ticket.validate_ms = (self._clock.now() - start) * 1000
        if self._listener is not None:
            self._listener.started(app.name, first_id)

    def predict(self, app_name: str, body: Any, ticket: QueryTicket | None = None) -> QueryResult:
        """Answer one request. ``ticket`` (the caller's) is filled in as the query goes, so a watchdog that
        gives up on it at its deadline (``late``) can still answer with the default and say what held it up."""
        ticket = ticket if ticket is not None else QueryTicket()
        taken = self._clock.now()
        timings: dict[str, float] = {}
        if ticket.query is None:
            self._begin(self._registry.get_app(app_name), body, ticket, taken)
        else:  # admitted on the caller's thread: how long it waited for this worker thread
            timings["worker"] = (taken - ticket.started) * 1000 - ticket.validate_ms
        assert ticket.app is not None and ticket.query is not None and ticket.deadline is not None
        if ticket.abandoned:  # answered by the watchdog while it waited for a worker: nothing to do
            return self.late(ticket)
        app, query, user, deadline, ids = ticket.app, ticket.query, ticket.user, ticket.deadline, ticket.ids
        first_id = ids[0]
        timings["validate"] = ticket.validate_ms
        start = self._clock.now()

        def fallback(why: str) -> QueryResult:
            logger.info("default output", extra={"app": app.name, "query_id": first_id, "reason": why})
            return QueryResult(
                [Prediction(i, self.default_of(app), True, why) for i in ids], query.batch, timings_ms=timings
            )

        try:
            ticket.stage = "reading the bandit state"
            choice = self._selector.choose(app, user)
        except ClipperError as e:
            return fallback(f"no model to serve the query: {e}")
        if choice is None:
            return fallback(f"no model is linked to application '{app.name}'")
        timings["select"] = (self._clock.now() - start) * 1000
        if self._listener is not None:
            self._listener.selected(app.name, choice.models)
        answers = self._gather(app, choice.models, query, first_id, deadline, timings, ticket)
        t0 = self._clock.now()
        preds = [self._combine(app, choice, answers, qid, row) for row, qid in enumerate(ids)]
        t1 = self._clock.now()
        timings["combine"] = (t1 - t0) * 1000
        defaults = [p for p in preds if p.default]
        if defaults:
            why = defaults[0].default_explanation
            logger.info("default output", extra={"app": app.name, "rows": len(defaults), "reason": why})
        if choice.selection.policy != "single":
            ticket.stage = "recording the query for feedback"
            self._record(app, user, query, choice, answers)
            timings["record"] = (self._clock.now() - t1) * 1000
        hits = sum(a.hits for a in answers)
        first = answers[0].model
        return QueryResult(
            preds,
            query.batch,
            first.name,
            first.version,
            timings_ms=timings,
            model_timings_ms={a.model.name: a.timings_ms for a in answers if a.timings_ms},
            models=[a.model.name for a in answers],
            model_errors=[a.model.name for a in answers if a.problem is not None],
            cache_by_model={a.model.name: (a.model.version, a.hits, query.count - a.hits) for a in answers},
            cache_hits=hits,
            cache_misses=query.count * len(answers) - hits,
        )

    def late(self, ticket: QueryTicket) -> QueryResult:
        """The answer of a query still running past its deadline (a dependency call that hangs): the default
        output for each input, naming the stage it was in. Only for a ticket whose application is known."""
        assert ticket.app is not None
        app = ticket.app
        why = (
            f"no answer within the SLO of {app.latency_slo_micros / 1000:g} ms: still {ticket.stage} "
            "(a dependency is slow or unreachable)"
        )
        logger.warning("late default output", extra={"app": app.name, "query_id": ticket.ids[0], "reason": why})
        return QueryResult([Prediction(i, self.default_of(app), True, why) for i in ticket.ids], ticket.batch)

    @staticmethod
    def default_of(app: Application) -> Any:
        return default_value(app.default_output)

    @staticmethod
    def _combine(app: Application, choice: Choice, answers: list[ModelAnswer], qid: int, row: int) -> Prediction:
        outputs = {a.model.name: a.outputs[row] for a in answers if a.outputs[row] is not None}
        missing = {m for m in choice.selection.models if m not in outputs}
        combined = choice.policy.combine(choice.state, choice.selection, outputs, missing)
        res = resolve(combined, app.default_output, app.confidence_threshold, app.default_when_unsure)
        several = len(choice.selection.models) > 1
        confidence = combined.confidence if several and combined.answered else None
        if res.default:
            problems = [a.problem for a in answers if a.outputs[row] is None and a.problem]
            if not combined.answered:
                why = "; ".join(problems) or (res.explanation or "no model replied")
            else:
                why = res.explanation or "low confidence"
            return Prediction(qid, QueryProcessor.default_of(app), True, why, confidence)
        low = res.explanation if res.low_confidence else None
        return Prediction(qid, output_value(res.output), False, None, confidence, low, tuple(sorted(missing)))

    def _record(
        self, app: Application, user: str | None, query: QueryInput, choice: Choice, answers: list[ModelAnswer]
    ) -> None:
        """Keep what each model answered, and the selection, so that feedback can update the bandit."""
        if self._cache is None:
            return
        entries = {}
        for row, key in enumerate(record_keys(app.name, user, query.rows)):
            outputs = {a.model.name: a.outputs[row] for a in answers if a.outputs[row] is not None}
            if outputs:
                entries[key] = {"selection": choice.selection.to_dict(), "outputs": outputs}
        try:
            self._cache.put_many(entries)
        except Unavailable as e:
            logger.warning("query record not kept: %s", e)

    # -- gathering outputs: cache, then the models ---------------------------------------------------
    def _gather(
        self,
        app: Application,
        models: list[ModelVersion],
        query: QueryInput,
        query_id: int,
        deadline: float,
        timings: dict[str, float],
        ticket: QueryTicket,
    ) -> list[ModelAnswer]:
        n = query.count
        answers = [ModelAnswer(m, [None] * n) for m in models]
        keys: dict[str, list[str]] = {}
        waiting: dict[str, list[int]] = {}
        owned: dict[str, list[int]] = {}  # per model: the rows whose cache claim this query holds
        sent: dict[str, tuple[ModelAnswer, list[int]]] = {}
        reply_to: str | None = None
        timings["cache"] = timings["enqueue"] = 0.0
        for a in answers:
            m = a.model
            todo = list(range(n))
            t0 = self._clock.now()
            if self._cache is not None:
                ticket.stage = f"reading the prediction cache for model {m.name}:{m.version}"
                keys[m.name] = row_keys(m.name, m.version, query.rows)
                todo, waiting[m.name] = self._from_cache(a, keys[m.name], deadline - t0)
                owned[m.name] = todo
            t1 = self._clock.now()
            timings["cache"] += (t1 - t0) * 1000
            if not todo:
                continue
            if reply_to is None:
                reply_to = self._replies.new_address()
                self._replies.expect(reply_to)
            sent_ms: int | None = None
            ticket.stage = f"sending to model {m.name}:{m.version} (request queue)"
            try:
                sent_ms, send_ms = self._enqueue(app, m, _take(query.rows, todo), query_id, reply_to, deadline)
                sent[m.name] = (a, todo)
            except Unavailable as e:
                a.problem = f"model {m.name}:{m.version}: queue unavailable ({e})"
            t2 = self._clock.now()
            timings["enqueue"] += (t2 - t1) * 1000
            if sent_ms is not None:
                a.sent_ms, a.sent_at, a.timings_ms["send"] = sent_ms, t2, send_ms
        t1 = self._clock.now()
        if reply_to is not None:
            ticket.stage = "waiting for replies"
            self._await_replies(app, sent, reply_to, deadline)
        t2 = self._clock.now()
        timings["wait"] = (t2 - t1) * 1000
        for a, _ in sent.values():
            _split_model_time(a, t2)
        for a in answers:
            if a.problem is None and any(a.outputs[i] is None for i in owned.get(a.model.name, range(n))):
                a.problem = (
                    f"model {a.model.name}:{a.model.version}: timeout, no reply within the SLO of "
                    f"{app.latency_slo_micros / 1000:g} ms"
                )
        if self._cache is not None:
            ticket.stage = "reading the prediction cache (rows other queries compute)"
            self._settle_claims(answers, keys, owned, waiting, deadline)
        return answers

    def _settle_claims(
        self,
        answers: list[ModelAnswer],
        keys: dict[str, list[str]],
        owned: dict[str, list[int]],
        waiting: dict[str, list[int]],
        deadline: float,
    ) -> None:
        """Rows this query claimed but got no output for: release the claims with the cause, so the queries
        waiting on them stop at once. Rows repeated within the query take their first occurrence's output;
        rows other queries compute are awaited in the cache."""
        failures: dict[str, str] = {}
        for a in answers:
            mine = owned.get(a.model.name, [])
            if a.problem is not None:
                failures.update((keys[a.model.name][i], a.problem) for i in mine if a.outputs[i] is None)
            by_key = {keys[a.model.name][i]: a.outputs[i] for i in mine if a.outputs[i] is not None}
            for i in waiting.get(a.model.name, []):
                a.outputs[i] = by_key.get(keys[a.model.name][i], a.outputs[i])
        if failures:
            assert self._cache is not None
            try:
                self._cache.fail_many(failures, FAILED_CLAIM_TTL_S)
            except Unavailable as e:
                logger.warning("failed claims not released: %s", e)
        if any(a.outputs[i] is None for a in answers for i in waiting.get(a.model.name, [])):
            self._await_cache(answers, keys, waiting, deadline)

    def _from_cache(self, answer: ModelAnswer, keys: list[str], ttl_s: float) -> tuple[list[int], list[int]]:
        """Fill cached outputs; return (rows to compute, rows another query is computing)."""
        assert self._cache is not None
        try:
            hits = self._cache.get_many(keys)
            for i, k in enumerate(keys):
                if k in hits:
                    answer.outputs[i] = hits[k]
            answer.hits = len([k for k in keys if k in hits])
            missing = [i for i, k in enumerate(keys) if k not in hits]
            if not missing:
                return [], []
            owned = self._cache.claim(list(dict.fromkeys(keys[i] for i in missing)), max(ttl_s, 0.001))
        except Unavailable as e:
            logger.warning("cache unavailable: %s", e)
            return [i for i, o in enumerate(answer.outputs) if o is None], []
        first_row: dict[str, int] = {}
        todo, wait = [], []
        for i in missing:
            k = keys[i]
            if k in owned and first_row.setdefault(k, i) == i:
                todo.append(i)
            else:
                wait.append(i)  # a concurrent query, or an identical row of this one, computes it
        return todo, wait

    def _await_replies(
        self, app: Application, sent: dict[str, tuple[ModelAnswer, list[int]]], reply_to: str, deadline: float
    ) -> None:
        try:
            replies = self._replies.wait(reply_to, list(sent), deadline - ANSWER_MARGIN_S - self._clock.now())
        except Unavailable as e:
            for a, _ in sent.values():
                a.problem = f"model {a.model.name}:{a.model.version}: reply channel unavailable ({e})"
            return
        for reply in replies:
            if reply.model not in sent:
                continue
            a, rows = sent[reply.model]
            a.reply_timings = dict(reply.timings)
            name = f"model {a.model.name}:{a.model.version}"
            if not reply.ok:
                a.problem = f"{name}: {reply.error_kind or 'endpoint'} error: {reply.error}"
            elif len(reply.outputs or []) != len(rows):
                a.problem = f"{name}: endpoint error: {len(reply.outputs or [])} outputs for {len(rows)} inputs"
            else:
                for i, out in zip(rows, reply.outputs or [], strict=True):
                    a.outputs[i] = out

    def _await_cache(
        self, answers: list[ModelAnswer], keys: dict[str, list[str]], waiting: dict[str, list[int]], deadline: float
    ) -> None:
        """Rows a concurrent query computes: poll the cache until they are filled, their owner reports a
        failure (its cause becomes this query's), or the deadline."""
        assert self._cache is not None
        by_name = {a.model.name: a for a in answers}
        while True:
            for name, rows in waiting.items():
                a = by_name[name]
                pending = [i for i in rows if a.outputs[i] is None]
                if not pending or a.problem is not None:
                    continue
                try:
                    hits, failed = self._cache.poll([keys[name][i] for i in pending])
                except Unavailable as e:
                    a.problem = f"model {a.model.name}:{a.model.version}: prediction cache unavailable ({e})"
                    continue
                for i in pending:
                    a.outputs[i] = hits.get(keys[name][i], a.outputs[i])
                    if keys[name][i] in failed and a.problem is None:
                        a.problem = failed[keys[name][i]]
            remaining = deadline - ANSWER_MARGIN_S - self._clock.now()
            if remaining <= 0 or not any(_open(by_name[n], rs) for n, rs in waiting.items()):
                break
            time.sleep(min(self._cache_poll, remaining))
        for name, rows in waiting.items():
            a = by_name[name]
            if a.problem is None and any(a.outputs[i] is None for i in rows):
                a.problem = (
                    f"model {a.model.name}:{a.model.version}: timeout, the identical query computing this input "
                    "gave no answer within the SLO"
                )

    def _enqueue(
        self, app: Application, model: ModelVersion, rows: Rows, query_id: int, reply_to: str, deadline: float
    ) -> tuple[int, float]:
        """Send the rows to the model's queue; returns the message's ``sent_ms`` (stamped before the send)
        and the SendMessage call's time in ms."""
        payload, blob = encode_rows(rows)
        if blob is not None:
            if self._claims is None:
                raise Unavailable("input too large for a queue message and no claim-check store is set")
            key = f"claims/{reply_to}-{model.name}"
            self._claims.put(key, blob)
            payload.s3_key = key
        message = QueryMessage(
            query_id=query_id,
            app=app.name,
            model=model.name,
            version=model.version,
            input_type=app.input_type,
            rows=len(rows),
            payload=payload,
            deadline_ms=int(deadline * 1000),
            sent_ms=int(self._clock.now() * 1000),
            reply_to=reply_to,
        )
        body = message.to_json()
        t0 = self._clock.now()
        self._queue.send(model.queue_url, body)
        return message.sent_ms, (self._clock.now() - t0) * 1000


@functools.lru_cache(maxsize=1024)
def _parsed_default(text: str) -> Any:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    return text if value is None else value


def default_value(default_output: str) -> Any:
    """An application's default output as answered: Clipper registers it as a string; it is answered as the
    JSON number, list or object it spells (``"-1"`` -> ``-1``, ``"[0.5, 0.5]"`` -> ``[0.5, 0.5]``), so a
    default has the type of the predictions, and as the string otherwise (``"unknown"``; to answer the string
    ``"1"``, register the JSON string ``"\\"1\\""``)."""
    value = _parsed_default(default_output)
    return copy.deepcopy(value) if isinstance(value, list | dict) else value


def _open(answer: ModelAnswer, rows: list[int]) -> bool:
    """Whether some of ``rows`` may still get an output (none yet, and no failure reported)."""
    return answer.problem is None and any(answer.outputs[i] is None for i in rows)


def _split_model_time(answer: ModelAnswer, replied_at: float) -> None:
    """A model's time from the end of its send to the frontend holding the replies, cut by what its batcher
    reported: ``queue_ms`` (sent_ms to the batch's start: the send, SQS, the receive and the batch wait),
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
