"""What a canary decision is made from: counters per model version, mergeable and stored as numbers.

A :class:`VersionEvidence` counts, for one version of a model, the feedback labels that judged its
predictions (``feedback``) and the sum of their losses (``loss_sum``, each loss in [0, 1]; Clipper's
feedback gives 0 or 1 for classes), and the queries routed to it (``queries``), those its endpoint failed
(``errors``) and those that missed the SLO and were answered with the default output (``slo_misses``).

Evidence is additive: two records of the same version add up field by field (``a + b``), so partial
counts (per container, per batch of feedback) merge in any order, and a store can keep every field as an
atomic counter (DynamoDB ``ADD``). :meth:`VersionEvidence.to_dict` is a flat map of numbers: the counts as
``int`` and ``loss_sum`` as a ``float`` whose ``repr`` round-trips; :meth:`~VersionEvidence.from_dict`
reads it back from ``int``, ``float``, ``Decimal`` (DynamoDB) or ``str``.

A :class:`CanaryEvidence` is the pair the decision compares: the ``current`` version and the ``canary``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Any

SCHEMA = 1
# Float sums of losses in [0, 1] may exceed the count by rounding; more than this is corruption.
_LOSS_SUM_SLACK = 1e-6

_COUNTS = ("feedback", "queries", "errors", "slo_misses")


@dataclass(frozen=True)
class VersionEvidence:
    """The counters of one model version. Every field is non-negative; ``loss_sum <= feedback``."""

    feedback: int = 0
    loss_sum: float = 0.0
    queries: int = 0
    errors: int = 0
    slo_misses: int = 0

    def __post_init__(self) -> None:
        counts = (self.feedback, self.queries, self.errors, self.slo_misses)
        if not all(type(c) is int and c >= 0 for c in counts):  # not bool, not float: they are stored as ints
            raise ValueError(
                f"evidence counts must be non-negative ints, got {dict(zip(_COUNTS, counts, strict=True))}"
            )
        loss = self.loss_sum
        if type(loss) is not float:
            if isinstance(loss, bool) or not isinstance(loss, int | float):
                raise ValueError(f"evidence loss_sum must be a number, got {loss!r}")
            object.__setattr__(self, "loss_sum", float(loss))
        if not 0.0 <= loss <= self.feedback * (1 + _LOSS_SUM_SLACK) + _LOSS_SUM_SLACK:  # NaN fails too
            raise ValueError(f"evidence loss_sum must be in [0, feedback={self.feedback}], got {loss!r}")

    @classmethod
    def of_feedback(cls, *losses: float) -> VersionEvidence:
        """The evidence of feedback labels with these losses (each in [0, 1])."""
        for loss in losses:
            if not 0.0 <= loss <= 1.0:
                raise ValueError(f"a loss must be in [0, 1], got {loss!r}")
        return cls(feedback=len(losses), loss_sum=math.fsum(losses))

    @classmethod
    def of_query(cls, *, error: bool = False, slo_miss: bool = False) -> VersionEvidence:
        """The evidence of one query routed to the version: whether its endpoint failed, whether it missed."""
        return cls(queries=1, errors=int(error), slo_misses=int(slo_miss))

    @property
    def loss_rate(self) -> float | None:
        return self.loss_sum / self.feedback if self.feedback else None

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.queries if self.queries else None

    @property
    def slo_miss_rate(self) -> float | None:
        return self.slo_misses / self.queries if self.queries else None

    def __add__(self, other: VersionEvidence) -> VersionEvidence:
        if not isinstance(other, VersionEvidence):
            return NotImplemented
        return VersionEvidence(
            feedback=self.feedback + other.feedback,
            loss_sum=self.loss_sum + other.loss_sum,
            queries=self.queries + other.queries,
            errors=self.errors + other.errors,
            slo_misses=self.slo_misses + other.slo_misses,
        )

    def to_dict(self) -> dict[str, int | float]:
        """A flat map of numbers: the counts as ``int``, ``loss_sum`` as ``float``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VersionEvidence:
        """What :meth:`to_dict` wrote; a missing field is 0. Raises ``ValueError`` for a corrupt record."""
        try:
            counts = {name: _count(data.get(name, 0), name) for name in _COUNTS}
            loss_sum = float(_number(data.get("loss_sum", 0.0)))
        except (TypeError, ArithmeticError) as e:
            raise ValueError(f"corrupt canary evidence: {e!r}") from e
        return cls(loss_sum=loss_sum, **counts)


@dataclass(frozen=True)
class CanaryEvidence:
    """The evidence of the current version and of the canary, side by side."""

    current: VersionEvidence = VersionEvidence()
    canary: VersionEvidence = VersionEvidence()

    def __add__(self, other: CanaryEvidence) -> CanaryEvidence:
        if not isinstance(other, CanaryEvidence):
            return NotImplemented
        return CanaryEvidence(self.current + other.current, self.canary + other.canary)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "current": self.current.to_dict(), "canary": self.canary.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CanaryEvidence:
        """What :meth:`to_dict` wrote. Raises ``ValueError`` for a corrupt record or an unknown schema."""
        try:
            schema = _count(data.get("schema", SCHEMA), "schema")
            if schema != SCHEMA:
                raise ValueError(f"unknown canary evidence schema {schema}")
            current, canary = data["current"], data["canary"]
        except (KeyError, TypeError, ArithmeticError) as e:
            raise ValueError(f"corrupt canary evidence: {e!r}") from e
        return cls(VersionEvidence.from_dict(current), VersionEvidence.from_dict(canary))


def _number(value: Any) -> int | float | Decimal:
    if isinstance(value, str):
        value = Decimal(value)
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise TypeError(f"expected a number, got {value!r}")
    return value


def _count(value: Any, name: str) -> int:
    number = _number(value)
    if number != int(number):
        raise ValueError(f"corrupt canary evidence: {name} must be a whole number, got {value!r}")
    return int(number)
