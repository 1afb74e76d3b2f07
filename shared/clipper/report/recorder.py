"""Appends each applied feedback to the feedback log, from the feedback processor, without ever failing it: the
log serves the selection report, the bandit state is what matters, so a failed append is logged and counted, and
the feedback is neither failed nor retried for it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from clipper.report.entry import entry_for

if TYPE_CHECKING:
    from clipper.feedback import FeedbackMessage
    from clipper.ports import Clock, FeedbackLog

logger = logging.getLogger(__name__)


class FeedbackRecorder:
    def __init__(self, log: FeedbackLog, clock: Clock) -> None:
        self._log = log
        self._clock = clock
        self.appended = 0
        self.failures = 0

    def record(
        self, message: FeedbackMessage, record: Mapping[str, Any], scale: float = 1.0, incarnation: int = 0
    ) -> None:
        """Append the entry of ``message``, applied now, joined with its prediction ``record`` (``scale``: the
        application's loss scale, as the bandit judged the outputs with it; ``incarnation``: the application's)."""
        try:
            entry = entry_for(
                self._clock.now(),
                message.feedback_id,
                message.app,
                message.user,
                message.label,
                record,
                scale,
                incarnation,
            )
            self._log.append(entry)
        except Exception as e:  # a failing log never fails the feedback (the state is updated already)
            self.failures += 1
            logger.warning(
                "feedback not logged for the selection report: %s",
                e,
                extra={"app": message.app, "feedback_id": message.feedback_id, "log_failures": self.failures},
            )
            return
        self.appended += 1

    def skipped(self, message: FeedbackMessage, outcome: str) -> None:
        """Count ``message`` as not learned, for ``outcome``; as ``record``, never failing the feedback."""
        try:
            self._log.count_skipped(message.app, outcome, self._clock.now(), message.feedback_id)
        except Exception as e:
            self.failures += 1
            logger.warning(
                "feedback not counted as %s for the selection report: %s",
                outcome,
                e,
                extra={"app": message.app, "feedback_id": message.feedback_id, "log_failures": self.failures},
            )
