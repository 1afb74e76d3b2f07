"""What users got from each version of a model with a running canary: queries, endpoint errors and SLO misses,
counted at the frontend and added to the trial's evidence (``CanaryEvidenceStore``) off the query path.

Per query and model (``ModelAnswer``) answered in a canary trial: one query for the version that was asked; an
error when that model replied with an error (or cannot be asked: no serving resources); an SLO miss when it gave no
reply by the deadline (or its batcher dropped the query as expired). A failure of the frontend's own dependencies
(the queue, the reply channel, the cache) says nothing about the version and is not counted, nor is a row another
query computed (that query counts it). One count per query and model, whatever its batch size.

The trial is the one the query's choice was made in (``Choice.trials``, from the same registry copy that routed it
to the canary or to the active version): counting starts with the trial's first query, and a query of a trial that
has ended since counts in that trial, never in the next. The query path pays one test of an empty map when no
canary runs. A background thread flushes the counts, at most once a second; a failed flush keeps them for the next
and logs. On Lambda the thread is frozen between invocations: counts wait for the next one, and a container that is
never invoked again loses its last second of counts (evidence is a sample: the decision stays sound on fewer
queries). A flush whose write succeeds but whose answer is lost is counted again by the next one (at most one
second of one container's counts).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping

from clipper.canary.evidence import VersionEvidence
from clipper.frontend.results import UNCHARGED, ModelAnswer
from clipper.ports import CanaryEvidenceStore

logger = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (model, trial, version)


class CanaryTally:
    def __init__(self, store: CanaryEvidenceStore, every_s: float = 1.0) -> None:
        self._store = store
        self._every = every_s
        self._counts: dict[Key, list[int]] = {}  # [queries, errors, slo_misses]
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- the query path -----------------------------------------------------------------------------------
    def count(self, answers: Iterable[ModelAnswer], trials: Mapping[str, str]) -> None:
        """Count one query's outcome per model answered in a canary trial (``trials``: model -> trial, the
        query's choice's)."""
        if not trials:
            return  # the common case: no canary
        for a in answers:
            name = a.model.name
            trial = trials.get(name)
            failure = a.failure
            if trial is None or failure in UNCHARGED:
                continue
            key = (name, trial, a.model.version)
            with self._lock:
                c = self._counts.get(key)
                if c is None:
                    c = self._counts[key] = [0, 0, 0]
                c[0] += 1
                c[1] += failure == "error"
                c[2] += failure == "timeout"

    # -- off the query path ---------------------------------------------------------------------------------
    def flush(self) -> None:
        """Add the counts to the evidence store; what fails to be added is kept for the next flush."""
        with self._lock:
            counts, self._counts = self._counts, {}
        failed: dict[Key, list[int]] = {}
        for key, (queries, errors, misses) in counts.items():
            model, trial, version = key
            try:
                delta = VersionEvidence(queries=queries, errors=errors, slo_misses=misses)
                self._store.add(model, trial, version, delta)
            except Exception as e:
                logger.warning("canary evidence of %s:%s not added (kept for the next flush): %s", model, version, e)
                failed[key] = [queries, errors, misses]
        if failed:
            with self._lock:
                for key, c in failed.items():
                    kept = self._counts.setdefault(key, [0, 0, 0])
                    for i in range(3):
                        kept[i] += c[i]

    def start(self) -> None:
        """The background thread: ``flush`` every ``every_s`` (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="clipper-canary-tally", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.flush()
            except Exception:  # a bug: logged, and the next second tries again
                logger.exception("canary tally failed")

    def stop(self) -> None:
        """Stop the thread and flush what is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()
