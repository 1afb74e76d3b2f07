"""The local stack: the whole product on one machine, no Docker, no AWS account.

    make run            (PORT=8080 by default)

1. a moto server on loopback (AWS_ENDPOINT_URL points every boto3 client at it);
2. template.yaml translated offline and created in moto's CloudFormation, and one model stack
   (infra/model-stack.yaml) per demo model: the same tables, queues and bucket as on AWS;
3. redis-server on a private port when it is installed (reply channel), else DynamoDB;
4. per demo model: the ONNX Runtime endpoint server and a long-poll batcher driver beside it;
5. the registry seeded with the `digits` application and every demo model version;
6. the frontend (the same FastAPI app the Lambda handler wraps) on http://127.0.0.1:PORT;
7. the S3 -> model updater dispatch (infra/local/serving.py): an upload to the model bucket's
   models/<name>/<version>/model.onnx reaches the updater's handler through template.yaml's EventBridge rule,
   and each version it registers gets its own stack in moto and its own model server and batcher processes.

It prints a curl line that works, then runs until Ctrl-C (or SIGTERM), and stops every process it
started.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
STACK = "clipper"
DEMO_APP = "digits"
DEMO_MODEL = "mlp"


def log(msg: str) -> None:
    print(f"[local-stack] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status < 500:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{what} did not answer {url} within {timeout_s:.0f} s")


def local_parameters() -> dict[str, str]:
    """The template parameters of samconfig.toml's "local" environment (FeedbackMappingEnabled=false...)."""
    import shlex
    import tomllib

    config = tomllib.loads((REPO / "samconfig.toml").read_text())
    overrides = config.get("local", {}).get("deploy", {}).get("parameters", {}).get("parameter_overrides", "")
    return dict(item.split("=", 1) for item in shlex.split(overrides))


