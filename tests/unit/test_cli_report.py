"""``clipper report``'s output: the table, report.json, and report.png or why not."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from clipper.cli.report import run
from tests.unit.test_selection_report import drawn, ensemble

pytestmark = pytest.mark.unit


class Conn:
    def __init__(self, report):
        self.report = report
        self.asked = None

    def get_report(self, app, since=None, until=None, window=None):
        self.asked = (app, since, until, window)
        return self.report


def report():
    from clipper.report.figures import selection_report

    entries = drawn(200, 0.5, {"a": 0.0, "b": 1.0}) + [ensemble(1000 + t, 0.65, wrong=t < 3) for t in range(10)]
    head = {"app": "digits", "policy": "exp3", "since_iso": "s", "until_iso": "u", "truncated": False}
    return head | selection_report(entries, canary_events={"b": [{"decision": "rollback", "version": "2"}]})


def args(tmp_path):
    return argparse.Namespace(app="digits", since="1d", until=None, window=5, out=str(tmp_path / "r"))


def test_the_table_the_json_and_the_png(tmp_path, capsys):
    conn = Conn(report())
    assert run(args(tmp_path), conn) == 0
    assert conn.asked == ("digits", "1d", None, 5)
    out = capsys.readouterr().out
    b_answers = conn.report["models"]["b"]["answers"]
    assert f"exp3 regret vs the best model in hindsight (a): {b_answers:.1f} over 200 feedbacks" in out
    assert "[0.6, 0.7)      10 judged  error 0.300" in out and "canary b: decision=rollback, version=2" in out
    assert json.loads((tmp_path / "r" / "report.json").read_text()) == conn.report
    assert (tmp_path / "r" / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_without_matplotlib_the_json_is_written_and_the_png_is_explained(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert run(args(tmp_path), Conn(report())) == 0
    assert "report.png not written: it needs matplotlib" in capsys.readouterr().out
    assert (tmp_path / "r" / "report.json").exists() and not (tmp_path / "r" / "report.png").exists()
