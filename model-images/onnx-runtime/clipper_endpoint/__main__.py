"""Run the model endpoint: ``python -m clipper_endpoint [--model-path PATH] [--port PORT] ...``.

The model is loaded before the server listens, so ``/ping`` answers 200 from its first request; a model that
cannot be loaded ends the process with status 2 and a message naming the problem. SageMaker starts the image
with no arguments (``serve``), so these options also have an environment variable, read when the option is not
given (an empty one is unset): ``CLIPPER_THREADS``, ``CLIPPER_PROVIDERS``, ``CLIPPER_INFERENCE``,
``CLIPPER_REQUIRE_CUDA``, ``CLIPPER_UNHEALTHY_AFTER_S``, ``CLIPPER_MODEL_SHA256``, ``CLIPPER_OUTPUT_NAME``,
``CLIPPER_MAX_BODY_BYTES``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from clipper_endpoint.app import INFERENCE_MODES as INFERENCE_CHOICES
from clipper_endpoint.model import CUDA

DEFAULT_MODEL_PATH = "/opt/ml/model"
DEFAULT_PORT = 8080
REQUIRE_CUDA_CHOICES = ("auto", "yes", "no")


def _default_port() -> int:
    value = os.environ.get("SAGEMAKER_BIND_TO_PORT", "")
    return int(value) if value.isdigit() else DEFAULT_PORT


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m clipper_endpoint",
        description="Serve one ONNX model over the SageMaker inference contract (GET /ping, POST /invocations).",
    )
    parser.add_argument(
        "--model-path",
        default=DEFAULT_MODEL_PATH,
        help=f"model.onnx, or a folder holding it (default: {DEFAULT_MODEL_PATH})",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=_default_port(),
        help=f"port to listen on (default: $SAGEMAKER_BIND_TO_PORT, else {DEFAULT_PORT})",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    parser.add_argument(
        "--sha256",
        default=os.environ.get("CLIPPER_MODEL_SHA256") or "",
        help="refuse a model file with another sha256 (default: $CLIPPER_MODEL_SHA256; empty: not checked)",
    )
    parser.add_argument(
        "--output-name",
        default=os.environ.get("CLIPPER_OUTPUT_NAME") or None,
        help="the model output to answer with (default: $CLIPPER_OUTPUT_NAME, else its first output)",
    )
    parser.add_argument(
        "--threads",
        default=os.environ.get("CLIPPER_THREADS") or "1",
        help="ONNX Runtime intra-op threads (default: $CLIPPER_THREADS, else 1)",
    )
    parser.add_argument(
        "--providers",
        default=os.environ.get("CLIPPER_PROVIDERS") or "",
        help="comma-separated ONNX Runtime execution providers, in order (default: $CLIPPER_PROVIDERS, else "
        "CUDAExecutionProvider when available, then CPUExecutionProvider)",
    )
    parser.add_argument(
        "--inference",
        default=os.environ.get("CLIPPER_INFERENCE") or "auto",
        help="where batches run: on the event loop (inline, cheapest for small models), on one worker thread "
        "(keeps /ping answering during long batches), or auto: inline on the CPU for a model whose warmed-up "
        "row takes under 0.2 ms, else the thread "
        "(default: $CLIPPER_INFERENCE, else auto)",
    )
    parser.add_argument(
        "--require-cuda",
        default=os.environ.get("CLIPPER_REQUIRE_CUDA") or "auto",
        help="yes: refuse to serve (exit 2) unless the model runs on the CUDA provider; no: serve wherever it "
        "runs; auto: yes when this machine has an NVIDIA GPU (/dev/nvidia0...), ONNX Runtime is its GPU build "
        "and --providers does not leave CUDA out (default: $CLIPPER_REQUIRE_CUDA, else auto)",
    )
    parser.add_argument(
        "--unhealthy-after-s",
        default=os.environ.get("CLIPPER_UNHEALTHY_AFTER_S") or "60",
        help="/ping answers 503 once every batch failed in the model for this long, at least 3 of them (a fault "
        "that persists in the process, such as a CUDA error: SageMaker replaces the instance); 0: never "
        "(default: $CLIPPER_UNHEALTHY_AFTER_S, else 60)",
    )
    parser.add_argument(
        "--max-body-bytes",
        default=os.environ.get("CLIPPER_MAX_BODY_BYTES") or str(64 * 1024 * 1024),
        help="largest request body accepted (default: $CLIPPER_MAX_BODY_BYTES, else 64 MiB)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--access-log", action="store_true", help="log every request (off: it costs throughput)")
    args = parser.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]

    def source(option: str, variable: str) -> str:  # where a bad value came from, for the message
        on_line = any(a == option or a.startswith(option + "=") for a in given)
        return option if on_line or not os.environ.get(variable) else f"{option} (from ${variable})"

    def whole(value: str, option: str, variable: str, what: str) -> int:
        text = value.strip()
        if not text.isdecimal() or not text.isascii() or int(text) < 1:
            parser.error(f"{source(option, variable)} must be a whole number {what}, not {text!r}")
        return int(text)

    args.threads = whole(args.threads, "--threads", "CLIPPER_THREADS", "of at least 1")
    args.max_body_bytes = whole(args.max_body_bytes, "--max-body-bytes", "CLIPPER_MAX_BODY_BYTES", "of bytes")
    try:
        args.unhealthy_after_s = float(args.unhealthy_after_s)
    except ValueError:
        args.unhealthy_after_s = -1.0
    if not 0 <= args.unhealthy_after_s < float("inf"):
        parser.error(
            f"{source('--unhealthy-after-s', 'CLIPPER_UNHEALTHY_AFTER_S')} must be a number of seconds, 0 or more"
        )
    args.inference = args.inference.strip().lower()
    if args.inference not in INFERENCE_CHOICES:
        parser.error(f"{source('--inference', 'CLIPPER_INFERENCE')} must be one of {', '.join(INFERENCE_CHOICES)}")
    args.require_cuda = args.require_cuda.strip().lower()
    if args.require_cuda not in REQUIRE_CUDA_CHOICES:
        parser.error(
            f"{source('--require-cuda', 'CLIPPER_REQUIRE_CUDA')} must be one of {', '.join(REQUIRE_CUDA_CHOICES)}"
        )
    return args


def requires_cuda(setting: str, providers: list[str] | None, gpu: bool, cuda_build: bool) -> bool:
    """``--require-cuda``: ``auto`` requires it where a GPU is present and ONNX Runtime is its GPU build (the
    image's), unless the providers asked for leave CUDA out (a deliberate CPU run); a checkout's CPU build on a
    machine that happens to have a GPU serves from the CPU as asked."""
    if setting == "auto":
        return gpu and cuda_build and (providers is None or CUDA in providers)
    return setting == "yes"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    import onnxruntime as ort
    import uvicorn

    from clipper_endpoint.app import create_app
    from clipper_endpoint.model import ModelLoadError, OnnxModel, gpu_present

    providers = [p.strip() for p in args.providers.split(",") if p.strip()] or None
    try:
        model = OnnxModel.load(
            args.model_path,
            output_name=args.output_name,
            threads=args.threads,
            providers=providers,
            sha256=args.sha256,
            require_cuda=requires_cuda(
                args.require_cuda, providers, gpu_present(), CUDA in ort.get_available_providers()
            ),
        )
    except ModelLoadError as e:
        logging.getLogger("clipper_endpoint").error("%s", e)
        return 2
    app = create_app(
        model,
        max_body_bytes=args.max_body_bytes,
        inference=args.inference,
        unhealthy_after_s=args.unhealthy_after_s,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        # SageMaker keeps connections open for up to 60 s between requests; outlive it.
        timeout_keep_alive=75,
        log_config=None,  # keep the logging configured above
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
