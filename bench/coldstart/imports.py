"""What ``-X importtime`` says: the heavy imports and the modules no event ran."""

from __future__ import annotations

import sys
from typing import Any


def parse_importtime(text: str) -> list[dict[str, Any]]:
    """``-X importtime`` lines -> [{name, self_ms, cumulative_ms, depth}] in import order."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line.split(":", 1)[1].split("|", 2)
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        rows.append(
            {"name": name.strip(), "self_ms": int(self_us) / 1000, "cumulative_ms": int(cum_us) / 1000, "depth": depth}
        )
    return rows


def heavy_imports(rows: list[dict[str, Any]], top: int = 15, at_ready: set[str] | None = None) -> dict[str, Any]:
    """The top modules by cumulative import time and the top packages by their modules' own time, of the
    imports done at cold start (``at_ready``: the modules loaded when the handler module was imported);
    the imports the first events did themselves are listed apart."""
    later = [r for r in rows if at_ready is not None and r["name"] not in at_ready]
    rows = [r for r in rows if at_ready is None or r["name"] in at_ready]
    by_cum = sorted(rows, key=lambda r: -r["cumulative_ms"])[:top]
    packages: dict[str, float] = {}
    for r in rows:
        top_name = r["name"].split(".")[0]
        packages[top_name] = packages.get(top_name, 0.0) + r["self_ms"]
    return {
        "total_ms": round(sum(r["self_ms"] for r in rows), 1),
        "imported_by_first_events_ms": round(sum(r["self_ms"] for r in later), 1),
        "imported_by_first_events": sorted({r["name"].split(".")[0] for r in later}),
        "top_modules_by_cumulative_ms": [
            {"module": r["name"], "cumulative_ms": round(r["cumulative_ms"], 1), "self_ms": round(r["self_ms"], 1)}
            for r in by_cum
        ],
        "top_packages_by_self_ms": [
            {"package": k, "ms": round(v, 1)} for k, v in sorted(packages.items(), key=lambda kv: -kv[1])[:top]
        ],
    }


def not_run_by_events(rows: list[dict[str, Any]], diag: dict[str, Any], min_ms: float = 5.0) -> list[dict[str, Any]]:
    """Packages (and clipper modules, one by one) imported at cold start whose Python code did not run during
    the first two events: candidates to import lazily. A heuristic: a package used only through C code
    (pydantic-core under pydantic) or only for its types shows up here too, so each entry needs a look."""
    executed = set(diag.get("executed_files", []))
    files = {n: f for n, f in diag.get("module_files", {}).items() if f}
    self_ms = {r["name"]: r["self_ms"] for r in rows if r["name"] in diag.get("module_files", {})}

    def group(name: str) -> str:
        return name if name.startswith("clipper.") else name.split(".")[0]

    cost: dict[str, float] = {}
    used: dict[str, bool] = {}
    for name in self_ms:
        g = group(name)
        cost[g] = cost.get(g, 0.0) + self_ms[name]
        used[g] = used.get(g, False) or files.get(name) in executed

    def kind(g: str) -> str:
        if g.startswith("clipper"):
            return "clipper"
        return "stdlib" if g.lstrip("_") in sys.stdlib_module_names else "third-party"

    return [
        {"module_or_package": g, "import_self_ms": round(c, 1), "kind": kind(g)}
        for g, c in sorted(cost.items(), key=lambda kv: -kv[1])
        if not used[g] and c >= min_ms and g not in ("app", "encodings")
    ]


# -- the world the first events need: moto server, endpoint server, long-poll batcher ------------------------
