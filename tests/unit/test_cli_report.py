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


def _titles(report):
    import matplotlib.pyplot as plt

    from clipper.report.plot import draw

    fig = draw(report)
    try:
        return [ax.get_title() for ax in fig.axes], [t.get_text() for ax in fig.axes for t in ax.texts]
    finally:
        plt.close(fig)


def test_the_png_draws_only_the_panels_the_report_has_data_for(tmp_path, capsys):
    """An Exp3 application's PNG had an empty "Exp4 error by confidence" panel (with its calibration line, as if
    there were something to compare), an Exp4 one's an empty regret panel."""
    from clipper.report.figures import selection_report

    head = {"since_iso": "s", "until_iso": "u", "truncated": False}
    exp3 = head | {"app": "digits-exp3", "policy": "exp3"} | selection_report(drawn(100, 0.5, {"a": 0.0, "b": 1.0}))
    entries = [ensemble(1000 + t, 0.65, wrong=t < 3) for t in range(10)]
    exp4 = head | {"app": "digits-exp4", "policy": "exp4"} | selection_report(entries)
    assert _titles(exp3)[0] == ["Loss per window of 5 feedbacks", "Exp3 regret vs the best model (a)"]
    assert _titles(exp4)[0] == ["Loss per window of 1 feedbacks", "Exp4 error by confidence"]
    assert len(_titles(report())[0]) == 3  # both kinds of feedback in the range: every panel
    assert _titles({"app": "new"} | selection_report([])) == (
        ["Loss per window of 1 feedbacks"],
        ["no feedback in the range"],
    )
    # what `clipper report` writes: two panels wide, not three
    assert run(args(tmp_path), Conn(exp3)) == 0
    png = (tmp_path / "r" / "report.png").read_bytes()
    assert int.from_bytes(png[16:20], "big") == 1080  # the IHDR width: 2 panels of 5.4 in at 100 dpi
