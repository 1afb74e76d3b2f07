"""The benchmark's outputs: the summary (highest rates, ratios, targets), its table, and the plot of latency
against offered rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.frontdoor.config import TARGET_TRANSPORT

# What issue 12 asks of the stack (Redis Streams transport), as ratios within one run.
TARGETS = {
    "mlp": (("plain", 0.5),),
    "cnn": (("plain", 1.0), ("raw", 0.6)),
}


def _label(search: dict[str, Any]) -> str:
    return str(search["system"]) + (f" ({search['transport']})" if search.get("transport") else "")


def summarize_run(searches: list[dict[str, Any]], raw: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model: every system's highest rate, the stack's ratios to the plain server and to the raw limit,
    and whether each target is met (on the Redis Streams transport; a near miss is a miss)."""
    out = []
    for model in dict.fromkeys(s["model"] for s in searches if s["system"] != "trivial"):
        mine = [s for s in searches if s["model"] == model]
        plain = next((s for s in mine if s["system"] == "plain" and "error" not in s), None)
        raw_rate = raw.get(model, {}).get("rows_per_s")
        row: dict[str, Any] = {
            "model": model,
            "slo_ms": mine[0]["slo_ms"],
            "raw_rows_per_s": raw_rate,
            "raw_batch": raw.get(model, {}).get("batch"),
            "plain_max_rate": plain["max_rate"] if plain else None,
            "stack": {},
        }
        for s in mine:
            if s["system"] != "stack":
                continue
            entry: dict[str, Any] = {"max_rate": s.get("max_rate"), "error": s.get("error")}
            if "error" not in s:
                at = s.get("at_max") or {}
                entry["p99_ms_at_max"] = at.get("p99_ms")
                entry["over_plain"] = _ratio(s["max_rate"], plain["max_rate"] if plain else None)
                entry["over_raw"] = _ratio(s["max_rate"], raw_rate)
            row["stack"][s["transport"]] = entry
        judged = row["stack"].get(TARGET_TRANSPORT)
        rates = {"plain": row["plain_max_rate"], "raw": raw_rate}
        targets = []
        for against, needed in TARGETS.get(model, ()):
            other = "plain server" if against == "plain" else "raw limit"
            mine_rate = None if judged is None or judged.get("error") else judged.get("max_rate")
            # Judged on the rates themselves, never on a rounded ratio: a near miss is a miss.
            met = None if mine_rate is None or not rates[against] else mine_rate >= needed * rates[against]
            targets.append(
                {
                    "target": f"stack ({TARGET_TRANSPORT}) >= {needed:g}x the {other}",
                    "ratio": None if judged is None else judged.get(f"over_{against}"),
                    "met": met,
                }
            )
        if judged is not None and judged.get("max_rate") is not None:
            p99_ok = bool(judged["max_rate"]) and judged.get("p99_ms_at_max") is not None
            targets.append({"target": "p99 within the SLO (at a rate above 0)", "ratio": None, "met": p99_ok})
        row["targets"] = targets
        out.append(row)
    return out


GENERATOR_BUSY = 0.8  # a failed trial in which the generator used more of its core than this may be its fault
GENERATOR_LATE = 0.25  # ... or in which it sent its p99 later than this share of the SLO (a stalled machine)
CEILING_SHARE = 0.5  # a highest rate above this share of the generator's ceiling is too close to it


