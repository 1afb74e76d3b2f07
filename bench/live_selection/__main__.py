"""make bench-live-selection: the selection benchmark's experiments driven through the running local stack's
HTTP API with real queries and feedback, beside the offline replay of the same streams in the same run.

    python -m bench.live_selection [--quick] [--out DIR]

Experiments (``config.EXPERIMENTS``), one application each, all four demo models linked:

- ``exp4``: Exp4 over shuffled passes of the held-out digits rows, against the best single model;
- ``user-exp3`` / ``global-exp3``: the personalisation stream of ``bench/selection.py`` (three user groups
  whose inputs are plain, mirrored, noisy), per-user Exp3 (queries and feedback carry ``uid``) and app-wide;
- ``fault-exp3`` / ``fault-exp4``: midway through the stream the best model (mlp) starts answering wrong
  labels: its broken version (``broken.py``), deployed beforehand, is made active with the admin API's
  ``set_model_version``; the stream waits until the frontend answers from it, and after the stream mlp:1 is
  made active again.

Writes ``live_selection.json`` and ``live_selection.png`` (``live_selection_quick.*`` with --quick).
"""

from __future__ import annotations

import argparse
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.live_selection import report
from bench.live_selection.analysis import Case, analyse, visible_from
from bench.live_selection.broken import broken_model
from bench.live_selection.compare import lags
from bench.live_selection.config import (
    BROKEN_VERSION,
    EXPERIMENTS,
    FULL,
    MODELS_DIR,
    QUICK,
    RESULTS,
    SEED,
    USERS_PER_GROUP,
    WORK_DIR,
    Experiment,
    Plan,
    log,
)
from bench.live_selection.driver import Client, LiveRun, drive, read_records
from bench.live_selection.streams import Stream, all_distinct, order, plain_stream, user_stream
from bench.live_selection.world import World
from bench.selection import transforms
from infra.demo.train_models import ensure_models

CHECK_EVERY = 10  # queries between looks at the feedback backlog
MAX_BACKLOG = 20  # feedback messages the client lets wait before it holds its next query
BEST = "mlp"  # the model that breaks (the best on the plain stream; checked below)
SERIALS_PER_STREAM = 100_000


