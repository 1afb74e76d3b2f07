"""`make bench-faults` on the real local stack, one scenario, --quick: the model server behind the fault proxy
answers 500 for a while; every query is answered (a default naming the endpoint's error during the fault), none
is lost or a 5xx, every real answer is the model's own label for its input, and the JSON and PNG are written.
About 30 s. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.frontdoor.config import ROOT

pytestmark = pytest.mark.e2e


def test_a_quick_fault_run_counts_every_query(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.faults", "--quick", "--scenarios", "model-server-500", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    result = json.loads((tmp_path / "faults_quick.json").read_text())
    (row,) = result["scenarios"]
    # its exit status says whether a target was missed (a late answer on a slow machine is one: timing)
    assert done.returncode == (1 if row["misses_targets"] else 0), done.stdout[-3000:] + done.stderr[-3000:]
    assert row["sent"] == row["real"] + row["default"] + row["4xx"] + row["5xx"] + row["lost"] > 50
    assert (row["lost"], row["5xx"], row["defaults_without_cause"], row["wrong"]) == (0, 0, 0, 0)
    assert row["real"] > 0 and row["restarts"] == {}  # (misses_targets also counts late answers: timing)
    assert row["default"] > 0 and all("endpoint answered 500" in c for c in row["default_causes"])
    assert row["recovery_s"] is not None
    assert (tmp_path / "faults_quick.png").stat().st_size > 0
