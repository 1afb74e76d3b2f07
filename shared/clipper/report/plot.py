"""The selection report as a PNG (matplotlib, imported when called: ``pip install matplotlib``): each model's loss
over time, the Exp3 regret curve, and the Exp4 error by confidence beside perfect calibration."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_png(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, regret_ax, conf_ax) = plt.subplots(1, 3, figsize=(16, 4.5))
    fig.suptitle(f"Selection report: {report.get('app', '')} ({report.get('feedbacks', 0)} feedbacks)")

    points = report["loss_over_time"]["points"]
    ends = [sum(p["feedbacks"] for p in points[: i + 1]) for i in range(len(points))]
    for model in sorted({m for p in points for m in p["mean_loss"]}):
        xs = [x for x, p in zip(ends, points, strict=True) if p["mean_loss"].get(model) is not None]
        ys = [p["mean_loss"][model] for p in points if p["mean_loss"].get(model) is not None]
        loss_ax.plot(xs, ys, marker="o", label=model)
    answered = [(x, p["answer_loss"]) for x, p in zip(ends, points, strict=True) if p["answer_loss"] is not None]
    if answered:
        loss_ax.plot(*zip(*answered, strict=True), "k--", label="answers")
    window = report["loss_over_time"]["window"]
    loss_ax.set(title=f"Loss per window of {window} feedbacks", xlabel="feedbacks", ylabel="mean loss")
    loss_ax.set_ylim(-0.05, 1.05)

    regret = report["exp3_regret"]
    curve = regret["curve"]
    if curve:
        xs = [c["feedbacks"] for c in curve]
        regret_ax.plot(xs, [c["regret"] for c in curve], label="importance-weighted")
        regret_ax.plot(xs, [c["empirical"] for c in curve], "--", label="empirical means")
    regret_ax.axhline(0.0, color="grey", linewidth=0.5)
    best = regret.get("best_model")
    regret_ax.set(title=f"Exp3 regret vs the best model ({best or 'none'})", xlabel="feedbacks", ylabel="regret")

    buckets = [b for b in report["exp4_calibration"]["buckets"] if b["judged"]]
    if buckets:
        conf_ax.bar(
            [(b["low"] + b["high"]) / 2 for b in buckets],
            [b["error"] for b in buckets],
            width=[0.9 * (b["high"] - b["low"]) for b in buckets],
            label="error",
        )
    conf_ax.plot([0, 1], [1, 0], "k:", label="1 - confidence")
    conf_ax.set(title="Exp4 error by confidence", xlabel="confidence", ylabel="error rate", xlim=(0, 1), ylim=(0, 1))

    for ax in (loss_ax, regret_ax, conf_ax):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