class LocalStack:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.state_dir = REPO / ".local-stack"
        self.state_dir.mkdir(exist_ok=True)
        self.env = dict(os.environ)
        self.env.update(
            {
                "AWS_ACCESS_KEY_ID": "local",
                "AWS_SECRET_ACCESS_KEY": "local",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_REGION": "us-east-1",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(
                    [str(REPO / "shared"), str(REPO), str(REPO / "model-images" / "onnx-runtime")]
                ),
            }
        )
        self.env.pop("AWS_PROFILE", None)
        self.serving: Any = None
        self.dispatcher: Any = None

    # -- processes -------------------------------------------------------------------------------------
    def spawn(
        self, name: str, cmd: list[str], env: dict[str, str] | None = None, supervised: bool = True
    ) -> subprocess.Popen[bytes]:
        """Start a process logging to .local-stack/<name>.log; a supervised one ends the stack when it exits
        (the per-version serving processes are LocalModelServing's to start and stop)."""
        logfile = open(self.state_dir / f"{name}.log", "wb")  # noqa: SIM115  (kept open by the child)
        proc = subprocess.Popen(cmd, env=env or self.env, stdout=logfile, stderr=subprocess.STDOUT, cwd=REPO)
        if supervised:
            self.procs.append((name, proc))
        return proc

    def stop_all(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.halt.set()
            self.dispatcher.join(timeout=5)
        if self.serving is not None:
            self.serving.stop_all()
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 10
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- steps -----------------------------------------------------------------------------------------
    def start_moto(self) -> str:
        port = free_port()
        proc = self.spawn("moto", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)])
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/moto-api/", proc, "moto server")
        self.env["AWS_ENDPOINT_URL"] = url
        os.environ.update(
            {
                k: self.env[k]
                for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
            }
        )
        log(f"moto server on {url}")
        return url

    def start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if self.args.no_redis or binary is None:
            log("redis-server not used: DynamoDB is the reply channel")
            self.env.pop("REDIS_URL", None)
            return
        port = free_port()
        proc = self.spawn(
            "redis",
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--maxmemory",
                "256mb",
                "--maxmemory-policy",
                "allkeys-lru",
            ],
        )
        end = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        self.env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        log(f"redis-server on 127.0.0.1:{port} (reply channel)")

    def deploy(self, models: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
        import boto3

        from infra.local import cfn

        clients = {s: boto3.client(s) for s in ("cloudformation", "s3", "dynamodb", "lambda")}
        log("creating the stack from template.yaml in moto's CloudFormation (translated offline)")
        parameters = {**local_parameters(), "RedisUrl": self.env.get("REDIS_URL", "")}
        outputs = cfn.deploy_service(clients, STACK, REPO, parameters)
        model_outputs = {}
        for m in models:
            model_outputs[m["name"]] = cfn.deploy_model_stack(clients["cloudformation"], STACK, m["name"])
            log(f"model stack for {m['name']}: queue {model_outputs[m['name']]['QueueUrl']}")
        return outputs, model_outputs

    def start_uploads(self, outputs: dict[str, str]) -> None:
        """The S3 -> model updater dispatch, and per-version serving for what it registers."""
        from infra.local.serving import start_uploads

        # the updater's handler module reads its settings from this process's environment
        os.environ.update({k: v for k, v in self.env.items() if k.startswith(("CLIPPER_", "POWERTOOLS_", "REDIS"))})
        self.serving, self.dispatcher = start_uploads(
            STACK,
            outputs,
            self.state_dir / "artifacts",
            lambda name, cmd: self.spawn(name, cmd, supervised=False),
            wait_http,
            free_port,
            self.args.slo_ms,
        )
        log(f"uploads to s3://{outputs['ModelBucketName']}/models/<name>/<version>/model.onnx reach the model updater")

    def start_models(self, models: list[dict[str, Any]], queues: dict[str, dict[str, str]]) -> dict[str, str]:
        endpoints = {}
        for m in models:
            port = free_port()
            path = str(Path(self.args.models) / m["path"])
            proc = self.spawn(
                f"endpoint-{m['name']}",
                [
                    sys.executable,
                    "-m",
                    "clipper_endpoint",
                    "--model-path",
                    path,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
            )
            endpoints[m["name"]] = f"http://127.0.0.1:{port}"
            wait_http(endpoints[m["name"]] + "/ping", proc, f"endpoint server for {m['name']}")
            self.spawn(
                f"batcher-{m['name']}",
                [
                    sys.executable,
                    "-m",
                    "clipper.batching.longpoll",
                    "--queue-url",
                    queues[m["name"]]["QueueUrl"],
                    "--endpoint-url",
                    endpoints[m["name"]],
                    "--slo-ms",
                    str(self.args.slo_ms / 2),
                    "--batch-wait-ms",
                    "1",
                    "--model",
                    m["name"],
                    "--version",
                    "1",
                ],
            )
            log(f"model {m['name']} (held-out accuracy {m['accuracy']:.3f}) served at {endpoints[m['name']]}")
        return endpoints

    def seed(self, models: list[dict[str, Any]], endpoints: dict[str, str], queues: dict[str, dict[str, str]]) -> None:
        import boto3

        from clipper.adapters.dynamodb_registry import DynamoDBRegistry
        from clipper.core.domain import Application, InputType, ModelVersion
        from clipper.errors import Conflict

        registry = DynamoDBRegistry(boto3.client("dynamodb"), self.env["CLIPPER_REGISTRY_TABLE"])
        slo = int(self.args.slo_ms * 1000)
        apps = [
            Application(DEMO_APP, InputType.FLOATS, "-1", slo, (64,)),
            Application(f"{DEMO_APP}-exp3", InputType.FLOATS, "-1", slo, (64,), policy="exp3"),
            Application(
                f"{DEMO_APP}-exp4", InputType.FLOATS, "-1", slo, (64,), policy="exp4", confidence_threshold=0.75
            ),
        ]
        for app in apps:
            try:
                registry.put_app(app)
            except Conflict:
                registry.put_app(app, overwrite=True)
        for m in models:
            registry.put_version(
                ModelVersion(
                    m["name"],
                    "1",
                    InputType.FLOATS,
                    queues[m["name"]]["QueueUrl"],
                    endpoints[m["name"]],
                    (64,),
                    ("demo",),
                ),
                activate=True,
            )
        registry.link(DEMO_APP, DEMO_MODEL)
        for app in apps[1:]:
            for m in models:
                registry.link(app.name, m["name"])
        log(
            f"registered {len(models)} demo models; application '{DEMO_APP}' (SLO {self.args.slo_ms:g} ms) "
            f"answers from '{DEMO_MODEL}'; '{DEMO_APP}-exp3' and '{DEMO_APP}-exp4' select among all of them "
            "and learn from POST /<app>/update"
        )

    def start_frontend(self) -> str:
        port = self.args.port
        if not port_is_free(port):
            raise RuntimeError(f"port {port} is in use: set PORT to a free one (make run PORT=8081)")
        proc = self.spawn(
            "frontend",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "infra.local.gateway:app",  # /admin/ -> the admin function's app, the rest -> the frontend's
                "--lifespan",
                "off",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-access-log",
                "--log-level",
                "warning",
            ],
        )
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc, "frontend")
        return url

    def run(self) -> int:
        manifest = json.loads((Path(self.args.models) / "manifest.json").read_text())
        models = manifest["models"]
        self.start_moto()
        self.start_redis()
        outputs, queues = self.deploy(models)
        self.env.update(
            {
                "CLIPPER_REGISTRY_TABLE": outputs["RegistryTableName"],
                "CLIPPER_REPLIES_TABLE": outputs["RepliesTableName"],
                "CLIPPER_CACHE_TABLE": outputs["CacheTableName"],
                "CLIPPER_SELECTION_TABLE": outputs["SelectionTableName"],
                "CLIPPER_FEEDBACK_QUEUE_URL": outputs["FeedbackQueueUrl"],
                "CLIPPER_MODEL_BUCKET": outputs["ModelBucketName"],
                "CLIPPER_CONFIG_TTL_S": "2",
                "POWERTOOLS_LOG_LEVEL": "WARNING",
                "POWERTOOLS_METRICS_DISABLED": "true",
                "CLIPPER_ADMIN_TOKEN": os.environ.get("CLIPPER_ADMIN_TOKEN") or secrets.token_urlsafe(18),
                # the admin function scales and deletes the per-version stacks (infra/model-stack.yaml)
                "CLIPPER_SERVICE_STACK_NAME": STACK,
                "CLIPPER_MODEL_STACK_TEMPLATE": str(REPO / "infra" / "model-stack.yaml"),
            }
        )
        endpoints = self.start_models(models, queues)
        self.spawn("feedback", [sys.executable, "-m", "clipper.feedback", "--queue-url", outputs["FeedbackQueueUrl"]])
        self.seed(models, endpoints, queues)
        self.start_uploads(outputs)
        url = self.start_frontend()
        import numpy as np

        holdout = np.load(Path(self.args.models) / manifest["dataset"]["holdout"])
        sample = [int(v) for v in holdout["X"][0]]
        body = json.dumps({"input": sample})
        answer = self.query(url, body)
        log(f"sample query answered: {answer} (label {int(holdout['y'][0])})")
        (self.state_dir / "env.json").write_text(
            json.dumps({k: v for k, v in self.env.items() if k.startswith(("CLIPPER_", "AWS_", "REDIS"))})
        )
        print(
            f"\nClipper local stack ready: {url}  (logs in .local-stack/, Ctrl-C stops everything)\n"
            f"  curl -s -X POST {url}/{DEMO_APP}/predict -H 'Content-Type: application/json' -d '{body}'\n"
            f"  OpenAPI: {url}/docs (queries), {url}/admin/docs (management)\n"
            f"  admin:   export CLIPPER_URL={url} CLIPPER_ADMIN_TOKEN={self.env['CLIPPER_ADMIN_TOKEN']}\n",
            flush=True,
        )
        return self.watch()

    @staticmethod
    def query(url: str, body: str) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{url}/{DEMO_APP}/predict", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            result: dict[str, Any] = json.loads(r.read())
        return result

    def watch(self) -> int:
        while True:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    log(f"{name} exited with status {proc.returncode}; see .local-stack/{name}.log")
                    return 1
            if self.serving is not None:
                self.serving.reconcile()  # replica counts and deleted versions, as the admin API set them
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run the Clipper local stack")
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    p.add_argument("--models", default=str(REPO / "build" / "models"), help="demo models folder")
    p.add_argument("--slo-ms", type=float, default=float(os.environ.get("CLIPPER_DEMO_SLO_MS", "500")))
    p.add_argument("--no-redis", action="store_true", help="use DynamoDB as reply channel even with Redis")
    args = p.parse_args(argv)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[local-stack] %(message)s"))
    logging.getLogger("clipper.local").addHandler(handler)
    logging.getLogger("clipper.local").setLevel(logging.INFO)
    stack = LocalStack(args)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        return stack.run()
    except KeyboardInterrupt:
        log("stopping")
        return 0
    except Exception as e:  # a failed start still stops what was started
        log(f"failed: {e}")
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stack.stop_all()
        log("all processes stopped")


if __name__ == "__main__":
    sys.exit(main())
