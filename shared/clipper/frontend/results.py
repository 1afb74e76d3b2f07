"""The values a query produces: one ``Prediction`` per input, the ``QueryResult`` the API shapes into
Clipper's response, and each model's ``ModelAnswer`` on the way."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clipper.core.domain import Application, ModelVersion
from clipper.core.validation import QueryInput

# a ModelAnswer's failure kinds that are the model's own (counted as its errors), and those that are not: the
# frontend's dependencies ("unavailable") and another query's failure the row waited on ("followed")
MODEL_FAILURES = ("error", "timeout")
UNCHARGED = ("unavailable", "followed")


@dataclass
class Prediction:
    query_id: int
    output: Any
    default: bool
    default_explanation: str | None = None
    confidence: float | None = None
    low_confidence: str | None = None
    missing_models: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"query_id": self.query_id, "output": self.output, "default": self.default}
        if self.default_explanation is not None:
            out["default_explanation"] = self.default_explanation
        if self.confidence is not None:
            out["confidence"] = round(self.confidence, 4)
        if self.low_confidence is not None:
            out["low_confidence"] = self.low_confidence
        if self.missing_models:
            out["missing_models"] = list(self.missing_models)
        return out


@dataclass
class QueryResult:
    """What ``predict`` answers: one prediction per input, in order."""

    predictions: list[Prediction]
    batch: bool
    model: str | None = None
    version: str | None = None
    models: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)  # model -> the version of it that was asked
    cache_by_model: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # model -> (version, hits, misses)
    timings_ms: dict[str, float] = field(default_factory=dict)  # stage -> ms
    model_timings_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> stage -> ms
    model_errors: list[str] = field(default_factory=list)  # the models that gave no output (error, timeout)
    # the models asked that gave no output because the frontend's own dependencies failed (the request queue, the
    # reply channel, the prediction cache: Redis down, SQS refusing): no model's error
    transport_failures: list[str] = field(default_factory=list)
    cache_hits: int = 0
    cache_misses: int = 0

    def as_dict(self, debug: bool = False) -> dict[str, Any]:
        body: dict[str, Any]
        if self.batch:
            body = {"batch_predictions": [p.as_dict() for p in self.predictions]}
        else:
            body = self.predictions[0].as_dict()
        if debug:
            body["debug"] = {
                "model": self.model,
                "version": self.version,
                "models": self.models,
                "versions": self.versions,
                "timings_ms": self.timings_ms,
                "model_timings_ms": self.model_timings_ms,
                "cache": {"hits": self.cache_hits, "misses": self.cache_misses},
            }
        return body


@dataclass
class ModelAnswer:
    """One model's outputs for the rows of a query (``None`` where it gave none) and why not."""

    model: ModelVersion
    outputs: list[Any]
    problem: str | None = None
    # what the problem was: "error" (the model replied with an error, or cannot be asked), "timeout" (no reply by
    # the deadline), "unavailable" (the frontend's own dependencies failed), "followed" (the identical query whose
    # computation the row waited on got no output: counted in that query)
    failure: str | None = None
    hits: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)  # this model's stages (send, queue, ...)
    reply_timings: dict[str, float] = field(default_factory=dict)  # as its batcher reported them
    sent_ms: int | None = None  # its message's sent_ms
    sent_at: float | None = None  # when its message's send ended (clock seconds)
    # rows whose own cause and kind are not ``problem`` and ``failure`` (a batch query's inputs that other queries
    # computed end one by one)
    row_problems: dict[int, tuple[str, str]] | None = None

    def _of(self, row: int) -> tuple[str | None, str | None]:
        own = self.row_problems.get(row) if self.row_problems else None
        return own if own is not None else (self.problem, self.failure)

    def problem_of(self, row: int) -> str | None:
        """Why ``row`` has no output: its own cause where it has one, else the model's."""
        return self._of(row)[0]

    def failure_of(self, row: int) -> str | None:
        """What kind of failure left ``row`` without an output (``failure``'s kinds): its own, else the model's."""
        return self._of(row)[1]

    def transport_failed(self) -> bool:
        """Whether the frontend's own dependencies left a row without this model's output and the model did not
        fail (its errors are counted instead): the model's failure kind is "unavailable", or it is another query's
        ("followed") and some row's own is "unavailable" (a batch's inputs end one by one)."""
        if self.failure == "unavailable":
            return True
        if self.failure in MODEL_FAILURES or not self.row_problems:
            return False
        return any(kind == "unavailable" for _, kind in self.row_problems.values())

    def fail(self, problem: str, failure: str) -> None:
        """Record why this model gave no output, and what kind of failure it was (the two are always set together)."""
        self.problem, self.failure = problem, failure


@dataclass
class QueryTicket:
    """What a query has reached, as its processor goes: shared with the caller's watchdog, which answers
    with the default at the deadline when the processor is still held up by a dependency."""

    app: Application | None = None
    ids: list[int] = field(default_factory=list)
    batch: bool = False
    deadline: float | None = None  # clock seconds
    stage: str = "waiting for a worker thread"
    query: QueryInput | None = None
    user: str | None = None
    started: float = 0.0
    validate_ms: float = 0.0
    abandoned: bool = False  # the watchdog answered for it
    models: list[ModelVersion] = field(default_factory=list)  # the models it asked, once selected
    # whether its body may hold JSON booleans in an array (False: its handler saw the raw text hold none)
    booleans: bool = True
    # admitted with the registry copy's application past its staleness bound (no query came for a while): read
    # again on the worker thread before the query goes on (it changed, or was deleted, meanwhile)
    recheck: bool = False
    # when the serving function's invocation ends (``clipper.frontend.invocation``): the deadline is at most it
    ends: float | None = None

    def begin(self, app: Application, ids: list[int], batch: bool, deadline: float) -> None:
        self.app, self.ids, self.batch, self.deadline = app, ids, batch, deadline