def flag_generator_bound(searches: list[dict[str, Any]], ceiling: float) -> list[dict[str, Any]]:
    """Mark (``generator_may_limit``) the searches whose highest rate the generator may have decided: a failed
    trial above that rate with the generator's core busy or its sends late, or a rate close to its ceiling."""
    flagged = []
    for s in searches:
        if s["system"] == "trivial" or s.get("max_rate") is None:
            continue
        reasons = []
        failed = [t for t in s["trials"] if not t["ok"] and t["offered_rate"] > s["max_rate"]]
        busy = [t["offered_rate"] for t in failed if (t["generator_cpu_fraction"] or 0) > GENERATOR_BUSY]
        if busy:
            reasons.append(f"the generator used over {GENERATOR_BUSY:.0%} of its core in failed trials at {busy} q/s")
        late = [t["offered_rate"] for t in failed if (t["generator_late_p99_ms"] or 0) > GENERATOR_LATE * s["slo_ms"]]
        if late:
            reasons.append(f"the generator sent late (p99 over {GENERATOR_LATE:.0%} of the SLO) at {late} q/s")
        if s.get("reached_rate_cap"):
            reasons.append("the search stopped at its cap")
        if ceiling and s["max_rate"] > CEILING_SHARE * ceiling:
            reasons.append(f"{s['max_rate']:,.0f} q/s is over {CEILING_SHARE:.0%} of the generator's ceiling")
        s["generator_may_limit"] = "; ".join(reasons) or None
        if reasons:
            flagged.append(s)
    return flagged


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def table(summary: list[dict[str, Any]], transports: list[str]) -> str:
    head = ["model", "SLO", "raw ORT rows/s (batch)", "plain q/s"]
    for t in transports:
        head += [f"stack {t} q/s", f"{t}/plain", f"{t}/raw"]
    head.append(f"targets ({TARGET_TRANSPORT})")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in summary:
        cells = [
            r["model"],
            f"{r['slo_ms']:g} ms",
            f"{_n(r['raw_rows_per_s'])} ({r['raw_batch']})",
            _n(r["plain_max_rate"]),
        ]
        for t in transports:
            s = r["stack"].get(t)
            if s is None or s.get("error"):
                cells += ["failed" if s else "-", "-", "-"]
            else:
                cells += [_n(s["max_rate"]), _x(s["over_plain"]), _x(s["over_raw"])]
        met = [f"{t['target']}: {_met(t['met'])}" for t in r["targets"]]
        cells.append("; ".join(met) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def _met(value: bool | None) -> str:
    return "not measured" if value is None else "met" if value else "MISSED"


STYLE = {
    "plain": ("C1", "plain FastAPI + ORT"),
    "redis": ("C0", "stack, Redis Streams"),
    "sqs": ("C3", "stack, SQS (moto)"),
}


def plot(searches: list[dict[str, Any]], raw: dict[str, dict[str, Any]], ceiling: float | None, path: Path) -> None:
    """Latency (p50 dashed, p99 solid) against offered rate, every trial of every system, one panel a model;
    a trial whose p99 is not a real answer (more than 1 % misses) is drawn at the top of the panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(s["model"] for s in searches if s["system"] != "trivial"))
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5.5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        mine = [s for s in searches if s["model"] == model and s.get("trials")]
        slo = mine[0]["slo_ms"] if mine else 1.0
        top = 10 * slo
        for s in mine:
            color, name = STYLE.get(s["transport"] or s["system"], ("C7", _label(s)))
            trials = sorted(s["trials"], key=lambda t: t["offered_rate"])
            xs = [t["offered_rate"] for t in trials]
            p99 = [min(top, t["p99_ms"]) if t["p99_ms"] is not None else top for t in trials]
            p50 = [min(top, t["p50_ms"]) if t["p50_ms"] is not None else top for t in trials]
            ax.plot(xs, p99, "o-", color=color, label=f"{name} p99 (max {s['max_rate']:,.0f} q/s)")
            ax.plot(xs, p50, "x--", color=color, alpha=0.7, label=f"{name} p50")
        ax.axhline(slo, color="k", linestyle=":", linewidth=1, label=f"SLO {slo:g} ms")
        highest = max((t["offered_rate"] for s in mine for t in s["trials"]), default=1.0)
        limits = []  # drawn where they do not stretch the axis far past the trials, named in the title always
        raw_rate = raw.get(model, {}).get("rows_per_s")
        for value, name, style in ((raw_rate, "raw ORT limit", "C2"), (ceiling, "generator ceiling", "C7")):
            if value:
                limits.append(f"{name} {value:,.0f}/s")
                if value <= 4 * highest:
                    ax.axvline(value, color=style, linestyle="-.", label=f"{name} ({value:,.0f}/s)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set(
            xlabel="offered rate (queries/s, Poisson)",
            ylabel=f"latency from the scheduled send (ms; {top:g} = more than 1 % misses)",
            title=f"{model}, SLO {slo:g} ms, each system alone on one core\n" + "; ".join(limits),
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
