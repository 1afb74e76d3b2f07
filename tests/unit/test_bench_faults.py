"""The fault suite's counting: kinds, causes, the time to recover, and what misses the targets."""

from __future__ import annotations

import numpy as np
import pytest

from bench.faults.load import Outcome
from bench.faults.report import recovery, summarize, table, verdict
from bench.faults.truth import wrong_answers

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
    whole = "model mlp:1: timeout, no reply within the SLO of 100 ms (waited 100 ms)"
    assert row["default_examples"]["model mlp:1: timeout, no reply within the SLO of 100 ms"] == [
        f"{t:.2f} s, 5.0 ms: {whole}" for t in (0.75, 1.0, 1.25)
    ]
    assert verdict({**row, "scenario": "s"}) == ["1 lost", "1 answered 5xx", "1 defaults without a cause"]
    assert "| s |" in table([{**row, "scenario": "s"}])


def test_recovery_is_the_first_moment_after_the_fault_from_which_every_answer_is_real():
    # fault ends at 1.0 s; answers after it: d at 1.0, r at 1.25, d at 1.5, then real for good from 1.75
    outcomes = run("rrrr" + "drd" + "r" * 16)
    assert recovery(outcomes, fault_end=1.0) == 0.75
    assert recovery(run("rrrr" + "d" * 10), fault_end=1.0) is None  # never recovered before the load stopped


def test_a_scenarios_own_checks_wrong_answers_and_unexpected_defaults_miss_the_targets():
    row = summarize(run("rrdr"), fault_start=0.25, fault_end=0.5, wrong=2)
    row["checks"] = {"every poison message dead-lettered": False, "memory bounded": True}
    assert verdict(row) == [
        "2 wrong answers (not the model's output for their input)",
        "failed: every poison message dead-lettered",
    ]
    assert verdict(row, all_real=True)[1] == "1 defaults where every query should have had its model's answer"
    assert verdict(summarize(run("rrrr"), 0.25, 0.5), all_real=True) == []


def test_the_table_names_every_cause_with_its_count():
    row = {**summarize(run("rdd" + "r" * 12), 0.25, 0.75), "scenario": "s"}
    line = table([row]).splitlines()[-1]
    assert "| 15 | 13 | 2 | 0 | 0 | 0 | 0 |" in line
    assert line.endswith("| model mlp:1: timeout, no reply within the SLO of 100 ms (2) |")


def test_wrong_answers_are_real_answers_unlike_the_models_own_where_it_is_sure():
    def labels(rows):
        # the "model": label = pixel 1; sure unless pixel 2 is set
        return rows[:, 1].astype(np.int64), np.where(rows[:, 2] > 0, 0.0, 0.5)

    rows = {1: [0, 3, 0], 2: [0, 4, 0], 3: [0, 5, 1], 4: [0, 6, 0], 5: [0, 7, 0]}

    def out(serial, output, kind="real"):
        return Outcome(serial * 0.1, 3.0, kind, "", serial, output)

    outcomes = [
        out(1, 3),  # right
        out(2, 7),  # another query's label: wrong
        out(3, 9),  # differs, but the model is not sure of its own label (a near-tie): not counted
        out(4, [6]),  # not a label at all: wrong
        out(5, None, "default"),  # a default is not an answer of the model
        Outcome(0.6, 3.0, "real", "", -1, 1),  # not a steady-load query
    ]
    wrong = wrong_answers(outcomes, lambda s: np.array(rows[s], dtype=np.float32), labels)
    assert [o.serial for o in wrong] == [2, 4]
    assert wrong_answers([], lambda s: np.zeros(3), labels) == []


def test_the_reference_gives_the_demo_mlps_labels(demo_models):
    from pathlib import Path

    from bench.faults.truth import Reference

    out = Path(demo_models["out_dir"])
    holdout = np.load(out / demo_models["dataset"]["holdout"])
    labels, margins = Reference(out / "mlp" / "1" / "model.onnx").labels(holdout["X"][:200].astype(np.float32))
    assert labels.shape == margins.shape == (200,) and np.all(margins >= 0)
    assert np.mean(labels == holdout["y"][:200]) > 0.9


def test_a_batchers_consumer_is_known_by_its_pid():
    from bench.faults.streams import _of_pid

    assert _of_pid(b"host-1:4242:9f3a11bc", 4242)
    assert not _of_pid("host-1:42420:9f3a11bc", 4242) and not _of_pid("depth", 4242)


def test_answers_later_than_the_slo_and_a_margin_are_late():
    outcomes = [
        Outcome(i * 0.1, ms, kind, "c")
        for i, (ms, kind) in enumerate(
            [(50.0, "real"), (150.0, "default"), (250.0, "default"), (99.0, "real"), (9000.0, "lost"), (300.0, "4xx")]
        )
    ]
    row = summarize(outcomes, 0.0, 0.1, slo_ms=100.0)
    assert (row["late"], row["slowest_answer_ms"]) == (1, 250.0)  # a lost query or a 4xx is no answer
    assert "1 answers later than the SLO + 100 ms (the slowest 250 ms)" in verdict(row)
    assert summarize(outcomes, 0.0, 0.1)["late"] == 0  # no SLO given: not judged


def test_the_run_exits_1_when_a_scenario_misses_a_target_and_0_when_none_does(monkeypatch, tmp_path):
    """Its report is written either way; the exit status is what a script running it sees."""
    import bench.faults.__main__ as faults
    from bench.faults.scenarios import SCENARIOS

    class Inert:  # the stack, its world and the reference model: nothing runs
        def __init__(self, *args, **kwargs) -> None:
            pass

        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    for name in ("LocalStack", "World", "Reference"):
        monkeypatch.setattr(faults, name, Inert)
    monkeypatch.setattr(faults, "base_rows", lambda case: None)
    monkeypatch.setattr(faults, "settle_redeliveries", lambda *args: None)
    monkeypatch.setattr(faults.time, "sleep", lambda s: None)
    monkeypatch.setattr(faults.report, "plot", lambda runs, path: path.write_bytes(b"png"))
    scenario = next(iter(SCENARIOS))
    for kinds, status in (("rrrr", 0), ("rrxr", 1)):
        row = summarize(run(kinds), fault_start=0.25, fault_end=0.5)
        row.update(scenario=scenario, last_serial=4, outcomes=[], fault_start=0.25, fault_end=0.5)
        row["misses_targets"] = verdict(row)
        monkeypatch.setattr(faults, "run_scenario", lambda *args, row=row: row)
        assert faults.main(["--scenarios", scenario, "--out", str(tmp_path)]) == status
        assert (tmp_path / "faults.json").exists() and (tmp_path / "faults.png").exists()
