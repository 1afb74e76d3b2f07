"""Feedback (Clipper's ``POST /<app>/update``): accepted quickly into a durable queue, then joined with
the predictions recorded for that input and applied to the bandit state.

The join: the frontend records, per (app, user, input), the selection and each model's output (in the
prediction cache). Feedback for an input with no recorded prediction (never queried, or its record
expired or was evicted) is skipped and counted: it says nothing about the models that were not asked. So is
feedback for an application deleted since the feedback was accepted.

The process that runs this locally is ``clipper.entrypoints.feedback_worker``; on AWS, ``functions/feedback``.

Updates are concurrency-safe and idempotent: each is a conditional write on the version read, retried on
conflict, with the feedback id marked in the same transaction, so a redelivered message changes nothing
and no concurrent update is lost. A per-user update also updates the app-wide state, from which new
users start: the user's state is written first, so a new user's state is a copy of the app-wide state
*before* this feedback, and the feedback moves it once (written after, the copy would already hold it and
the feedback would move the user's weights twice).

A model with a running canary (``Registry.canary``) learns from feedback whatever the application's policy (a
single-model application too): the loss of each output recorded for a model whose answering version (the
record's ``versions``; older records have none and are skipped) is the canary's or the active one is added to
the trial's evidence for that version (``clipper.canary``), once per feedback id (``add_once``: a redelivered
message counts nothing). Losses are ``clipper.selection.combining.loss``'s, already in [0, 1] (0/1 for classes,
the absolute error capped at 1 for scores); they are clipped to [0, 1] again so no output can corrupt the counts.
The models whose evidence grew are kept in ``touched`` until ``take_touched``, so the caller can review them.

``receiving`` is the frontend's side (validation, the queue message), ``processing`` the worker's.
"""

from clipper.feedback.processing import FeedbackProcessor, Outcome
from clipper.feedback.receiving import (
    MAX_LABEL_BYTES,
    MAX_MESSAGE_BYTES,
    FeedbackMessage,
    FeedbackNotQueued,
    FeedbackReceiver,
    validate_label,
)

__all__ = [
    "MAX_LABEL_BYTES",
    "MAX_MESSAGE_BYTES",
    "FeedbackMessage",
    "FeedbackNotQueued",
    "FeedbackProcessor",
    "FeedbackReceiver",
    "Outcome",
    "validate_label",
]
