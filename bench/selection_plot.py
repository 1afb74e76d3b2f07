"""The selection benchmark's figure (``bench/results/selection.png``): accuracy, Exp3's regret and choices,
robustness, Exp4's error by confidence, personalisation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def plot(
    models: list[str], acc: dict[str, Any], fault: dict[str, Any], pers: dict[str, Any], path: Path, window_size: int
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 3, figsize=(17, 9.5))
    a = ax[0, 0]
    for name in [*models, "single", "epsilon_greedy", "exp3", "exp4"]:
        curve = acc["curves"][name]
        cumulative = np.cumsum(curve) / np.arange(1, len(curve) + 1)
        style = "--" if name in models else "-"
        a.plot(cumulative, style, label=name, linewidth=1.2 if name in models else 2)
    a.set(title="Cumulative accuracy over the stream", xlabel="query", ylabel="accuracy", ylim=(0.9, 1.0))
    a.legend(fontsize=8, ncol=2)

    a = ax[0, 1]
    a.plot(acc["regret_curve"], color="C2")
    a.set(title="Exp3: cumulative regret vs the best fixed model", xlabel="query", ylabel="regret (answers)")

    a = ax[0, 2]
    share = acc["exp3_share"]
    window = np.ones(window_size) / window_size
    smooth = [np.convolve(share[:, i], window, mode="valid") for i in range(len(models))]
    a.stackplot(np.arange(len(smooth[0])), *smooth, labels=models)
    a.set(title="Exp3: share of queries sent to each model", xlabel="query", ylabel="share", ylim=(0, 1))
    a.legend(fontsize=8, loc="lower right")

    a = ax[1, 0]
    f = fault["fault_at"]
    for i, name in enumerate(["exp3", "exp4"]):
        moving = np.convolve(fault["curves"][name], window, mode="valid")
        a.plot(np.arange(len(moving)) + window_size - 1, moving, color=f"C{i + 2}", label=name)
        a.axhline(fault[name]["band"][0], color=f"C{i + 2}", linestyle=":", linewidth=1)
        if fault[name]["recovery_queries"] is not None:  # sustained: every later window in the band
            a.axvline(f + fault[name]["recovery_queries"], color=f"C{i + 2}", linestyle="-.", linewidth=1)
    a.axvline(f, color="k", linestyle="--", linewidth=1, label=f"{fault['broken_model']} breaks")
    a.set(title=f"Robustness: accuracy over the last {window_size} queries", xlabel="query", ylabel="accuracy")
    a.set_ylim(0.85, 1.0)
    a.legend(fontsize=8)

    a = ax[1, 1]
    levels = [lv for lv in acc["levels"] if lv["error"] is not None]
    labels = [f"{lv['confidence'][0]:.2f}-{lv['confidence'][1]:.2f}" for lv in levels]
    a.bar(labels, [lv["error"] for lv in levels], color="C3")
    for i, lv in enumerate(levels):
        a.annotate(f"{lv['share']:.1%}", (i, lv["error"]), ha="center", va="bottom", fontsize=8)
    a.set(title="Exp4: error by confidence (share of queries on top)", xlabel="confidence", ylabel="error rate")
    a.tick_params(axis="x", labelsize=8, rotation=30)

    a = ax[1, 2]
    groups = list(pers["groups"])
    xs = np.arange(len(groups))
    for i, m in enumerate(models):
        a.bar(xs + (i - 1.5) * 0.2, [pers["groups"][g][m] for g in groups], width=0.2, label=m)
    a.set_xticks(xs, [f"{g}\n(best: {pers['best_model_per_group'][g]})" for g in groups])
    a.set(ylim=(0, 1.05), ylabel="accuracy")
    a.set_title(
        f"Personalisation: per-user Exp3 {pers['accuracy_contextual']:.3f} vs app-wide {pers['accuracy_global']:.3f}"
    )
    a.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
