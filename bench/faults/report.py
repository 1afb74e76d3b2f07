"""Counts per scenario, the time to recover, a table and a timeline plot."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from bench.faults.load import Outcome
from bench.frontdoor.stats import cause_of

KINDS = ("real", "default", "4xx", "5xx", "lost")
SETTLE_S = 2.0  # recovered: every query sent in the next SETTLE_S seconds was answered by a model
BIN_S = 0.25  # the timeline's bars
LATE_MARGIN_MS = 100.0  # an answer later than the SLO by more than this is late (a default is due at the SLO)


def summarize(
    outcomes: list[Outcome], fault_start: float, fault_end: float, wrong: int = 0, slo_ms: float | None = None
) -> dict[str, Any]:
    """The counts of one scenario's steady load; ``wrong``: how many of its real answers were not the model's
    answer to their input (``bench.faults.truth``); with ``slo_ms``, how many answers came later than the SLO
    by more than ``LATE_MARGIN_MS``."""
    counts = Counter(o.kind for o in outcomes)
    answered = [o.latency_ms for o in outcomes if o.kind in ("real", "default")]
    late = 0 if slo_ms is None else sum(1 for ms in answered if ms > slo_ms + LATE_MARGIN_MS)
    grouped = [(cause_of(o.cause), o) for o in outcomes if o.kind == "default"]
    causes = Counter(cause for cause, _ in grouped)
    examples: dict[str, list[str]] = {}
    for cause, o in grouped:  # a few whole texts per cause: the part the grouping drops is often the reason
        if len(seen := examples.setdefault(cause, [])) < 3:
            seen.append(f"{o.sent_s:.2f} s, {o.latency_ms:.1f} ms: {o.cause[:300]}")
    return {
        "sent": len(outcomes),
        **{k: counts.get(k, 0) for k in KINDS},
        "wrong": wrong,
        "late": late,
        "slowest_answer_ms": round(max(answered), 1) if answered else None,
        "defaults_without_cause": sum(1 for o in outcomes if o.kind == "default" and not o.cause),
        "default_causes": dict(causes.most_common()),
        "default_examples": examples,
        "fault_s": round(fault_end - fault_start, 2),
        "recovery_s": recovery(outcomes, fault_end),
    }


def recovery(outcomes: list[Outcome], fault_end: float) -> float | None:
    """Seconds from the fault's end until every query sent in the following SETTLE_S was a real answer; None
    when that never happened before the load stopped."""
    after = [o for o in outcomes if o.sent_s >= fault_end]
    if not after:
        return None
    last = after[-1].sent_s
    for i, o in enumerate(after):
        if o.kind != "real":
            continue
        window = [x for x in after[i:] if x.sent_s <= o.sent_s + SETTLE_S]
        if o.sent_s + SETTLE_S <= last and all(x.kind == "real" for x in window):
            return round(max(0.0, o.sent_s - fault_end), 2)
    return None


def verdict(row: dict[str, Any], all_real: bool = False) -> list[str]:
    """What misses the targets: 0 lost, 0 5xx, every default with its cause, no wrong answer, each of the
    scenario's own checks (``row["checks"]``: what it must leave behind, memory bounded); with ``all_real``,
    no default either (a fault the steady load must not notice)."""
    out = []
    if row["lost"]:
        out.append(f"{row['lost']} lost")
    if row["5xx"]:
        out.append(f"{row['5xx']} answered 5xx")
    if row["defaults_without_cause"]:
        out.append(f"{row['defaults_without_cause']} defaults without a cause")
    if row.get("wrong"):
        out.append(f"{row['wrong']} wrong answers (not the model's output for their input)")
    if row.get("late"):
        out.append(
            f"{row['late']} answers later than the SLO + {LATE_MARGIN_MS:g} ms (the slowest "
            f"{row['slowest_answer_ms']:g} ms)"
        )
    if all_real and row["default"]:
        out.append(f"{row['default']} defaults where every query should have had its model's answer")
    out += [f"failed: {name}" for name, ok in row.get("checks", {}).items() if not ok]
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = "| scenario | sent | real | default | 4xx | 5xx | lost | wrong | late | fault s | recovery s | "
    head += "defaults' causes |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        main = "; ".join(f"{c or '(none)'} ({n})" for c, n in r["default_causes"].items()) or "-"
        rec = "-" if r["recovery_s"] is None else f"{r['recovery_s']:g}"
        lines.append(
            f"| {r['scenario']} | {r['sent']} | {r['real']} | {r['default']} | {r['4xx']} | {r['5xx']} | "
            f"{r['lost']} | {r.get('wrong', 0)} | {r.get('late', 0)} | {r['fault_s']:g} | {rec} | {main} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(runs)
    fig, axes = plt.subplots(n, 1, figsize=(9, 1.9 * n), sharex=False, squeeze=False)
    colours = {"real": "#2ca02c", "default": "#ff7f0e", "4xx": "#9467bd", "5xx": "#d62728", "lost": "#000000"}
    for ax, run in zip(axes[:, 0], runs, strict=True):
        outcomes: list[Outcome] = run["outcomes"]
        end = max((o.sent_s for o in outcomes), default=1.0)
        bins = [i * BIN_S for i in range(int(end / BIN_S) + 2)]
        bottom = [0.0] * (len(bins) - 1)
        for kind in KINDS:
            counts = [0.0] * (len(bins) - 1)
            for o in outcomes:
                if o.kind == kind:
                    counts[min(int(o.sent_s / BIN_S), len(counts) - 1)] += 1 / BIN_S  # per second
            ax.bar(bins[:-1], counts, width=BIN_S, bottom=bottom, align="edge", color=colours[kind], label=kind)
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
        ax.axvspan(run["fault_start"], max(run["fault_end"], run["fault_start"] + 0.05), color="grey", alpha=0.3)
        for x in (run["fault_start"], run["fault_end"]):
            ax.axvline(x, color="#333333", linestyle="--", linewidth=0.8)
        ax.set_title(run["scenario"], fontsize=8, loc="left")
        ax.set_ylabel("q/s", fontsize=7)
        ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=7, ncol=5, loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    axes[-1, 0].set_xlabel("seconds (by the time a query was sent; the fault window shaded)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
