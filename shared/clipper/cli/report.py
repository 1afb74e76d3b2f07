"""``clipper report APP``: an application's live selection quality (``GET /admin/apps/{app}/report``) as a short
table, with every figure in ``report.json`` and the curves in ``report.png`` under ``--out``. ``clipper selection
APP [--uid U]``: the bandit state its next query is drawn with (``GET /admin/apps/{app}/selection``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from clipper.client import ClipperConnection
from clipper.report.plot import write_png


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = sub.add_parser("report", help="an application's live selection quality from predictions and feedback")
    r.add_argument("app")
    r.add_argument("--since", help="epoch seconds, ISO 8601, or an age: 24h, 7d (default 7d)")
    r.add_argument("--until", help="as --since (default now)")
    r.add_argument("--window", type=int, help="feedbacks per point of the loss over time (default: ~20 points)")
    r.add_argument("--out", default=".", help="folder of report.json and report.png (default: here)")


def add_selection_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = sub.add_parser("selection", help="the bandit state an application's (or a user's) next query is drawn with")
    r.add_argument("app")
    r.add_argument("--uid", help="a user's state (the uid its queries and feedback carry)")
    r.add_argument("--json", action="store_true", help="the whole answer as JSON")


def run_selection(args: argparse.Namespace, conn: ClipperConnection) -> int:
    state = conn.get_selection_state(args.app, uid=args.uid)
    print(json.dumps(state, indent=2) if args.json else selection_table(state))
    return 0


def selection_table(state: dict[str, Any]) -> str:
    who = f"user {state['user_id']}" if state.get("user_id") is not None else "the application"
    source = {
        "user": "the user's own state",
        "application": "the application's state" + (" (the user has none of its own yet)" if state["user_id"] else ""),
        "initial": "nothing learned yet: every model weighs the same",
    }[state["learned_from"]]
    lines = [
        f"{state['app']} ({state['policy']}), {who}: {source}; {state['updates']} "
        + ("update" if state["updates"] == 1 else "updates"),
        "",
        f"{'model':<20} {'weight':>8} {'drawn':>8} {'judged':>7} {'mean loss':>10}  version",
    ]
    for m in state["models"]:
        drawn = _f(m.get("probability")) if "probability" in m else "-"
        lines.append(
            f"{m['model']:<20} {m['weight']:>8.3f} {drawn:>8} {m['judged']:>7} {_f(m['mean_loss']):>10}  "
            f"{m.get('version') or '-'}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, conn: ClipperConnection) -> int:
    report = conn.get_report(args.app, since=args.since, until=args.until, window=args.window)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"\nwrote {out / 'report.json'}")
    try:
        print(f"wrote {write_png(report, out / 'report.png')}")
    except ImportError:
        print("report.png not written: it needs matplotlib (pip install 'clipper-serverless[report]')")
    return 0


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['app']} ({report.get('policy')}): {report['feedbacks']} feedbacks from {report['since_iso']} "
        f"to {report['until_iso']}" + (" (the newest only: more were logged)" if report.get("truncated") else ""),
        "",
        f"{'model':<20} {'answers':>8} {'mean loss':>10}  versions (answers, mean loss)",
    ]
    for name, m in report["models"].items():
        versions = ", ".join(f"{v}: {x['answers']}, {_f(x['mean_loss'])}" for v, x in m["versions"].items())
        lines.append(f"{name:<20} {m['answers']:>8} {_f(m['mean_loss']):>10}  {versions}")
    a = report["answers"]
    lines.append(f"{'(answers)':<20} {a['judged']:>8} {_f(a['mean_loss']):>10}  defaults: {a['defaults']}")
    r = report["exp3_regret"]
    if r["feedbacks"]:
        lines += [
            "",
            f"exp3 regret vs the best model in hindsight ({r['best_model']}): {_f(r['regret'], 1)} over "
            f"{r['feedbacks']} feedbacks ({_f(r['regret'] / r['feedbacks'])} each; importance-weighted; "
            f"empirical means: {_f(r['empirical'], 1)})",
        ]
    c = report["exp4_calibration"]
    if c["judged"]:
        lines += ["", f"exp4 error {_f(c['error'])} (best member {c['best_member']}: "
                  f"{_f(c['member_loss'].get(c['best_member']))}); by confidence:"]  # fmt: skip
        for b in c["buckets"]:
            if b["feedbacks"]:
                lines.append(
                    f"  [{b['low']:.1f}, {b['high']:.1f}{']' if b['high'] >= 1 else ')'}  {b['judged']:>6} judged  "
                    f"error {_f(b['error'])}  defaults {b['defaults']}"
                )
    skipped = report.get("skipped") or {}
    if skipped:
        counts = ", ".join(f"{why} {n}" for why, n in skipped.items())
        lines += ["", f"not learned (on the days the range touches): {sum(skipped.values())}: {counts}"]
    for model, canary in report.get("canary", {}).items():
        for ev in canary["events"]:
            lines.append(f"canary {model}: " + ", ".join(f"{k}={v}" for k, v in ev.items() if not isinstance(v, dict)))
    return "\n".join(lines)
