"""Run the model endpoint: ``python -m clipper_endpoint [--model-path PATH] [--port PORT] ...``.

The model is loaded before the server listens, so ``/ping`` answers 200 from its first request; a model that
cannot be loaded ends the process with status 2 and a message naming the problem.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

DEFAULT_MODEL_PATH = "/opt/ml/model"
DEFAULT_PORT = 8080


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
        default=os.environ.get("CLIPPER_MODEL_SHA256", ""),
        help="refuse a model file with another sha256 (default: $CLIPPER_MODEL_SHA256; empty: not checked)",
    )
    parser.add_argument("--output-name", help="the model output to answer with (default: its first output)")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default: 1)")
    parser.add_argument(
        "--providers",
        help="comma-separated ONNX Runtime execution providers, in order "
        "(default: CUDAExecutionProvider when available, then CPUExecutionProvider)",
    )
    parser.add_argument(
        "--inference",
        choices=["auto", "inline", "thread"],
        default="auto",
        help="where batches run: on the event loop (inline, cheapest for small models), on one worker thread "
        "(keeps /ping answering during long batches), or auto: the thread when on CUDA, else inline",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=64 * 1024 * 1024,
        help="largest request body accepted (default: 64 MiB)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--access-log", action="store_true", help="log every request (off: it costs throughput)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    import uvicorn

    from clipper_endpoint.app import create_app
    from clipper_endpoint.model import ModelLoadError, OnnxModel

    providers = [p.strip() for p in args.providers.split(",") if p.strip()] if args.providers else None
    try:
        model = OnnxModel.load(
            args.model_path, output_name=args.output_name, threads=args.threads, providers=providers, sha256=args.sha256
        )
    except ModelLoadError as e:
        logging.getLogger("clipper_endpoint").error("%s", e)
        return 2
    app = create_app(model, max_body_bytes=args.max_body_bytes, inference=args.inference)
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
