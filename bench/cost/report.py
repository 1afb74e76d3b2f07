"""The cost comparison as a table and a plot (cost per million predictions against the request rate)."""

from __future__ import annotations

from pathlib import Path

from clipper.cost.model import Cost

NAMES = {
    "stack": "this stack",
    "stack-dynamodb": "this stack, DynamoDB cache and replies",
    "realtime": "SageMaker real-time, direct",
    "serverless": "SageMaker Serverless Inference",
}


def table(costs: dict[str, list[Cost]], rates: list[float]) -> str:
    head = "| USD per million predictions | " + " | ".join(f"{r:g} q/s" for r in rates) + " |"
    lines = [head, "|---" * (len(rates) + 1) + "|"]
    for name, series in costs.items():
        by_rate = {c.rate_qps: c for c in series}
        cells = [_usd(by_rate[r].per_million) if r in by_rate else "" for r in rates]
        lines.append(f"| {NAMES.get(name, name)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown(cost: Cost) -> str:
    lines = sorted(cost.lines.items(), key=lambda kv: -kv[1])
    rows = [f"| {k} | {_usd(v)} |" for k, v in lines]
    head = f"| {cost.system} at {cost.rate_qps:g} q/s ({cost.instances} instance(s)) | USD per million |"
    return "\n".join([head, "|---|---|", *rows, f"| total | {_usd(cost.per_million)} |"])


def _usd(value: float) -> str:
    return f"{value:,.2f}" if value >= 10 else f"{value:.3g}"


def plot(costs: dict[str, list[Cost]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, series in costs.items():
        ax.plot([c.rate_qps for c in series], [c.per_million for c in series], label=NAMES.get(name, name))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("request rate (queries/s, steady)")
    ax.set_ylabel("USD per million predictions")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
