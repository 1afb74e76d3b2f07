"""Text tables of what the API answers: ``clipper metrics``, ``clipper inspect`` and ``clipper canary``."""

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


def _ago(at: Any, now: float) -> str:
    if not isinstance(at, int | float):
        return "-"
    seconds = max(0.0, now - at)
    return (
        f"{seconds:.0f} s ago"
        if seconds < 120
        else f"{seconds / 60:.0f} min ago"
        if seconds < 7200
        else (f"{seconds / 3600:.1f} h ago")
    )


def _canary_cell(c: dict[str, Any] | None) -> str:
    return "-" if not c else f"{c['version']} @ {c['share'] * 100:.10g}%"


def _event_line(e: dict[str, Any] | None, now: float) -> str:
    if not e:
        return "-"
    return f"{e.get('kind', '?')} by {e.get('who', '?')} {_ago(e.get('at'), now)}: {e.get('reason', '')}".rstrip(": ")


def _rate(n: float, of: int) -> str:
    return f"{n / of:.4f}" if of else "-"


def canary_table(answer: dict[str, Any], now: float | None = None) -> str:
    """``get_canary`` as text: the canary, its params, its evidence per version, the decision it would get now,
    and the last events."""
    now = time.time() if now is None else now
    name, c = answer["model_name"], answer.get("canary")
    if c is None:
        out = [f"{name}: no canary running (active version {answer['active_version']})"]
    else:
        out = [
            f"{name}: canary {c['version']} on {c['share'] * 100:.10g}% of the queries beside "
            f"{answer['active_version']} (trial {c['trial']}, started {_ago(c['started_at'], now)})",
            "params: " + ", ".join(f"{k} {v:g}" for k, v in c.get("params", {}).items()),
        ]
    evidence = answer.get("evidence")
    if c is not None and evidence is not None:
        rows = [
            [
                v + (" (canary)" if v == c["version"] else " (active)" if v == answer["active_version"] else ""),
                e["feedback"],
                _rate(e["loss_sum"], e["feedback"]),
                e["queries"],
                e["errors"],
                e["slo_misses"],
            ]
            for v, e in sorted(evidence.items())
        ]
        out += ["", "evidence"]
        out += (
            _table(["version", "feedback", "loss rate", "queries", "errors", "SLO misses"], rows)
            if rows
            else ["  (none counted yet)"]
        )
        d = answer.get("decision_now")
        if d:
            reason = str(d["reason"]).removeprefix(f"{d['kind']}: ")  # the reason names its kind too
            out += ["", f"decision now: {d['kind']} ({d['rule']}): {reason}"]
    elif c is not None:
        out += ["", "evidence: not available from this API"]
    events = answer.get("events", [])
    out += ["", f"last events ({len(events)})"]
    rows = [[_ago(e.get("at"), now), e.get("kind", "?"), e.get("who", "?"), e.get("reason", "")] for e in events]
    out += _table(["when", "event", "who", "why"], rows) if rows else ["  (none)"]
    return "\n".join(out)


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
                _canary_cell(m.get("canary")),
            ]
        )
    header = ["name", "active", "versions", "replicas", "auto-promote", "batching", "queued", "endpoint", "apps"]
    out += _table([*header, "canary"], rows) if rows else ["  (none)"]
    now = time.time()
    rows = [
        [n, _canary_cell(m.get("canary")), _event_line(m.get("last_canary_event"), now)]
        for n, m in sorted(models.items())
        if m.get("canary") or m.get("last_canary_event")
    ]
    if rows:
        out += ["", "canaries (last decision)"]
        out += _table(["model", "canary", "last event"], rows)
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
    feedback = state.get("feedback")
    if feedback:
        out += [
            "",
            "feedback (accepted, not yet acknowledged: being applied, or applied and not yet on the local "
            "stack's disk; dead-lettered: failed for good)",
        ]
        rows = [_depth_row(k, v) for k, v in sorted(feedback.items())]
        queue = feedback.get("queue")
        if "dead_letter" not in feedback and isinstance(queue, dict) and "dead_lettered" in queue:
            rows.append(_depth_row("dead_letter", {"waiting": queue["dead_lettered"]}))  # kept beside the stream
        out += _table(["queue", "waiting", "in flight"], rows)
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


def _depth_row(name: str, depth: Any) -> list[Any]:
    label = {"queue": "feedback", "dead_letter": "dead-lettered"}.get(name, name)
    if not isinstance(depth, dict):
        return [label, str(depth), "-"]
    return [label, depth.get("waiting", "-"), depth.get("in_flight", "-")]
