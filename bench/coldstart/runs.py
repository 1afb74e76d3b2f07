"""One cold start of a function or of the endpoint server, and checks of its answers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.coldstart.config import CHILD_TIMEOUT_S, ENDPOINT_PKG, ROOT
from bench.coldstart.imports import heavy_imports, not_run_by_events, parse_importtime
from bench.coldstart.procs import cpu_seconds, free_port, http_get, http_post, stop_process, vm_hwm_kb
from bench.coldstart.sources import BARE_ENDPOINT, CHILD
from bench.coldstart.world import World


def run_lambda(
    world: World, function: str, folder: Path, diag: bool = False, gc_what_if: bool = False
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    events_path, out_path = world.tmp / f"events-{tag}.json", world.tmp / f"out-{tag}.json"
    events = world.events(function)
    events_path.write_text(json.dumps(events))
    version_before = world.state_version() if function == "feedback" else 0
    env = {**world.env, "CS_DIR": str(folder), "CS_EVENTS": str(events_path), "CS_OUT": str(out_path)}
    if gc_what_if:
        env["CS_GC"] = "1"
    cmd = [sys.executable, "-c", CHILD]
    if diag:
        env["CS_DIAG"] = "1"
        cmd = [sys.executable, "-X", "importtime", "-c", CHILD]
    log_path = world.tmp / f"child-{function}-{tag}.log"
    with open(log_path, "wb") as out, open(world.tmp / f"importtime-{tag}.txt", "wb") as err:
        t_spawn = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=folder, stdout=out, stderr=err)
        try:
            rc = proc.wait(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{function} child ran over {CHILD_TIMEOUT_S} s (log {log_path})") from None
        except BaseException:  # Ctrl-C: the child goes too
            proc.kill()
            proc.wait()
            raise
    if rc != 0 or not out_path.exists():
        tail = (world.tmp / f"importtime-{tag}.txt").read_text()[-3000:]
        raise RuntimeError(f"{function} child ({folder.name}) failed with status {rc}:\n{tail}")
    r = json.loads(out_path.read_text())
    result = {
        "ready_s": r["t_ready"] - t_spawn,
        "first_event_s": r["t_first"] - t_spawn,
        "interpreter_start_s": r["t0"] - t_spawn,
        "ready_cpu_s": r["cpu_ready"],
        "first_event_cpu_s": r["cpu_first"],
        "first_event_ms": r["first_event_ms"],
        "warm_event_ms": r["warm_event_ms"],
        "peak_rss_mb": r["rss_first_kb"] / 1024,
        "rss_at_ready_mb": r["rss_ready_kb"] / 1024,
        "modules_at_ready": r["modules_at_ready"],
        "clients_created_during_events": r["clients_created_during_events"],
    }
    check_answers(world, function, folder, r["responses"], version_before, result)
    if diag:
        rows = parse_importtime((world.tmp / f"importtime-{tag}.txt").read_text())
        result["diag"] = {
            **heavy_imports(rows, at_ready=set(r["module_files"])),
            "not_run_by_first_events": not_run_by_events(rows, r),
            "connects_at_import": r["connects_at_import"],
            "modules_loaded_by_events": r["modules_loaded_by_events"],
        }
    for p in (events_path, out_path, log_path, world.tmp / f"importtime-{tag}.txt"):
        p.unlink(missing_ok=True)
    return result


def check_answers(
    world: World, function: str, folder: Path, responses: list[Any], version_before: int, result: dict[str, Any]
) -> None:
    """The events must have been answered, not failed (a benchmark of errors measures nothing)."""
    ours = folder == ROOT / "functions" / function
    for resp in responses:
        if function in ("frontend", "admin"):
            if resp.get("statusCode") != 200:
                raise RuntimeError(f"{function} ({folder.name}) answered {resp.get('statusCode')}: {resp.get('body')}")
            body = json.loads(resp["body"])
            if ours and function == "frontend":
                if body.get("default"):
                    raise RuntimeError(f"frontend answered the default output: {body}")
                result.setdefault("event_timings_ms", []).append(body["debug"]["timings_ms"])
        elif function == "model_updater":
            bad = [o for o in resp.get("outcomes", []) if o.get("status") not in ("registered", "duplicate")]
            if ours and (bad or not resp.get("outcomes")):
                raise RuntimeError(f"model updater did not register the upload: {resp}")
        elif resp.get("batchItemFailures"):
            raise RuntimeError(f"{function} ({folder.name}) failed records: {resp}")
    if ours and function == "feedback" and world.state_version() < version_before + 2:
        raise RuntimeError("feedback events did not update the bandit state")


def run_endpoint(world: World, mlp_path: str, bare: bool, diag: bool = False) -> dict[str, Any]:
    import io

    import numpy as np

    port = free_port()
    env = {**world.env, "PYTHONPATH": str(ENDPOINT_PKG)}
    flags = ["-X", "importtime"] if diag else []
    if bare:
        cmd = [sys.executable, *flags, "-c", BARE_ENDPOINT, mlp_path, str(port)]
    else:
        cmd = [sys.executable, *flags, "-m", "clipper_endpoint", "--model-path", mlp_path]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    err_path = world.tmp / f"endpoint-{port}.txt"
    buf = io.BytesIO()
    np.save(buf, np.asarray([world.row()], dtype=np.float32))
    body = buf.getvalue()
    with open(err_path, "wb") as err:
        t_spawn = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        try:
            end = t_spawn + CHILD_TIMEOUT_S
            while True:
                if proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"endpoint server did not start: {err_path.read_text()[-2000:]}")
                try:
                    if http_get(port, "/ping", timeout=0.5)[0] == 200:
                        break
                except OSError:
                    time.sleep(0.005)
            t_ready = time.monotonic()
            cpu_ready = cpu_seconds(proc.pid)
            status, _ = http_post(port, "/invocations", body, "application/x-npy")
            t_first = time.monotonic()
            status2, _ = http_post(port, "/invocations", body, "application/x-npy")
            t_warm = time.monotonic()
            if status != 200 or status2 != 200:
                raise RuntimeError(f"endpoint answered {status}/{status2}")
            hwm = vm_hwm_kb(proc.pid)
            cpu_first = cpu_seconds(proc.pid)
        finally:
            stop_process(proc)
    result: dict[str, Any] = {
        "ready_s": t_ready - t_spawn,
        "first_event_s": t_first - t_spawn,
        "ready_cpu_s": cpu_ready,
        "first_event_cpu_s": cpu_first,
        "first_event_ms": (t_first - t_ready) * 1000,
        "warm_event_ms": (t_warm - t_first) * 1000,
        "peak_rss_mb": hwm / 1024,
    }
    if diag:
        result["diag"] = heavy_imports(parse_importtime(err_path.read_text()))
    err_path.unlink(missing_ok=True)
    return result


# -- the benchmark -------------------------------------------------------------------------------------------
