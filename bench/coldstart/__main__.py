"""`make bench-coldstart`: cold start of every function and of the model endpoint server.

For each Lambda function (frontend, batcher, feedback, admin and model_updater, those whose
``functions/<name>/app.py`` exists; one whose first events fail is reported as not measured) a fresh
interpreter imports the handler module as Lambda does (the function's folder first on ``sys.path``, the
``clipper`` package from the environment as the layer provides it), which runs the composition root
(settings, boto3 clients, adapters, core). Measured from the spawn of the interpreter:

- ready: the handler module is imported (Lambda's INIT phase);
- first event answered: the handler has returned for a realistic first event (``tests/events.py``
  factories over ``events/*.json``), plus the first event's own time and a second (warm) event's time;
- peak RSS of the process after the first event (``VmHWM``: Linux carries ``getrusage``'s ``ru_maxrss`` over
  fork + exec, so a child would report at least this benchmark's own peak);
- CPU time to ready (user + system), less disturbed than wall time by other work on a shared machine.

AWS is a moto server on loopback (``AWS_ENDPOINT_URL``, as the local stack sets it), started once: moto in
process would import boto3 and botocore before the handler and hide their cost. A real ONNX Runtime endpoint
and a long-poll batcher answer the frontend's first query (a cache miss), so that first event travels the
whole path. The same interpreter, env and events measure the bare frameworks each function needs (e.g.
FastAPI + Mangum + boto3 with the same clients for the frontend: ``bare``) and those plus the libraries the
design mandates (Powertools, pydantic-settings, numpy: ``bare_plus``), interleaved with ours in every round.

The endpoint server (``python -m clipper_endpoint`` on the demo MLP) is ready when ``/ping`` answers; its
first event is the first ``/invocations`` (one ``.npy`` row). Its bare baseline is uvicorn + Starlette +
ONNX Runtime serving the same model.

One more run per function with ``-X importtime`` lists the heavy imports, which modules ran no Python code
during the first two events (candidates to load lazily), socket connects during import (AWS calls at cold
start) and boto3 clients created by events (they must be created once, at cold start).

Writes bench/results/coldstart.json and coldstart.png. ``--runs N`` (default 5) rounds after a discarded
warm-up round (it compiles .pyc files and warms the page cache, as a deployed package has them); about
2.5 minutes on 2 cores. ``--what-if-gc`` adds a variant of ours with the cyclic GC off during the import
and ``gc.freeze()`` after it (the frontend, batcher and feedback handlers do it themselves since issue 6, so
for them the variant measures the same thing twice; the admin and model updater handlers do not).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.coldstart.config import FUNCTIONS, RESULTS, ROOT, VARIANTS, log
from bench.coldstart.report import plot, print_report, report
from bench.coldstart.runs import run_endpoint, run_lambda
from bench.coldstart.sources import bare_source
from bench.coldstart.world import World


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="measured rounds (after one discarded warm-up round)")
    p.add_argument(
        "--what-if-gc",
        action="store_true",
        help="also measure our functions with the cyclic GC off while the handler module is imported and "
        "gc.freeze() after it (variant ours_gc; what a gc.disable()/gc.freeze() in each app.py would give)",
    )
    p.add_argument(
        "--functions",
        default=",".join(FUNCTIONS),
        help="comma-separated functions to measure (a quick check: --runs 1 --functions frontend,batcher)",
    )
    p.add_argument("--no-endpoint", action="store_true", help="do not measure the endpoint server")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for coldstart.json and coldstart.png")
    args = p.parse_args()
    wanted = [f.strip() for f in args.functions.split(",") if f.strip()]
    if unknown := sorted(set(wanted) - set(FUNCTIONS)):
        p.error(f"unknown functions {unknown}; known: {', '.join(FUNCTIONS)}")
    variants = (*VARIANTS, "ours_gc") if args.what_if_gc else VARIANTS
    if args.runs < 1:
        p.error("--runs must be at least 1")
    started = time.monotonic()
    from infra.demo.train_models import ensure_models

    manifest = ensure_models(ROOT / "build" / "models", log=lambda line: None)
    mlp = next(m for m in manifest["models"] if m["name"] == "mlp")
    mlp_path = str(Path(manifest["out_dir"]) / mlp["path"])
    functions = [f for f in wanted if (ROOT / "functions" / f / "app.py").exists()]
    skipped = {f: f"absent: there is no functions/{f}/app.py in the repository" for f in wanted if f not in functions}
    for f, why in skipped.items():
        log(f"{f} not measured ({why})")

    samples: dict[str, dict[str, list[dict[str, Any]]]] = {}
    diagnostics: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="coldstart-") as tmpdir:
        tmp = Path(tmpdir)
        folders: dict[tuple[str, str], Path] = {}
        for f in functions:
            folders[(f, "ours")] = folders[(f, "ours_gc")] = ROOT / "functions" / f
            for variant, plus in (("bare", False), ("bare_plus", True)):
                folder = tmp / f"{variant}-{f}"
                folder.mkdir()
                (folder / "app.py").write_text(bare_source(f, plus))
                folders[(f, variant)] = folder
        world = World(tmp, mlp_path)
        try:
            log("starting moto server, the MLP endpoint and a long-poll batcher (the first events' world)")
            world.start()
            log(f"world ready in {time.monotonic() - started:.1f} s; {args.runs} rounds after a warm-up round")
            for rnd in range(args.runs + 1):
                for f in list(functions):
                    for variant in variants:
                        try:
                            r = run_lambda(world, f, folders[(f, variant)], gc_what_if=variant == "ours_gc")
                        except RuntimeError as e:
                            if rnd:
                                raise
                            # a function that fails its first events (e.g. work in progress) is reported, not timed
                            skipped[f] = f"failed in the warm-up round ({variant}): {str(e)[-600:]}"
                            log(f"{f} not measured: {skipped[f]}")
                            functions.remove(f)
                            break
                        if rnd:
                            samples.setdefault(f, {}).setdefault(variant, []).append(r)
                for variant, bare in () if args.no_endpoint else (("ours", False), ("bare", True)):
                    r = run_endpoint(world, mlp_path, bare)
                    if rnd:
                        samples.setdefault("endpoint", {}).setdefault(variant, []).append(r)
                label = "warm-up round" if rnd == 0 else f"round {rnd}/{args.runs}"
                ready = ", ".join(f"{t} {v['ours'][-1]['ready_s']:.2f}s" for t, v in samples.items() if rnd)
                log(f"{label} done ({time.monotonic() - started:.0f} s){': ready ' + ready if ready else ''}")
            log("one more run each with -X importtime (heavy imports, code run by the first events)")
            for f in functions:
                try:
                    diagnostics[f] = run_lambda(world, f, folders[(f, "ours")], diag=True)["diag"]
                except RuntimeError as e:
                    log(f"{f}: the -X importtime run failed: {str(e)[-600:]}")
                    diagnostics[f] = {"error": str(e)[-600:]}
            if not args.no_endpoint:
                diagnostics["endpoint"] = run_endpoint(world, mlp_path, bare=False, diag=True)["diag"]
        finally:
            world.stop()
    result = report(samples, diagnostics, functions, skipped, args.runs, time.monotonic() - started)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "coldstart.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / "coldstart.png")
    print_report(result)
    log(f"wrote {args.out / 'coldstart.json'} and coldstart.png in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
