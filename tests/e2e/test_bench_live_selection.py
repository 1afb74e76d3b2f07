"""`make bench-live-selection` on the real local stack at its --quick size (40 queries per experiment, about
30 s): every query is answered by the models (no default, no error), every one left the record its feedback
joins with, the models' recorded outputs are the offline predictions for the same inputs, the broken version
answered exactly from the fault's query on (and not before), and the JSON and PNG are written. No timing and
no accuracy is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.live_selection.config import EXPERIMENTS, QUICK, ROOT

pytestmark = pytest.mark.e2e


def test_a_quick_live_selection_run_matches_its_replay_query_by_query(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.live_selection", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "live_selection_quick.json").read_text())
    assert set(result["experiments"]) == {e.name for e in EXPERIMENTS}
    n = QUICK.passes * QUICK.rows
    for name, r in result["experiments"].items():
        live = r["live"]
        assert live["queries"] == n, name
        assert (live["defaults"], live["non_200"], live["feedback_non_200"], live["missing_records"]) == (0, 0, 0, 0)
        assert (r["output_mismatches"], r["version_mismatches"]) == (0, 0), name  # mlp:2 answered from the fault on
        assert r["instant"]["windows"] == r["as_seen"]["windows"] == n // QUICK.window
        assert 0 <= r["instant"]["live_accuracy"] <= 1
    assert result["experiments"]["fault-exp4"]["fault_at"] == n // 2
    assert result["experiments"]["fault-exp4"]["switch"]["to_broken_s"] > 0
    assert (tmp_path / "live_selection_quick.png").stat().st_size > 0
