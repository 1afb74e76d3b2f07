"""The selection report as a PNG (matplotlib, imported when called: ``pip install matplotlib``): each model's loss
over time, then the panels the report has data for: the Exp3 regret curve (an application whose policy asks one
model a query), the Exp4 error by confidence beside perfect calibration (an ensemble). An Exp3 application's PNG
has no empty Exp4 panel, nor an Exp4 one's an empty regret panel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PANEL_WIDTH_IN = 5.4  # one panel's width; the figure is as wide as the panels it has


def panels(report: dict[str, Any]) -> list[str]:
    """The panels ``report`` has data for, in the order drawn: "loss" always (it says when there is no feedback),
    "regret" where Exp3's curve has a point, "calibration" where an Exp4 confidence bucket has a judged answer."""
    out = ["loss"]
    if report["exp3_regret"]["curve"]:
        out.append("regret")
    if any(b["judged"] for b in report["exp4_calibration"]["buckets"]):
        out.append("calibration")
    return out


def draw(report: dict[str, Any]) -> Any:
    """The report's figure (a matplotlib ``Figure``), one panel per entry of ``panels``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = panels(report)
    fig, axes = plt.subplots(1, len(names), figsize=(PANEL_WIDTH_IN * len(names), 4.5), squeeze=False)
    fig.suptitle(f"Selection report: {report.get('app', '')} ({report.get('feedbacks', 0)} feedbacks)")
    by_name = dict(zip(names, axes[0], strict=True))
    _loss(report, by_name["loss"])
    if "regret" in by_name:
        _regret(report, by_name["regret"])
    if "calibration" in by_name:
        _calibration(report, by_name["calibration"])
    for ax in by_name.values():
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def write_png(report: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig = draw(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _loss(report: dict[str, Any], ax: Any) -> None:
    points = report["loss_over_time"]["points"]
    ends = [sum(p["feedbacks"] for p in points[: i + 1]) for i in range(len(points))]
    for model in sorted({m for p in points for m in p["mean_loss"]}):
        xs = [x for x, p in zip(ends, points, strict=True) if p["mean_loss"].get(model) is not None]
        ys = [p["mean_loss"][model] for p in points if p["mean_loss"].get(model) is not None]
        ax.plot(xs, ys, marker="o", label=model)
    answered = [(x, p["answer_loss"]) for x, p in zip(ends, points, strict=True) if p["answer_loss"] is not None]
    if answered:
        ax.plot(*zip(*answered, strict=True), "k--", label="answers")
    if not points:
        ax.text(0.5, 0.5, "no feedback in the range", ha="center", va="center", transform=ax.transAxes)
    window = report["loss_over_time"]["window"]
    ax.set(title=f"Loss per window of {window} feedbacks", xlabel="feedbacks", ylabel="mean loss")
    ax.set_ylim(-0.05, 1.05)


def _regret(report: dict[str, Any], ax: Any) -> None:
    regret = report["exp3_regret"]
    curve = regret["curve"]
    xs = [c["feedbacks"] for c in curve]
    ax.plot(xs, [c["regret"] for c in curve], label="importance-weighted")
    ax.plot(xs, [c["empirical"] for c in curve], "--", label="empirical means")
    ax.axhline(0.0, color="grey", linewidth=0.5)
    best = regret.get("best_model")
    ax.set(title=f"Exp3 regret vs the best model ({best or 'none'})", xlabel="feedbacks", ylabel="regret")


def _calibration(report: dict[str, Any], ax: Any) -> None:
    buckets = [b for b in report["exp4_calibration"]["buckets"] if b["judged"]]
    ax.bar(
        [(b["low"] + b["high"]) / 2 for b in buckets],
        [b["error"] for b in buckets],
        width=[0.9 * (b["high"] - b["low"]) for b in buckets],
        label="error",
    )
    ax.plot([0, 1], [1, 0], "k:", label="1 - confidence")
    ax.set(title="Exp4 error by confidence", xlabel="confidence", ylabel="error rate", xlim=(0, 1), ylim=(0, 1))
