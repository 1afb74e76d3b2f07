"""The model endpoint on a GPU: throughput and latency against batch size, with ONNX Runtime's CUDA provider.

It builds (or reuses) the heavy benchmark CNN (``infra/demo/cnn_model.py``: 3x32x32 images, ~5-10 ms an
image on one CPU thread), starts the endpoint server (``python -m clipper_endpoint``) with
``--providers CUDAExecutionProvider,CPUExecutionProvider``, checks on ``GET /metadata`` which provider the
session really uses (ONNX Runtime falls back to the CPU when CUDA cannot start: recorded as
``"fell_back_to_cpu": true``), then for each batch size sends ``.npy`` requests to ``POST /invocations``
(closed loop, ``--concurrency`` requests in flight) for ``--seconds`` (at most ``--max-requests``), after
a few warm-up requests per size (CUDA picks its kernels for each new shape), and reports requests, p50 /
p99 / mean latency and rows/s.

On a machine without a GPU, or with an ONNX Runtime build without CUDA (the ``onnxruntime`` wheel; the GPU
one is ``onnxruntime-gpu``), it serves on the CPU and writes ``"device": "cpu"``; ``--quick`` (batch sizes 1,
4, 16, a few requests each) is the smoke test for such a machine.

Needs: numpy, onnx (to build the CNN), onnxruntime or onnxruntime-gpu, uvicorn, starlette (the endpoint's
requirements, ``model-images/onnx-runtime/requirements.txt``). Run from the repository root:

    python bench/gpu_endpoint.py            # on the GPU machine: batch sizes 1..256, ~25 s on an H100
    .venv/bin/python bench/gpu_endpoint.py --quick   # smoke test anywhere, under a minute on 2 CPU cores

Writes bench/results/gpu_endpoint.json (``--out`` to change). ``--plot A.json [B.json ...]`` draws reports
already written (rows/s and p50 / p99 latency against batch size, one line per report) into
bench/results/gpu_endpoint.png (``--png`` to change), measuring nothing; matplotlib is a dev dependency.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ENDPOINT_PKG = ROOT / "model-images" / "onnx-runtime"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
FULL_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_SIZES = (1, 4, 16)
WARMUP_REQUESTS = 3


def log(msg: str) -> None:
    print(f"[bench-gpu-endpoint] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/x-npy", "Accept": "application/x-npy"} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read()


def model_path(out_dir: Path) -> tuple[Path, str]:
    """The heavy CNN when ``infra/demo/cnn_model.py`` exists, else the demo MLP (said in the results)."""
    try:
        from infra.demo.cnn_model import ensure_cnn
    except ImportError:
        from infra.demo.train_models import ensure_models

        manifest = ensure_models(out_dir, log=lambda line: None)
        mlp = next(m for m in manifest["models"] if m["name"] == "mlp")
        return Path(manifest["out_dir"]) / mlp["path"], "mlp (infra/demo/cnn_model.py is absent: the demo MLP)"
    return Path(ensure_cnn(out_dir)), "cnn (infra/demo/cnn_model.py: VGG-style, 3x32x32 float32)"


def gpu_info() -> dict[str, Any] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError) as e:
        return {"error": f"nvidia-smi failed: {e}"}
    name, driver, memory = [part.strip() for part in out.splitlines()[0].split(",")]
    return {"name": name, "driver": driver, "memory": memory}


class Endpoint:
    """The endpoint server as a process, stopped on exit (also on error or Ctrl-C)."""

    def __init__(self, model: Path, providers: list[str], threads: int) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ENDPOINT_PKG), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "clipper_endpoint", "--model-path", str(model), "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--providers", ",".join(providers), "--threads", str(threads)]
        cmd += ["--log-level", "warning", "--require-cuda", "no"]  # a CUDA fallback is recorded here, not refused
        self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.stderr: list[bytes] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def wait_ready(self, timeout_s: float = 180) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                tail = b"".join(self.stderr[-20:]).decode(errors="replace")
                raise RuntimeError(f"endpoint server exited with {self.proc.returncode}:\n{tail}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                if request(conn, "GET", "/ping")[0] == 200:
                    conn.close()
                    return time.monotonic() - started
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"endpoint server did not answer /ping within {timeout_s:.0f} s")

    def metadata(self) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        status, body = request(conn, "GET", "/metadata")
        conn.close()
        if status != 200:
            raise RuntimeError(f"/metadata answered {status}")
        result: dict[str, Any] = json.loads(body)
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def measure(port: int, body: bytes, rows: int, seconds: float, max_requests: int, concurrency: int) -> dict[str, Any]:
    """Closed loop: ``concurrency`` clients, each sending the next request when its answer is read."""
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[str] = []
    warmed = threading.Barrier(concurrency + 1)
    go = threading.Event()
    window = {"deadline": 0.0}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            for _ in range(WARMUP_REQUESTS):
                request(conn, "POST", "/invocations", body)
        finally:
            warmed.wait()
        go.wait()
        sent = 0
        while True:
            with lock:
                if len(latencies) >= max_requests or (sent and time.perf_counter() > window["deadline"]):
                    break
            t0 = time.perf_counter()
            status, answer = request(conn, "POST", "/invocations", body)
            elapsed = time.perf_counter() - t0
            sent += 1
            if status != 200:
                errors.append(f"{status}: {answer[:200]!r}")
                break
            out = np.load(io.BytesIO(answer), allow_pickle=False)
            if len(out) != rows:
                errors.append(f"{len(out)} output rows for {rows} input rows")
                break
            with lock:
                latencies.append(elapsed)
        conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    warmed.wait()  # every client has sent its warm-up requests
    started = time.perf_counter()
    window["deadline"] = started + seconds
    go.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"batch of {rows}: {errors[0]}")
    ms = np.asarray(latencies) * 1000
    return {
        "batch_size": rows,
        "requests": len(latencies),
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "mean_ms": round(float(ms.mean()), 3),
        "rows_per_s": round(rows * len(latencies) / wall, 1),
        "requests_per_s": round(len(latencies) / wall, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="batch sizes 1, 4, 16 and a few requests each")
    p.add_argument("--batch-sizes", help="comma-separated (default 1,2,4,...,256; --quick: 1,4,16)")
    p.add_argument("--seconds", type=float, help="measuring time per batch size (default 3; --quick 1)")
    p.add_argument("--max-requests", type=int, help="requests per batch size at most (default 2000; --quick 10)")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight (default 1)")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads of the server (CPU)")
    p.add_argument("--out", help="default bench/results/gpu_endpoint.json (--quick: gpu_endpoint_quick.json)")
    p.add_argument("--plot", nargs="+", metavar="JSON", help="draw these reports into --png, measure nothing")
    p.add_argument("--png", default=str(ROOT / "bench" / "results" / "gpu_endpoint.png"))
    args = p.parse_args()
    if args.plot:
        reports = [json.loads(Path(f).read_text()) for f in args.plot]
        plot(reports, Path(args.png))
        log(f"wrote {args.png} from {len(reports)} report(s)")
        return 0
    sizes = (
        [int(b) for b in args.batch_sizes.split(",")]
        if args.batch_sizes
        else (QUICK_SIZES if args.quick else FULL_SIZES)
    )
    seconds = args.seconds if args.seconds is not None else (1.0 if args.quick else 3.0)
    max_requests = args.max_requests if args.max_requests is not None else (10 if args.quick else 2000)
    started = time.monotonic()

    import onnxruntime as ort

    available = ort.get_available_providers()
    cuda_built = CUDA in available
    providers = [CUDA, CPU] if cuda_built else [CPU]
    if not cuda_built:
        log(f"this ONNX Runtime ({ort.__version__}) has no CUDA provider (have {available}): serving on the CPU")
    model, model_name = model_path(ROOT / "build" / "models")
    log(f"model: {model_name} at {model.relative_to(ROOT) if model.is_relative_to(ROOT) else model}")
    endpoint = Endpoint(model, providers, args.threads)
    results: list[dict[str, Any]] = []
    try:
        ready_s = endpoint.wait_ready()
        meta = endpoint.metadata()
        in_use = meta.get("providers", [])
        device = "cuda" if in_use and in_use[0] == CUDA else "cpu"
        log(f"endpoint ready in {ready_s:.1f} s; providers in use {in_use}; inference {meta.get('inference')}")
        row_shape = [d if isinstance(d, int) and d > 0 else 1 for d in meta["input"]["shape"][1:]]
        dtype = np.dtype(meta["input"]["dtype"])
        rng = np.random.default_rng(0)
        for rows in sizes:
            batch = rng.standard_normal((rows, *row_shape)).astype(dtype)
            buf = io.BytesIO()
            np.save(buf, batch, allow_pickle=False)
            r = measure(endpoint.port, buf.getvalue(), rows, seconds, max_requests, args.concurrency)
            results.append(r)
            log(
                f"batch {rows:4d}: {r['requests']:5d} requests, p50 {r['p50_ms']:8.2f} ms, p99 {r['p99_ms']:8.2f} ms, "
                f"{r['rows_per_s']:10.1f} rows/s"
            )
    finally:
        endpoint.stop()
    best = max(results, key=lambda r: r["rows_per_s"]) if results else None
    report = {
        "device": device,
        "providers_requested": providers,
        "providers_in_use": in_use,
        "cuda_provider_built": cuda_built,
        "fell_back_to_cpu": cuda_built and device != "cuda",
        "gpu": gpu_info(),
        "model": model_name,
        "input": {"shape": meta["input"]["shape"], "dtype": meta["input"]["dtype"]},
        "inference_mode": meta.get("inference"),
        "endpoint_ready_s": round(ready_s, 2),
        "quick": args.quick,
        "concurrency": args.concurrency,
        "threads": args.threads,
        "seconds_per_size": seconds,
        "max_requests_per_size": max_requests,
        "results": results,
        "best_rows_per_s": best,
        "onnxruntime": ort.__version__,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    # a smoke run never replaces the recorded GPU figures (the README quotes them)
    name = "gpu_endpoint_quick.json" if args.quick else "gpu_endpoint.json"
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    if best:
        log(f"device {device}; best {best['rows_per_s']:.0f} rows/s at batch {best['batch_size']}")
    log(f"wrote {out} in {report['elapsed_s']:.0f} s")
    return 0


def label(report: dict[str, Any]) -> str:
    where = (report.get("gpu") or {}).get("name") or "CPU"
    return f"{where}, {report['device']}, {report['concurrency']} in flight (ORT {report['onnxruntime']})"


def plot(reports: list[dict[str, Any]], path: Path) -> None:
    """Rows/s (left) and p50 / p99 latency (right) against batch size, one line per report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    for report in reports:
        rows = report["results"]
        sizes = [r["batch_size"] for r in rows]
        line = rate.plot(sizes, [r["rows_per_s"] for r in rows], marker="o", label=label(report))[0]
        lat.plot(sizes, [r["p50_ms"] for r in rows], marker="o", color=line.get_color(), label=f"p50, {label(report)}")
        lat.plot(sizes, [r["p99_ms"] for r in rows], marker="x", linestyle="--", color=line.get_color(), label="p99")
    for ax in (rate, lat):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows per request (batch size)")
        ax.grid(True, alpha=0.3)
    rate.set_yscale("log")
    rate.set_ylabel("rows/s (log scale)")
    rate.set_title("Model endpoint throughput")
    lat.set_ylabel("request latency (ms)")
    lat.set_title("Model endpoint latency, HTTP included")
    rate.legend(fontsize=7)
    lat.legend(fontsize=7)
    fig.suptitle(reports[0]["model"], fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
