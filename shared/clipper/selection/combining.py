"""Combining the outputs of the selected models, and judging an output against a feedback label.

Outputs are of two kinds, decided from the outputs themselves:

- **scores**: every output is a real number (``int`` or ``float``, not ``bool``) and at least one is a
  ``float``. They are combined by the weighted mean; a model *agrees* when its score is within
  ``tolerance`` of the mean. A non-finite score (NaN, infinity) counts as a missing reply.
- **classes**: anything else (``int`` labels, strings, booleans, lists). They are combined by a weighted
  vote; a model agrees when its output equals the winner. A tie goes to the output of the model listed
  first in the selection (policies list models by decreasing weight).

The confidence is the weighted fraction of the *selected* models that agree with the combined output:
a model that did not reply in time does not agree, so stragglers lower the confidence.

The loss of an output against a label (:func:`loss`) is in [0, 1]: for classes 0 when equal, else 1; for
scores the absolute error divided by the application's ``loss_scale`` (1 unless set), capped at 1 (a non-finite
score loses 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Combined:
    """The answer of a set of selected models: ``output`` is None when no model replied (``answered``)."""

    output: Any
    confidence: float
    used: tuple[str, ...]
    missing: tuple[str, ...]

    @property
    def answered(self) -> bool:
        return bool(self.used)

    def confident(self, threshold: float) -> bool:
        return self.answered and self.confidence >= threshold


@dataclass(frozen=True)
class Resolution:
    """What the frontend answers: the output, whether it is the application's default, and why."""

    output: Any
    default: bool
    low_confidence: bool
    explanation: str | None = None


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_score(value: Any) -> bool:
    return isinstance(value, float)


def _vote_key(value: Any) -> Any:
    """A hashable stand-in for an output, so that lists and dicts can be voted on too."""
    if isinstance(value, list | tuple):
        return ("seq", tuple(_vote_key(v) for v in value))
    if isinstance(value, dict):
        return ("map", tuple(sorted((str(k), _vote_key(v)) for k, v in value.items())))
    return value


def loss(output: Any, label: Any, scale: float = 1.0) -> float:
    """The loss of ``output`` given the true ``label``, in [0, 1] (see the module docstring). ``scale``: for scores,
    the absolute error that is a whole loss (the application's ``loss_scale``)."""
    if _real(output) and _real(label) and (_is_score(output) or _is_score(label)):
        try:
            error = abs(float(output) - float(label)) / scale
        except OverflowError:  # an integer beyond a double's range (JSON has no bound): as far off as can be
            return 1.0
        return min(1.0, error) if math.isfinite(error) else 1.0
    return 0.0 if _vote_key(output) == _vote_key(label) else 1.0


def combine_outputs(
    weights: Mapping[str, float],
    selected: Sequence[str],
    outputs: Mapping[str, Any],
    missing: Set[str] = frozenset(),
    tolerance: float = 0.1,
) -> Combined:
    """Combine the outputs of the ``selected`` models that replied, weighting each by ``weights``.

    Models in ``missing``, selected models absent from ``outputs`` and non-finite scores are reported as
    missing; outputs of models that were not selected are ignored.
    """
    if len(selected) == 1:  # the common query (one model): the same arithmetic without the general bookkeeping
        return _combine_one(weights, selected[0], outputs, missing)
    return _combine_many(weights, selected, outputs, missing, tolerance)


def _combine_many(
    weights: Mapping[str, float],
    selected: Sequence[str],
    outputs: Mapping[str, Any],
    missing: Set[str],
    tolerance: float,
) -> Combined:
    replied = [m for m in selected if m in outputs and m not in missing]
    replied = [m for m in replied if not (isinstance(outputs[m], float) and not math.isfinite(outputs[m]))]
    absent = tuple(m for m in selected if m not in replied)
    total = math.fsum(max(weights.get(m, 0.0), 0.0) for m in selected)
    if not replied or total <= 0:
        return Combined(None, 0.0, (), absent)
    values = [outputs[m] for m in replied]
    w = [max(weights.get(m, 0.0), 0.0) for m in replied]
    if all(_real(v) for v in values) and any(_is_score(v) for v in values):
        arrived = math.fsum(w)
        if len(values) == 1:  # the mean of one score is that score, exactly ((w * v) / w can be 1 ulp off)
            output: Any = float(values[0])
        elif arrived > 0:
            output = math.fsum(wi * float(v) for wi, v in zip(w, values, strict=True)) / arrived
        else:
            output = math.fsum(float(v) for v in values) / len(values)
        agree = math.fsum(wi for wi, v in zip(w, values, strict=True) if abs(float(v) - output) <= tolerance)
    else:
        tally: dict[Any, float] = {}
        first: dict[Any, Any] = {}
        for wi, v in zip(w, values, strict=True):
            key = _vote_key(v)
            tally[key] = tally.get(key, 0.0) + wi
            first.setdefault(key, v)
        # the first of the most voted, in selection order (dicts keep insertion order; max keeps the first of
        # equals); a NaN weight (a corrupt state) must not leave no winner: it answers, with no confidence
        winner = max(tally, key=tally.__getitem__)
        output, agree = first[winner], tally[winner]
    confidence = min(1.0, max(0.0, agree / total))
    return Combined(output, confidence, tuple(replied), absent)


def _combine_one(weights: Mapping[str, float], model: str, outputs: Mapping[str, Any], missing: Set[str]) -> Combined:
    """``combine_outputs`` for one selected model, step for step (a sum of one term is that term)."""
    weight = max(weights.get(model, 0.0), 0.0)
    value = outputs.get(model, _ABSENT) if model not in missing else _ABSENT
    if value is _ABSENT or (isinstance(value, float) and not math.isfinite(value)):
        return Combined(None, 0.0, (), (model,))
    if weight <= 0:
        return Combined(None, 0.0, (), ())
    # a score or a class: the mean of one score is that score, and it agrees with itself, so the confidence is
    # its weight over itself: 1, or 0 for an infinite or NaN weight (inf / inf), as _combine_many computes it
    return Combined(value, 1.0 if math.isfinite(weight) else 0.0, (model,), ())


_ABSENT = object()


def resolve(
    combined: Combined,
    default_output: Any,
    threshold: float = 0.0,
    default_when_unsure: bool = False,
) -> Resolution:
    """Turn a combined answer into the response: the default output when no model replied; when the
    confidence is under ``threshold``, say so, and answer the default output if the app asks for it."""
    if not combined.answered:
        why = "no model replied in time"
        if combined.missing:
            why += f" (missing: {', '.join(combined.missing)})"
        return Resolution(default_output, True, True, why)
    if combined.confidence < threshold:
        why = f"confidence {combined.confidence:.3f} is under the application's threshold {threshold:g}"
        if combined.missing:
            why += f" (missing: {', '.join(combined.missing)})"
        if default_when_unsure:
            return Resolution(default_output, True, True, why)
        return Resolution(combined.output, False, True, why)
    return Resolution(combined.output, False, False)


__all__ = ["Combined", "Resolution", "combine_outputs", "loss", "resolve"]
