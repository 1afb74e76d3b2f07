"""The fault suite's counting: kinds, causes, the time to recover, and what misses the targets."""

from __future__ import annotations

import pytest

from bench.faults.load import Outcome
from bench.faults.report import recovery, summarize, table, verdict

pytestmark = pytest.mark.unit


def run(kinds: str, step: float = 0.25) -> list[Outcome]:
    """One outcome per character, every ``step`` s: r real, d default (with a cause), D without, 5, x lost."""
    kind = {"r": "real", "d": "default", "D": "default", "5": "5xx", "x": "lost", "4": "4xx"}
    cause = {"d": "model mlp:1: timeout, no reply within the SLO of 100 ms (waited 100 ms)"}
    return [Outcome(i * step, 5.0, kind[c], cause.get(c, "")) for i, c in enumerate(kinds)]


def test_counts_and_causes():
    row = summarize(run("rrrdddDr5x" + "r" * 20), fault_start=0.75, fault_end=1.5)
    assert (row["sent"], row["real"], row["default"], row["5xx"], row["lost"]) == (30, 24, 4, 1, 1)
    assert row["default_causes"] == {"model mlp:1: timeout, no reply within the SLO of 100 ms": 3, "": 1}
    assert row["defaults_without_cause"] == 1
    assert verdict({**row, "scenario": "s"}) == ["1 lost", "1 answered 5xx", "1 defaults without a cause"]
    assert "| s |" in table([{**row, "scenario": "s"}])


def test_recovery_is_the_first_moment_after_the_fault_from_which_every_answer_is_real():
    # fault ends at 1.0 s; answers after it: d at 1.0, r at 1.25, d at 1.5, then real for good from 1.75
    outcomes = run("rrrr" + "drd" + "r" * 16)
    assert recovery(outcomes, fault_end=1.0) == 0.75
    assert recovery(run("rrrr" + "d" * 10), fault_end=1.0) is None  # never recovered before the load stopped
