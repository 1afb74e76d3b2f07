"""The query path's core: validate, select, look up the cache, enqueue the misses, wait for replies
until the deadline, answer.

It never raises for a model failure: a model that fails, is slow or cannot be reached yields the
application's default output with an explanation. It raises ``NotFound`` for an unknown application and
``InvalidInput`` for bad input, before anything is sent to a model.

A query runs in three steps: ``start`` (validate, select, the cache and the sends: ``clipper.frontend.fanout``),
the wait for replies (on a thread: ``predict``; on an event loop: ``predict_async``, which holds no thread while
it waits), and ``finish`` (combine, record).

Every query is timed stage by stage (``QueryResult.timings_ms``: validate, select, cache, enqueue, wait,
combine, record) and model by model (``QueryResult.model_timings_ms``: per model, ``send`` the send of the
query's messages, ``queue`` from the end of the send to the start of its batch less the batch wait,
``batch_wait`` when the batcher reports it, ``inference`` the endpoint call, ``batch_size``, and ``reply`` from
the end of the inference to the frontend holding every reply: the reply's publication and pick-up, and for an
ensemble the wait for the slower models' replies too).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from clipper.core.cache_keys import record_keys
from clipper.core.domain import Application, ModelVersion
from clipper.core.log_sampling import SampledLog
from clipper.core.messages import MAX_INLINE_PAYLOAD, Reply, output_value
from clipper.core.registry_cache import held_app, reread_app
from clipper.core.validation import DEFAULT_MAX_BATCH, QueryInput, fit_models, json_kind, validate_query
from clipper.errors import ClipperError, InvalidInput, Unavailable
from clipper.frontend import steps
from clipper.frontend.canary_tally import CanaryTally
from clipper.frontend.fanout import ANSWER_MARGIN_S, FAILED_CLAIM_TTL_S, Fanout, Gatherer, split_model_time
from clipper.frontend.invocation import query_deadline
from clipper.frontend.lane import SingleModelLane
from clipper.frontend.results import MODEL_FAILURES, ModelAnswer, Prediction, QueryResult, QueryTicket
from clipper.frontend.selection import Choice, Selector
from clipper.ports import ClaimStore, Clock, LookupOrSend, PredictionCache, Registry, ReplyChannel, RequestQueue
from clipper.selection import resolve

logger = logging.getLogger(__name__)

__all__ = ["ANSWER_MARGIN_S", "FAILED_CLAIM_TTL_S", "QueryListener", "QueryProcessor", "default_value", "user_id"]


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
        got = "an empty string" if uid == "" else json_kind(uid)
        if isinstance(uid, float) and uid.is_integer() and abs(uid) >= 2.0**63:
            got = "an integer past 64 bits"  # the JSON parser read it as a float
        raise InvalidInput("uid", "an integer (within 64 bits) or a non-empty string", got)
    text = str(uid)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_UID_BYTES:  # it keys the user's selection state: percent-encoded, DynamoDB takes 2,048 bytes
        raise InvalidInput("uid", f"at most {MAX_UID_BYTES} bytes in UTF-8", f"{size} bytes")
    return text


MAX_UID_BYTES = 512


@dataclass
class Started:
    """A query between ``start`` and ``finish``: its models are asked, its replies not yet in."""

    ticket: QueryTicket
    choice: Choice
    fanout: Fanout
    timings: dict[str, float]
    wait_started: float = 0.0


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
        inline: bool = False,
        fused: LookupOrSend | None = None,
        tally: CanaryTally | None = None,
    ) -> None:
        """``inline``: every dependency of the query path answers in well under a millisecond and bounds each
        call by the timeout given (the lean Redis client), so a query may run on an event loop
        (``predict_async``). ``tally``: counts each query's outcome per version of a model answered in a canary trial (a
        single-model application's queries are recorded for feedback while its model has one, tally or not)."""
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
        # the lines every query would write in an outage: at most one a second for each kind and application
        self._log = SampledLog(logger, clock=clock.now)
        self._gatherer = Gatherer(queue, replies, clock, claims, cache, cache_poll_s, fused, self._log)
        self._inline = inline
        self._tally = tally
        # the common query's lane (clipper.frontend.lane): on the loop, with the fused lookup-and-send, and a
        # registry copy that tells whether it holds what a query needs
        self.lane: SingleModelLane | None = None
        if inline and self._gatherer.fused and all(hasattr(registry, a) for a in ("get_app_held", "held_first_model")):
            parts = (registry, self._gatherer, replies, clock, new_query_id, max_batch, listener)
            self.lane = SingleModelLane(*parts)

    @property
    def registry(self) -> Registry:
        return self._registry

    @property
    def cache(self) -> PredictionCache | None:
        """The prediction cache (with the query records feedback joins with), if any."""
        return self._cache

    @property
    def tally(self) -> CanaryTally | None:
        return self._tally

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
        app, current = held_app(self._registry, app_name)
        if app is not None:
            self._begin(app, body, ticket, self._clock.now())
            ticket.recheck = not current

    def _begin(self, app: Application, body: Any, ticket: QueryTicket, start: float) -> None:
        query = validate_query(app, body, self._max_batch, booleans=ticket.booleans)
        user = user_id(body)
        first_id = self._new_id()
        deadline = query_deadline(start, app.slo_seconds, ticket.ends)
        ticket.begin(app, [first_id + i for i in range(query.count)], query.batch, deadline)
        ticket.query, ticket.user, ticket.started = query, user, start
        ticket.validate_ms = (self._clock.now() - start) * 1000
        if self._listener is not None:
            self._listener.started(app.name, first_id)

    def _recheck(self, app_name: str, body: Any, ticket: QueryTicket) -> None:
        """An admitted query whose application the registry copy held past its staleness bound: the application
        read again (``NotFound``: deleted meanwhile, a 404) and, when it changed (its policy, SLO, shape, a new
        incarnation...), the query begun again with it. While the registry cannot be read the held one stands,
        so the query is still answered in time."""
        ticket.recheck = False
        ticket.stage = "reading the application"
        try:
            app = reread_app(self._registry, app_name)  # the copy would answer its held entry while reloading
        except Unavailable as e:
            self._log.warning(
                ("held", app_name),
                "application %s answered as last held: the registry cannot be read (%s)",
                app_name,
                e,
            )
            return
        if app != ticket.app:
            self._begin(app, body, ticket, ticket.started)

    def can_inline(self, ticket: QueryTicket) -> bool:
        """Whether this admitted query may run on the event loop: the dependencies are fast and bounded, its
        bandit state is in memory, and its input needs no claim check."""
        if not self._inline or ticket.app is None or ticket.query is None or ticket.recheck:
            return False
        rows = ticket.query.rows
        small = not hasattr(rows, "nbytes") or rows.nbytes < MAX_INLINE_PAYLOAD // 2
        return small and self._selector.is_cached(ticket.app, ticket.user)

    def predict(self, app_name: str, body: Any, ticket: QueryTicket | None = None) -> QueryResult:
        """Answer one request, waiting for the replies on this thread. ``ticket`` (the caller's) is filled in as
        the query goes, so a watchdog that gives up on it at its deadline (``late``) can still answer with the
        default and say what held it up."""
        started = steps.run(self.start(app_name, body, ticket if ticket is not None else QueryTicket()))
        if isinstance(started, QueryResult):
            return started
        fan = started.fanout
        replies: list[Reply] | Unavailable = []
        if fan.reply_to is not None:
            try:
                replies = self._replies.wait(fan.reply_to, list(fan.sent), self._gatherer.wait_timeout(fan))
            except Unavailable as e:
                replies = e
        result = steps.run(self.finish(started, replies, blocking=True))
        assert result is not None
        return result

    async def predict_async(self, app_name: str, body: Any, ticket: QueryTicket) -> QueryResult:
        """``predict`` for an event loop: ``start`` runs here (its calls are short and bounded by the query's
        remaining time) and the wait for replies holds no thread. The caller runs it only when the processor's
        dependencies answer in well under a millisecond (``inline``); rows that wait on other queries'
        computations are awaited on a worker thread."""
        started = await steps.run_async(self.start(app_name, body, ticket, on_worker=False))
        if isinstance(started, QueryResult):
            return started
        fan = started.fanout
        replies: list[Reply] | Unavailable = []
        if fan.reply_to is not None:
            try:
                replies = await self._replies.wait_async(fan.reply_to, list(fan.sent), self._gatherer.wait_timeout(fan))
            except Unavailable as e:
                replies = e
        return await self.finish_async(started, replies)

    async def finish_async(self, started: Started, replies: list[Reply] | Unavailable) -> QueryResult:
        """``finish`` on an event loop; rows that wait on other queries' computations are awaited on a worker
        thread (the cache is polled)."""
        result = await steps.run_async(self.finish(started, replies, blocking=False))
        if result is None:
            ticket = started.ticket
            await asyncio.to_thread(self._gatherer.await_followers, ticket.app, started.fanout, ticket)  # type: ignore[arg-type]
            result = await steps.run_async(self.finish(started, None, blocking=False))
        assert result is not None
        return result

    async def finish_lane(
        self,
        ticket: QueryTicket,
        choice: Choice,
        fan: Fanout,
        timings: dict[str, float],
        wait_started: float,
        replies: list[Reply] | Unavailable,
    ) -> QueryResult:
        """A query of the lane (``clipper.frontend.lane``) whose outcome was not an answer, finished the general
        way from the state the lane built."""
        return await self.finish_async(Started(ticket, choice, fan, timings, wait_started), replies)

    def start(
        self, app_name: str, body: Any, ticket: QueryTicket, on_worker: bool = True
    ) -> steps.Steps[Started | QueryResult]:
        """Validate (unless admitted), select the models, look up the cache, send the misses, as steps
        (``clipper.frontend.steps``). A query that needs no model (no model linked, bandit state unreadable)
        gets its answer here. ``on_worker``: this runs on a worker thread (an admitted query reports how long it
        waited for it)."""
        taken = self._clock.now()
        timings: dict[str, float] = {}
        if ticket.query is None:
            self._begin(self._registry.get_app(app_name), body, ticket, taken)
        elif on_worker:  # admitted on the event loop: how long it waited for this thread
            timings["worker"] = (taken - ticket.started) * 1000 - ticket.validate_ms
            if ticket.recheck:
                self._recheck(app_name, body, ticket)
        assert ticket.app is not None and ticket.query is not None and ticket.deadline is not None
        if ticket.abandoned:  # answered by the watchdog while it waited for a worker: nothing to do
            return self.late(ticket)
        app, query, ids = ticket.app, ticket.query, ticket.ids
        timings["validate"] = ticket.validate_ms
        start = self._clock.now()
        try:
            # (a late default names it: a single-model application reads no bandit state)
            ticket.stage = "choosing the model" if app.policy == "single" else "reading the bandit state"
            choice = self._selector.choose(app, ticket.user)
        except ClipperError as e:
            return self._fallback(ticket, timings, f"no model to serve the query: {e}")
        if choice is None:
            return self._fallback(ticket, timings, f"no model is linked to application '{app.name}'")
        # as the selected models take it (InvalidInput: a 400, nothing sent); the query's record for feedback keeps
        # the application's view of the input, which feedback's own validation gives
        sent = fit_models(app, query, choice.models, self._candidates(app, choice))
        timings["select"] = (self._clock.now() - start) * 1000
        ticket.models = choice.models
        if self._listener is not None:
            self._listener.selected(app.name, choice.models)
        fan = yield from self._gatherer.send_steps(app, choice.models, sent, ids[0], ticket.deadline, timings, ticket)
        ticket.stage = fan.stage()
        return Started(ticket, choice, fan, timings, self._clock.now())

    def _candidates(self, app: Application, choice: Choice) -> list[ModelVersion]:
        """The versions ``app``'s policy chooses among, for ``fit_models``: the selected ones for an application
        with a shape (not used) or on the "single" policy (its first model answers); else every linked model's
        active version (the registry copy's; the selected ones when it cannot say)."""
        if app.input_shape is not None or app.policy == "single":
            return choice.models
        try:
            return [self._registry.active_version(m) for m in self._registry.linked_models(app.name)]
        except ClipperError:
            return choice.models

    def finish(
        self, started: Started, replies: list[Reply] | Unavailable | None, blocking: bool = True
    ) -> steps.Steps[QueryResult | None]:
        """Take in the replies and answer, as steps. ``replies`` None: already taken in (a second call after
        ``await_followers``). Without ``blocking``, returns None when rows wait on other queries' computations
        (the caller awaits them with ``Gatherer.await_followers``, then calls again)."""
        ticket, choice, fan, timings = started.ticket, started.choice, started.fanout, started.timings
        app, query = ticket.app, ticket.query
        assert app is not None and query is not None
        if replies is not None:
            now = self._clock.now()
            timings["wait"] = (now - started.wait_started) * 1000
            yield from self._gatherer.absorb(app, fan, replies)
            for a, _ in fan.sent.values():
                split_model_time(a, now)
            if fan.followers:
                if not blocking:
                    return None
                self._gatherer.await_followers(app, fan, ticket)
        answers = fan.answers
        t0 = self._clock.now()
        preds = [self._combine(app, choice, answers, qid, row) for row, qid in enumerate(ticket.ids)]
        t1 = self._clock.now()
        timings["combine"] = (t1 - t0) * 1000
        defaults = [p for p in preds if p.default]
        if defaults:
            why = defaults[0].default_explanation
            self._log.info(
                ("default", app.name), "default output", extra={"app": app.name, "rows": len(defaults), "reason": why}
            )
        tally = self._tally
        if choice.selection.policy != "single" or choice.trials:
            ticket.stage = "recording the query for feedback"
            yield from self._record(app, ticket.user, query, choice, answers, ticket.deadline, preds)
            timings["record"] = (self._clock.now() - t1) * 1000
        if tally is not None:
            tally.count(answers, choice.trials)
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
            versions={a.model.name: a.model.version for a in answers},
            model_errors=[a.model.name for a in answers if a.failure in MODEL_FAILURES],
            transport_failures=[a.model.name for a in answers if a.transport_failed()],
            cache_by_model={a.model.name: (a.model.version, a.hits, query.count - a.hits) for a in answers},
            cache_hits=hits,
            cache_misses=query.count * len(answers) - hits,
        )

    def _fallback(self, ticket: QueryTicket, timings: dict[str, float], why: str) -> QueryResult:
        assert ticket.app is not None and ticket.query is not None
        name = ticket.app.name
        self._log.info(
            ("default", name), "default output", extra={"app": name, "query_id": ticket.ids[0], "reason": why}
        )
        default = self.default_of(ticket.app)
        return QueryResult(
            [Prediction(i, default, True, why) for i in ticket.ids], ticket.query.batch, timings_ms=timings
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
        extra = {"app": app.name, "query_id": ticket.ids[0], "reason": why}
        self._log.warning(("late", app.name), "late default output", extra=extra)
        first = ticket.models[0] if ticket.models else None
        return QueryResult(
            [Prediction(i, self.default_of(app), True, why) for i in ticket.ids],
            ticket.batch,
            first.name if first else None,
            first.version if first else None,
            models=[m.name for m in ticket.models],
            versions={m.name: m.version for m in ticket.models},
            transport_failures=[m.name for m in ticket.models],  # held up by a dependency, not by a model
        )

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
            problems = [why for a in answers if a.outputs[row] is None and (why := a.problem_of(row))]
            if not combined.answered:
                why = "; ".join(problems) or (res.explanation or "no model replied")
            else:
                why = res.explanation or "low confidence"
            return Prediction(qid, QueryProcessor.default_of(app), True, why, confidence)
        low = res.explanation if res.low_confidence else None
        return Prediction(qid, output_value(res.output), False, None, confidence, low, tuple(sorted(missing)))

    def _record(
        self,
        app: Application,
        user: str | None,
        query: QueryInput,
        choice: Choice,
        answers: list[ModelAnswer],
        deadline: float | None,
        preds: list[Prediction] | None = None,
    ) -> steps.Steps[None]:
        """Keep what each model answered, and the selection, so that feedback can update the bandit."""
        if self._cache is None:
            return
        entries: dict[str, dict[str, Any]] = {}
        unanswered: dict[str, dict[str, Any]] = {}  # no model answered: kept only where no record is
        # the models selected whose own failure left them without an output (no reply within the SLO, an error
        # reply): feedback counts each as a loss, so a model that stops answering loses its share instead of
        # keeping what it had won; not when the frontend's own dependencies failed ("unavailable": the queue,
        # the cache, the reply channel), which is no model's doing
        # (per input: a batch query's input that another query computed ends on its own, and its owner's failure
        # is counted in that query)
        learns = choice.selection.policy != "single"  # the canary's evidence is the outputs' alone
        for row, key in enumerate(record_keys(app.name, user, query.rows)):
            outputs = {a.model.name: a.outputs[row] for a in answers if a.outputs[row] is not None}
            faulted = {a.model.name for a in answers if a.failure_of(row) in MODEL_FAILURES} if learns else ()
            missing = [m for m in choice.selection.models if m not in outputs and m in faulted]
            if not outputs and not missing:
                continue
            # with the version asked of each model: a canary's feedback is its own
            versions = {
                a.model.name: a.model.version for a in answers if a.model.name in outputs or a.model.name in missing
            }
            entry: dict[str, Any] = {"selection": choice.selection.to_dict(), "outputs": outputs, "versions": versions}
            if missing:
                entry["missing"] = missing
            trials = {m: t for m, t in choice.trials.items() if m in outputs}
            if trials:  # the canary trials it was answered in: its feedback is evidence of those alone
                entry["trials"] = trials
            if app.incarnation:  # whose prediction it is: feedback joins it only to this incarnation's states
                entry["incarnation"] = app.incarnation
            if preds is not None:  # what the query answered, for the selection report (clipper.report)
                p = preds[row]
                entry["answer"] = {"output": p.output, "default": p.default, "confidence": p.confidence}
            # a query no model answered does not replace the record of the same input answered before (a retry
            # that failed would charge every model for the answer the user did get)
            (entries if outputs else unanswered)[key] = entry
        # past the deadline the answer is ready: a short bound, not the query's remaining time
        timeout = max(0.05, (deadline or 0.0) - self._clock.now())
        try:
            if entries:
                yield steps.call(self._cache, "put_many", entries, timeout=timeout)
            if unanswered:
                yield steps.call(self._cache, "put_new", unanswered, timeout=timeout)
        except Unavailable as e:
            self._log.warning(("record", app.name), "query record not kept: %s", e)


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
