"""One applied feedback, joined with the prediction it is about: what the feedback log keeps and the report
reads.

Built from the frontend's prediction record (``clipper.frontend.query``'s ``_record``: the selection, each
model's output and answering version, and the answer the query got) and the feedback's label. Each model's
loss is ``clipper.selection.combining.loss`` of its own output; the answer's loss is judged only when the
answer was the models' (not the application's default output).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clipper.selection.combining import loss


@dataclass(frozen=True)
class FeedbackEntry:
    time: float  # seconds since the epoch, when the feedback was applied
    feedback_id: str
    app: str
    user: str | None
    label: Any
    policy: str
    models: tuple[str, ...]  # the models the selection asked, in order
    probabilities: Mapping[str, float] = field(default_factory=dict)  # what the selection drew with
    outputs: Mapping[str, Any] = field(default_factory=dict)  # each answering model's output
    losses: Mapping[str, float] = field(default_factory=dict)  # each answering model's loss against the label
    versions: Mapping[str, str] = field(default_factory=dict)  # the version that answered for each model
    answer: Any = None  # what the query answered (None: not recorded)
    default: bool = False  # the answer was the application's default output
    confidence: float | None = None  # the ensemble's confidence (several models asked), else None
    answer_loss: float | None = None  # the loss of the answer; None when it was the default or not recorded
    # the application's incarnation the feedback was learned for (``Application.incarnation``; 0: not recorded):
    # an application deleted and added again under its name is another one, and its report leaves the old one's out
    incarnation: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "feedback_id": self.feedback_id,
            "app": self.app,
            "user": self.user,
            "label": self.label,
            "policy": self.policy,
            "models": list(self.models),
            "probabilities": dict(self.probabilities),
            "outputs": dict(self.outputs),
            "losses": dict(self.losses),
            "versions": dict(self.versions),
            "answer": self.answer,
            "default": self.default,
            "confidence": self.confidence,
            "answer_loss": self.answer_loss,
            "incarnation": self.incarnation,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FeedbackEntry:
        try:
            return cls(
                time=float(d["time"]),
                feedback_id=str(d["feedback_id"]),
                app=str(d["app"]),
                user=None if d.get("user") is None else str(d["user"]),
                label=d.get("label"),
                policy=str(d["policy"]),
                models=tuple(str(m) for m in d.get("models", ())),
                probabilities={str(m): float(p) for m, p in dict(d.get("probabilities") or {}).items()},
                outputs=dict(d.get("outputs") or {}),
                losses={str(m): float(x) for m, x in dict(d.get("losses") or {}).items()},
                versions={str(m): str(v) for m, v in dict(d.get("versions") or {}).items()},
                answer=d.get("answer"),
                default=bool(d.get("default", False)),
                confidence=None if d.get("confidence") is None else float(d["confidence"]),
                answer_loss=None if d.get("answer_loss") is None else float(d["answer_loss"]),
                incarnation=int(d.get("incarnation") or 0),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"corrupt feedback log entry: {e!r}") from e


def entry_for(
    time: float,
    feedback_id: str,
    app: str,
    user: str | None,
    label: Any,
    record: Mapping[str, Any],
    scale: float = 1.0,
    incarnation: int = 0,
) -> FeedbackEntry:
    """The entry of a feedback applied at ``time``, from the prediction ``record`` it was joined with; scores are
    judged with the application's loss ``scale``; ``incarnation``: the application's it was learned for."""
    selection = record["selection"]
    outputs: dict[str, Any] = dict(record.get("outputs") or {})
    answer = record.get("answer") or {}
    default = bool(answer.get("default", False))
    answered = "output" in answer
    return FeedbackEntry(
        time=time,
        feedback_id=feedback_id,
        app=app,
        user=user,
        label=label,
        policy=str(selection["policy"]),
        models=tuple(str(m) for m in selection["models"]),
        probabilities={str(m): float(p) for m, p in selection.get("probabilities", [])},
        outputs=outputs,
        # a model asked that gave no output (its own timeout or error) lost 1, as the bandit counts it
        losses={m: loss(o, label, scale) for m, o in outputs.items()}
        | {str(m): 1.0 for m in record.get("missing") or () if m not in outputs},
        versions={str(m): str(v) for m, v in dict(record.get("versions") or {}).items()},
        answer=answer.get("output"),
        default=default,
        confidence=None if answer.get("confidence") is None else float(answer["confidence"]),
        answer_loss=loss(answer["output"], label, scale) if answered and not default else None,
        incarnation=incarnation,
    )
