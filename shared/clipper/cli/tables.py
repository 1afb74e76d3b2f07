"""Text tables of what the API answers: ``clipper metrics`` and ``clipper inspect``."""

from __future__ import annotations

import time
from typing import Any


def metrics_table(report: dict[str, Any]) -> str:
    """Clipper's metrics as text: one line a metric, its figures after the name."""
    lines = []
    for kind in ("counters", "meters", "histograms"):
        for entry in report.get(kind, []):
            for name, value in entry.items():
                if isinstance(value, dict):
                    figures = "  ".join(
                        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items()
                    )
                else:
                    figures = str(value)
                lines.append(f"{kind[:-1]:<9} {name:<48} {figures}")
    return "\n".join(lines) or "(no metrics yet)"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]


def _slo(micros: int) -> str:
    return f"{micros / 1000:g} ms"


def _batching(b: dict[str, Any] | None) -> str:
    if not b:
        return "-"
    size = f"size {b['batch_size']}" if b["controller"] == "fixed" else f"<= {b['max_batch_size']}"
    return f"{b['controller']} {size}, wait {b['batch_wait_ms']:g} ms"


def inspect_table(state: dict[str, Any], processes: list[dict[str, Any]] | None = None) -> str:
    """``get_state`` (and the local stack's processes) as tables: applications, models, versions, rejected
    uploads, processes."""
    out: list[str] = []
    apps = state.get("applications", {})
    out.append(f"applications ({len(apps)})")
    rows = [
        [
            n,
            a["input_type"],
            a.get("input_shape") or "any",
            _slo(a["latency_slo_micros"]),
            a["policy"],
            ", ".join(a.get("linked_models", [])) or "-",
            a["default_output"],
        ]
        for n, a in sorted(apps.items())
    ]
    out += _table(["name", "input", "shape", "SLO", "policy", "models", "default"], rows) if rows else ["  (none)"]
    models = state.get("models", {})
    out.append("")
    out.append(f"models ({len(models)})")
    rows = []
    for n, m in sorted(models.items()):
        queue = m.get("queue")
        depth = "-" if not isinstance(queue, dict) else sum(v for v in queue.values() if isinstance(v, int))
        rows.append(
            [
                n,
                m["active_version"],
                len(m.get("versions", {})),
                m["num_replicas"],
                "on" if m.get("auto_promote") else "off",
                _batching(m.get("batching")),
                depth,
                m.get("endpoint_health", "-"),
                ", ".join(m.get("linked_apps", [])) or "-",
            ]
        )
    header = ["name", "active", "versions", "replicas", "auto-promote", "batching", "queued", "endpoint", "apps"]
    out += _table(header, rows) if rows else ["  (none)"]
    rows = []
    for n, m in sorted(models.items()):
        for v, info in sorted(m.get("versions", {}).items()):
            mark = "*" if info.get("is_current_version") else ""
            rows.append(
                [
                    f"{n}:{v}{mark}",
                    info["input_type"],
                    info.get("container_name", "-"),
                    info.get("artifact", "-"),
                    info.get("sha256", "")[:12] or "-",
                ]
            )
        for v, r in sorted(m.get("rejected", {}).items()):
            rows.append([f"{n}:{v} (rejected)", "-", "-", r.get("artifact", "-"), "; ".join(r.get("reasons", []))])
    if rows:
        out.append("")
        out.append("versions (* active)")
        out += _table(["version", "input", "serving", "artifact", "sha256 / why rejected"], rows)
    if processes is not None:
        out.append("")
        out.append(f"local processes ({len(processes)})")
        now = time.time()
        rows = [
            [
                p["name"],
                p.get("pid") or "-",
                p["status"],
                p.get("restarts", 0),
                "-" if p.get("last_exit") is None else p["last_exit"],
                "-" if not p.get("last_restart") else f"{now - p['last_restart']:.0f} s ago",
            ]
            for p in processes
        ]
        out += _table(["process", "pid", "status", "restarts", "last exit", "last restart"], rows)
    return "\n".join(out)