def load_models(plan: Plan) -> tuple[list[str], dict[str, Any], np.ndarray, np.ndarray, Path]:
    import onnxruntime as ort

    manifest = ensure_models(MODELS_DIR, log=log)
    out = Path(manifest["out_dir"])
    holdout = np.load(out / manifest["dataset"]["holdout"])
    broken = broken_model(out / BEST / "1" / "model.onnx", WORK_DIR / "broken" / "model.onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    paths = {m["name"]: out / m["path"] for m in manifest["models"]} | {f"{BEST}:{BROKEN_VERSION}": broken}
    sessions = {n: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for n, p in paths.items()}
    models = [m["name"] for m in manifest["models"]]
    return models, sessions, holdout["X"][: plan.rows], holdout["y"][: plan.rows], broken


def predict(sessions: dict[str, Any], x: np.ndarray) -> dict[str, np.ndarray]:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return {n: np.asarray(s.run(None, {s.get_inputs()[0].name: x})[0], np.int64) for n, s in sessions.items()}


def build_streams(plan: Plan, x: np.ndarray, y: np.ndarray) -> dict[str, Stream]:
    n = len(y)
    streams: dict[str, Stream] = {}
    users_rng = np.random.default_rng(SEED + 900)
    user_rows = order(users_rng, n, plan.passes)
    who = users_rng.integers(0, 3 * USERS_PER_GROUP, len(user_rows))
    views = transforms(x)
    fault_rows = order(np.random.default_rng(SEED + 500), n, plan.passes)
    plain_rows = order(np.random.default_rng(SEED), n, plan.passes)
    for i, e in enumerate(EXPERIMENTS):
        first = i * SERIALS_PER_STREAM
        if e.kind == "users":
            streams[e.name] = user_stream(views, y, user_rows, who, USERS_PER_GROUP, first, send_uid=e.per_user)
        else:
            streams[e.name] = plain_stream(x, y, fault_rows if e.kind == "fault" else plain_rows, first)
    return streams


def run_live(world: World, plan: Plan, streams: dict[str, Stream], linked: dict[str, list[str]]) -> dict[str, Any]:
    client = Client(world.url)
    runs: dict[str, LiveRun] = {}
    switches: dict[str, dict[str, float]] = {}
    try:
        for e in EXPERIMENTS:
            stream = streams[e.name]
            fault = len(stream) // 2 if e.kind == "fault" else None
            switched: dict[str, float] = {}

            def before(t: int, fault: int | None = fault, switched: dict[str, float] = switched) -> None:
                if t and t % CHECK_EVERY == 0:
                    switched["held_s"] = switched.get("held_s", 0.0) + world.hold(MAX_BACKLOG)
                if t == fault:
                    switched["drained_s"] = world.hold(0)  # the pre-fault feedback applied, as offline
                    switched["to_broken_s"] = world.switch(client, BEST, BROKEN_VERSION)
                    log(
                        f"  query {t}: {BEST}:{BROKEN_VERSION} (broken) active, answered from after "
                        f"{switched['to_broken_s']:.1f} s"
                    )

            def progress(t: int, run: LiveRun, e: Experiment = e, n: int = len(stream)) -> None:
                if (t + 1) % plan.progress_every == 0 or t + 1 == n:
                    rate = (t + 1) / (time.monotonic() - run.query_at[0])
                    right = float(np.mean(run.correct(streams[e.name].y[: t + 1])))
                    log(f"  {e.app}: {t + 1}/{n} queries, {rate:.0f} q/s, live accuracy so far {right:.4f}")

            log(f"{e.name}: {len(stream)} queries to /{e.app}/predict, each followed by /{e.app}/update")
            switched["drained_before_s"] = world.hold(0)  # the previous stream's feedback applied first
            runs[e.name] = drive(client, e.app, stream, plan.rate, before, progress)
            read_records(world.redis_url, runs[e.name], stream)
            if fault is not None:
                switched["back_s"] = world.switch(client, BEST, "1")
                log(f"  {BEST}:1 active again after {switched['back_s']:.1f} s")
            switches[e.name] = switched
            log(f"{e.name}: {runs[e.name].summary()}")
    finally:
        client.close()
    return {"runs": runs, "switches": switches, "linked": linked}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"a check that it runs: {QUICK}")
    p.add_argument("--out", type=Path, default=RESULTS, help="where live_selection.json and .png go")
    p.add_argument("--rate", type=float, help="queries per second (each with its feedback)")
    p.add_argument("--passes", type=int, help="passes over the held-out rows per stream")
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    plan = replace(plan, rate=args.rate or plan.rate, passes=args.passes or plan.passes)
    signal.signal(signal.SIGTERM, _stop)  # as Ctrl-C: the stack is stopped on the way out
    started = time.monotonic()
    models, sessions, x, y, broken = load_models(plan)
    streams = build_streams(plan, x, y)
    if not all_distinct(list(streams.values())):
        raise SystemExit("two queries of the run have the same input: the cache would answer one of them")
    total = sum(len(s) for s in streams.values())
    log(f"{plan}; {len(streams)} streams, {total} queries and as many feedback messages, every input distinct")
    world = World("state-quick" if args.quick else "state")
    world.start()
    try:
        linked = {e.name: world.register(e, models) for e in EXPERIMENTS}
        world.deploy_inactive(BEST, BROKEN_VERSION, broken)
        live = run_live(world, plan, streams, linked)
    finally:
        world.stop()
    log("replaying the same streams offline")
    results: dict[str, Any] = {}
    global_lag = 0
    for e in sorted(EXPERIMENTS, key=lambda e: e.per_user):  # the app-wide runs first: their lag serves below
        stream, run = streams[e.name], live["runs"][e.name]
        case = make_case(e, stream, run, live["linked"][e.name], predict(sessions, stream.x), global_lag)
        fault = len(stream) // 2 if e.kind == "fault" else None
        results[e.name] = analyse(case, plan.seeds, plan.window, fault)
        results[e.name]["switch"] = live["switches"].get(e.name, {})
        if e.name == "global-exp3":
            seen = lags(visible_from(run), np.array(run.query_at), np.array(run.feedback_at))
            global_lag = int(seen["queries"]["p50"])
        report.say(e.name, results[e.name])
    out = report.write(args.out, "live_selection_quick" if args.quick else "live_selection", plan, results, started)
    log(f"wrote {out[0]} and {out[1]} in {time.monotonic() - started:.0f} s")
    return 0


def _stop(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def make_case(
    e: Experiment, stream: Stream, run: LiveRun, models: list[str], preds: dict[str, np.ndarray], app_lag: int
) -> Case:
    n = len(stream)
    fault = n // 2 if e.kind == "fault" else n
    answers = {m: preds[m].copy() for m in models}
    answers[BEST][fault:] = preds[f"{BEST}:{BROKEN_VERSION}"][fault:]
    versions = {m: ["1"] * n for m in models}
    versions[BEST][fault:] = [BROKEN_VERSION] * (n - fault)
    return Case(e.name, e.policy, models, stream, answers, run, versions, app_lag)


if __name__ == "__main__":
    raise SystemExit(main())
