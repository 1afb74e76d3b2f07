"""The common query's lane: one input, for an application served by its first linked model alone (the "single"
policy), no canary running, on the event loop with the fused Redis lookup-and-send (the local stack).

``QueryProcessor.predict_async`` runs every query through the general machinery: a ticket admitted, the selector
(policy objects and a bandit state built per query), the start and the finish as steps, and ``finish`` (absorbing
replies, combining the models' outputs, recording for feedback, the canary tally). For this query all of that
computes a known result: the one model's output, or the default. The lane takes the same decisions with the same
functions where they decide something (``validate_query``, the registry copy (read once: ``held_first_model``
is ``ready_for``'s check with what it found), the general path's send ``Gatherer.send_steps``, ``combine_outputs``
and ``resolve``, ``split_model_time``) and builds the same ``QueryResult``, so the answer, the metrics and the logs
are the ones the general path gives; it skips only the generality. Measured on the pinned local stack
(bench/README, "Where the frontend's CPU goes, and the common query's lane"): the frontend's CPU a query fell 24 %
with 8 queries in flight and 9-12 % at 250-1,000 q/s.

Anything else goes the general way, decided before anything is sent: a batch, a user id, a debug request, another
policy, a canary running, an input too large for a message, a
registry copy that would have to read. After the send, any outcome other than an answer (the queue or the reply
channel unavailable, an error reply, no reply in time, another query computing the same input) is finished by the
general path's own ``finish`` from the state the lane built, so defaults, their explanations and the release of
the cache claims are the general path's too.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

from clipper.core.domain import Application, ModelVersion
from clipper.core.messages import MAX_INLINE_PAYLOAD, Reply, no_answer, output_value
from clipper.core.validation import QueryInput, fit_models, validate_query
from clipper.errors import ClipperError, Unavailable
from clipper.frontend import steps
from clipper.frontend.fanout import Gatherer, split_model_time
from clipper.frontend.invocation import invocation_ends, query_deadline
from clipper.frontend.results import ModelAnswer, Prediction, QueryResult, QueryTicket
from clipper.frontend.selection import Choice
from clipper.ports import Clock, ReplyChannel
from clipper.selection import combine_outputs, resolve
from clipper.selection.policies import policy_for
from clipper.selection.state import initial_state

# Finishes a query the general way from the state the lane built: ``QueryProcessor.finish_lane(ticket, choice,
# fanout, timings, wait_started, replies)``.
Finish = Callable[..., Awaitable[QueryResult]]


class SingleModelLane:
    def __init__(
        self,
        registry: Any,
        gatherer: Gatherer,
        replies: ReplyChannel,
        clock: Clock,
        new_query_id: Callable[[], int],
        max_batch: int,
        listener: Any = None,
    ) -> None:
        self._registry = registry
        self._gatherer = gatherer
        self._replies = replies
        self._clock = clock
        self._new_id = new_query_id
        self._max_batch = max_batch
        self._listener = listener
        self.taken = 0  # queries answered by the lane (the rest went the general way)

    def model_for(self, app_name: str) -> tuple[Application, list[str], ModelVersion] | None:
        """The application, its linked models and the version that answers it when the lane may: from the
        registry copy, without a read; None for anything the general path must decide."""
        registry = self._registry
        try:
            app, current = registry.get_app_held(app_name, admit=False)  # the general path admits it
        except ClipperError:
            return None  # unknown application: the general path says so
        if app is None or not current or app.policy != "single":
            return None  # not held, or held past its staleness bound (the general path reads it first), or not ours
        held = registry.held_first_model(app_name)  # what the general path's choice would read, all held
        if held is None:
            return None  # something to read, or an unknown model: the general path reads it or says so
        linked, model, canary = held
        if canary is not None or not model.queue_url:
            return None
        return app, linked, model

    async def predict(self, app_name: str, body: Any, booleans: bool, finish: Finish) -> QueryResult | None:
        """The query's result, or None when it is not the lane's (nothing was sent then). ``finish``: the
        general path's, for any outcome but an answer."""
        if not isinstance(body, dict) or len(body) != 1 or "input" not in body:
            return None
        clock = self._clock
        start = clock.now()
        found = self.model_for(app_name)
        if found is None:
            return None
        app, linked, model = found
        selected = clock.now()
        try:
            query = fit_models(app, validate_query(app, body, self._max_batch, booleans=booleans), [model])
        except ClipperError:
            return None  # the general path answers the same 4xx
        rows = query.rows
        if not hasattr(rows, "nbytes") or rows.nbytes >= MAX_INLINE_PAYLOAD // 2:
            return None
        qid = self._new_id()
        ends = invocation_ends()
        deadline = query_deadline(start, app.slo_seconds, ends)
        listener = self._listener
        if listener is not None:
            listener.started(app.name, qid)
            listener.selected(app.name, [model])
        t0 = clock.now()
        timings = {"select": (selected - start) * 1000, "validate": (t0 - selected) * 1000}
        ticket = QueryTicket(
            app=app, ids=[qid], deadline=deadline, query=query, started=start, booleans=booleans, ends=ends
        )
        ticket.models, ticket.validate_ms = [model], timings["validate"]
        # the general path's send: one input, one model, the fused lookup-and-send (cache and enqueue timings)
        fan = await steps.run_async(self._gatherer.send_steps(app, [model], query, qid, deadline, timings, ticket))
        answer = fan.answers[0]
        t1 = clock.now()
        outcome = "hit" if answer.hits else "sent" if model.name in fan.sent else "other"
        self.taken += 1
        replies: list[Reply] | Unavailable = []
        try:  # nothing sent (a hit, a failure, another query's computation): no reply to wait for, the waiter goes
            replies = await self._replies.wait_async(fan.reply_to, list(fan.sent), self._gatherer.wait_timeout(fan))  # type: ignore[arg-type]
        except Unavailable as e:
            replies = e
        if outcome == "hit":
            timings["wait"] = (clock.now() - t1) * 1000  # as the general path records it for a hit
            result = self._result(app, query, qid, answer, timings)
            if result is not None:
                return result
        elif outcome == "sent":
            now = clock.now()
            if isinstance(replies, list) and len(replies) == 1:
                reply = replies[0]
                if reply.ok and reply.outputs is not None and len(reply.outputs) == 1:
                    timings["wait"] = (now - t1) * 1000
                    answer.reply_timings = dict(reply.timings)
                    answer.outputs[0] = reply.outputs[0]
                    split_model_time(answer, now)
                    self._gatherer.observe(answer)
                    result = self._result(app, query, qid, answer, timings)
                    if result is not None:
                        return result
                    answer.outputs[0] = None  # not an answer after all (null, a non-finite score): the general way
        ticket.stage = fan.stage()
        return await finish(ticket, self._choice(app, linked, model), fan, timings, t1, replies)

    def _result(
        self, app: Application, query: QueryInput, qid: int, answer: ModelAnswer, timings: dict[str, float]
    ) -> QueryResult | None:
        """The answer as ``QueryProcessor.finish`` builds it for one model and one input; None when the output
        resolves to the default (the general path then explains it)."""
        t0 = self._clock.now()
        name, output = answer.model.name, answer.outputs[0]
        if no_answer(output):
            return None  # the model answered nothing for it: the general path says so
        combined = combine_outputs({name: 1.0}, (name,), {name: output})
        res = resolve(combined, app.default_output, app.confidence_threshold, app.default_when_unsure)
        if res.default:
            return None
        low = res.explanation if res.low_confidence else None
        prediction = Prediction(qid, output_value(res.output), False, None, None, low, ())
        timings["combine"] = (self._clock.now() - t0) * 1000
        model = answer.model
        return QueryResult(
            [prediction],
            query.batch,
            model.name,
            model.version,
            timings_ms=timings,
            model_timings_ms={model.name: answer.timings_ms} if answer.timings_ms else {},
            models=[model.name],
            versions={model.name: model.version},
            model_errors=[],
            cache_by_model={model.name: (model.version, answer.hits, 1 - answer.hits)},
            cache_hits=answer.hits,
            cache_misses=1 - answer.hits,
        )

    @staticmethod
    def _choice(app: Application, linked: list[str], model: ModelVersion) -> Choice:
        policy = policy_for(app.policy, app.policy_params)
        state = initial_state(app.policy, linked, app.incarnation)
        return Choice(policy, state, policy.select(state, random.Random(0)), [model])
