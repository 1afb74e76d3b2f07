"""``LocalStack``: starts the local stack's processes in order, keeps it running, stops it in order
(``infra/local/run.py`` is the command; its docstring says what starts when).

Faults it handles while running, besides the supervisor's restarts:
- moto exits: its state is gone with it. The supervisor starts it again on its port; then the stack is created in
  it again (the same names: ``cfn.with_physical_names``), the last snapshot is put back, the upload rule is
  connected again and the uploaded versions' stacks are created again; the processes keep running (their calls
  fail meanwhile: moto is gated, every request but the restore's answered 503 until it is done, ``gate``, so none
  sees the stack's tables empty). The snapshot is not taken while moto is being restored, so an empty emulator
  never overwrites the last good copy; what changed after that copy (a few seconds) is lost.
- redis exits: it starts again on its port with its append-only file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import boto3

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.adapters.resp import RespClient
from clipper.entrypoints.feedback_worker import LOCAL_DURABLE_KEY_ENV, LOCAL_LOST_KEY_ENV
from infra.local import aof, demo, gate
from infra.local.serving import LocalModelServing, Replica
from infra.local.state import SNAPSHOT_TABLES, Ports, Snapshot, repoint_endpoints
from infra.local.supervisor import Child, ChildSpec, Stage, Supervisor, lower_thread_priority

logger = logging.getLogger("clipper.local")
# The time up to which moto's state is copied to disk (set after each copy): the feedback worker acknowledges a
# message once its effects are older (``clipper.entrypoints.feedback_worker``), so a kill -9 of the stack, which takes
# moto's memory with it, loses no accepted feedback: the message comes back and is applied to the restored state.
DURABLE_KEY = "clipper:local:durable-at"
# "<from> <to>": moto died at <to>, and what it held since the copy begun at <from> is lost (its restore put that copy
# back): the worker lets the feedback it applied in that time come back to be applied again
LOST_KEY = "clipper:local:lost"

# The processes behind the frontend on a query's path: they start at --backend-nice (replicas, deployed versions and
# restarts too)
BACKEND_STAGES = frozenset({Stage.REDIS, Stage.BATCHERS, Stage.SERVERS})
RECONCILE_S = 2.0  # how often the replica counts and deleted versions the admin API set are applied


class LocalStack:
    def __init__(
        self,
        args: argparse.Namespace,
        state_dir: Path,
        stack: str,
        repo: Path,
        wait_http: Callable[..., None],
        parameters: Callable[[], dict[str, str]],
    ) -> None:
        self.args, self.dir, self.name, self.repo = args, state_dir, stack, repo
        self._wait_http, self._parameters = wait_http, parameters
        self.ports = Ports(state_dir / "ports.json")
        self.supervisor = Supervisor(state_dir / "logs", state_dir / "processes.json", cwd=repo)
        self.env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                [str(repo / "shared"), str(repo), str(repo / "model-images" / "onnx-runtime")]
            ),
            "CLIPPER_QUEUE_TRANSPORT": args.queue,
            # the batchers' receives ahead: Redis Streams' default (none, the batching thread receives); on moto's
            # SQS one, where AWS has four (moto serialises concurrent receives: more would only cost CPU)
            **({"CLIPPER_BATCHER_RECEIVERS": "1"} if args.queue == "sqs" else {}),
        }
        self.env.pop("AWS_PROFILE", None)
        manifest = json.loads((Path(args.models) / "manifest.json").read_text())
        self.manifest, self.models = manifest, manifest["models"]
        self.outputs: dict[str, str] = {}
        self.queues: dict[str, dict[str, str]] = {}
        self.serving: LocalModelServing | None = None
        self.dispatcher: Any = None
        self.snapshot: Snapshot | None = None
        self.ready = threading.Event()  # started: a signal now stops it instead of abandoning the start
        self.stopping = threading.Event()
        # set by the signal handler (``stopping`` is then set by ``watch``): a handler that set the event itself ran
        # wherever this thread was, possibly inside the event's own lock, and a second signal there waited forever
        self.stop_requested = False
        self.state_ready = threading.Event()  # moto holds the restored state: the snapshot may be taken
        self._moto_generation = 0
        self._snapshot_failing = False  # the state copy could not be written (said once while it lasts)
        self._last_copy_began = 0.0  # the time the last copy written began (DURABLE_KEY)
        self._keys_client: RespClient | None = None  # DURABLE_KEY's and LOST_KEY's writes

    # -- ProcessHost (LocalModelServing's processes) ---------------------------------------------------
    def spawn(self, name: str, cmd: list[str], stage: Stage, env: dict[str, str] | None = None, **hooks: Any) -> Child:
        if self.stopping.is_set():
            raise RuntimeError(f"{name} not started: the stack is stopping")
        if stage in BACKEND_STAGES:
            hooks.setdefault("nice", self.args.backend_nice)
        return self.supervisor.start(ChildSpec(name, cmd, dict(env or self.env), stage, **hooks))

    def stop_children(self, names: list[str]) -> None:
        self.supervisor.stop(names, forget=True)

    def is_stopping(self) -> bool:
        return self.stopping.is_set()

    def port(self, name: str) -> int:
        return self.ports.assign(name)

    def wait_ready(self, url: str, child: Child, what: str, timeout_s: float = 60) -> None:
        proc = child.proc  # this launch: the child exiting (and being restarted) fails the wait

        def gone() -> str | None:
            code = proc.poll() if proc is not None else None
            if code is None and child.proc is proc:
                return None
            return f"exited (status {code}) while starting; see {child.log_path}"

        self._wait_http(url, gone, what, timeout_s)

    # -- start -----------------------------------------------------------------------------------------
    def start(self, since: float | None = None) -> None:
        """Start everything; ``since``: the monotonic time the command started (for the ready line)."""
        started = since if since is not None else time.monotonic()
        self.supervisor.start_thread()
        self.start_moto()
        self.start_redis()
        with gate.passing():
            self.deploy(announce=True)
            self.snapshot = self._snapshot()
            if self.snapshot.exists:
                counts = self.snapshot.restore()
                log(f"state of the last run restored: {counts}")
        gate.open_gate(self.env["AWS_ENDPOINT_URL"])
        self.state_ready.set()
        endpoints = demo.start_models(self, self.models, self.queues, Path(self.args.models), self.args.slo_ms)
        self.spawn(
            "feedback",
            [
                sys.executable,
                "-m",
                "clipper.entrypoints.feedback_worker",
                "--queue-url",
                self.outputs["FeedbackQueueUrl"],
            ],
            Stage.WORKERS,
            # with the feedback queue on Redis, a message is acknowledged once moto's state copy holds what it did
            env={**self.env, LOCAL_DURABLE_KEY_ENV: DURABLE_KEY, LOCAL_LOST_KEY_ENV: LOST_KEY}
            if self.args.queue == "redis"
            else None,
            nice=self.args.background_nice,
        )
        registry = DynamoDBRegistry(boto3.client("dynamodb"), self.env["CLIPPER_REGISTRY_TABLE"])
        demo.seed(registry, self.models, self.queues, endpoints, self.args.slo_ms)
        self.start_uploads(endpoints)
        url = self.start_frontend()
        self.say_ready(url, time.monotonic() - started)
        self.ready.set()

    def start_moto(self) -> None:
        port = self.port("moto")
        url = f"http://127.0.0.1:{port}"
        moto = self.spawn(
            "moto",
            [sys.executable, "-m", "infra.local.moto_server", "-H", "127.0.0.1", "-p", str(port), "--gated"],
            Stage.MOTO,
            on_exit=self._moto_exited,
            on_restart=self._moto_restarted,
            nice=self.args.background_nice,
        )
        self.wait_ready(url + "/moto-api/", moto, "moto server")
        self.env["AWS_ENDPOINT_URL"] = url
        keys = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
        os.environ.update({k: self.env[k] for k in keys})
        if boto3.DEFAULT_SESSION is None:
            boto3.setup_default_session()
        gate.install(boto3.DEFAULT_SESSION)  # the restore's requests pass moto's closed gate (``gate.passing``)
        log(f"moto server on {url}")

    def start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make run installs it)")
        port = self.port("redis")
        folder = self.dir / "redis"
        folder.mkdir(exist_ok=True)
        # volatile-lru: what expires (replies, cache entries) makes room; request queues and what else has no
        # TTL are never evicted
        options = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", ""]
        options += ["--appendonly", "yes", "--appendfsync", "everysec", *aof.REDIS_OPTIONS]  # rewrites: infra.local.aof
        options += ["--maxmemory", "256mb", "--maxmemory-policy", "volatile-lru"]
        redis = self.spawn("redis", [binary, *options], Stage.REDIS, folders=(folder,))
        self._wait_port(port, redis, "redis-server")
        self.env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        what = "reply channel, cache" + (", request queues" if self.args.queue == "redis" else "")
        log(f"redis-server on 127.0.0.1:{port} ({what}; append-only file in {folder})")

    def _wait_port(self, port: int, child: Child, what: str) -> None:
        import socket

        end = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                if child.record.last_exit is not None or time.monotonic() > end:
                    raise RuntimeError(f"{what} did not start; see {child.log_path}") from None
                time.sleep(0.05)

    def deploy(self, announce: bool = False) -> None:
        """The stack from template.yaml and the demo models' stacks, in moto (again after it restarted)."""
        from infra.local import cfn

        clients = {s: boto3.client(s) for s in ("cloudformation", "s3", "dynamodb", "lambda")}
        if announce:
            log("creating the stack from template.yaml in moto's CloudFormation (translated offline)")
        parameters = {**self._parameters(), "RedisUrl": self.env["REDIS_URL"]}
        self.outputs = cfn.deploy_service(clients, self.name, self.repo, parameters, physical_names=True)
        for m in self.models:
            self.queues[m["name"]] = cfn.deploy_model_stack(clients["cloudformation"], self.name, m["name"])
            if announce:
                log(f"model stack for {m['name']}: queue {self.queues[m['name']]['QueueUrl']}")
        if announce:
            self._configure()

    def _configure(self) -> None:
        o = self.outputs
        self.env.update(
            {
                "CLIPPER_REGISTRY_TABLE": o["RegistryTableName"],
                "CLIPPER_REPLIES_TABLE": o["RepliesTableName"],
                "CLIPPER_CACHE_TABLE": o["CacheTableName"],
                "CLIPPER_SELECTION_TABLE": o["SelectionTableName"],
                "CLIPPER_FEEDBACK_QUEUE_URL": o["FeedbackQueueUrl"],
                "CLIPPER_FEEDBACK_DEAD_LETTER_QUEUE_URL": o["FeedbackDeadLetterQueueUrl"],
                "CLIPPER_MODEL_BUCKET": o["ModelBucketName"],
                # how soon a switch reaches the frontends and batchers: 2 s unless the environment says otherwise
                "CLIPPER_CONFIG_TTL_S": os.environ.get("CLIPPER_CONFIG_TTL_S", "2"),
                # one process answers every request here: a flood of made-up names must not starve the others
                "CLIPPER_UNKNOWN_APP_READS_PER_S": os.environ.get("CLIPPER_UNKNOWN_APP_READS_PER_S", "20"),
                # one process that keeps running: what queries used stays fresh while none comes (60 s after)
                "CLIPPER_KEEP_WARM_S": os.environ.get("CLIPPER_KEEP_WARM_S", "60"),
                "POWERTOOLS_LOG_LEVEL": "WARNING",
                "POWERTOOLS_METRICS_DISABLED": "true",
                "CLIPPER_ADMIN_TOKEN": admin_token(self.dir),
                # the admin function scales and deletes the per-version stacks (infra/model-stack.yaml)
                "CLIPPER_SERVICE_STACK_NAME": self.name,
                "CLIPPER_MODEL_STACK_TEMPLATE": str(self.repo / "infra" / "model-stack.yaml"),
            }
        )
        # the updater's handler module (in this process) reads its settings from this process's environment
        os.environ.update({k: v for k, v in self.env.items() if k.startswith(("CLIPPER_", "POWERTOOLS_", "REDIS"))})

    def _snapshot(self) -> Snapshot:
        from infra.local.cfn import stack_resources

        resources = stack_resources(boto3.client("cloudformation"), self.name)
        tables = {logical: resources[logical] for logical in SNAPSHOT_TABLES}
        bucket = self.outputs["ModelBucketName"]
        return Snapshot(self.dir / "state", boto3.client("dynamodb"), boto3.client("s3"), tables, bucket)

    def start_uploads(self, demo_endpoints: dict[str, str]) -> None:
        """The S3 -> model updater dispatch, and the processes of every version uploaded in an earlier run; the
        demo models' processes (``demo_endpoints``: their servers, by model) are followed with them."""
        from infra.local.serving import local_serving
        from infra.local.uploads import start_uploads

        self.serving = local_serving(self.name, self.outputs, self.dir / "artifacts", self, self.args.slo_ms)
        for m in self.models:  # the demo versions' processes stop after their delete too, and scale
            name = m["name"]
            replica = Replica(f"endpoint-{name}", f"batcher-{name}", demo_endpoints[name])
            path = Path(self.args.models) / m["path"]
            self.serving.adopt(name, "1", self.queues[name]["QueueUrl"], path, replica)
        self.dispatcher = start_uploads(self.name, self.outputs, self.serving, self.args.background_nice)
        bucket = self.outputs["ModelBucketName"]
        log(f"uploads to s3://{bucket}/models/<name>/<version>/model.onnx reach the model updater")
        restored = self.serving.restore()
        if restored:
            log(f"uploaded versions served again: {', '.join(restored)}")
        replayed = self.dispatcher.replay_lost()
        if replayed:
            log(f"uploads whose events were lost at the last stop, handed to the model updater: {', '.join(replayed)}")
        moved = self.ports.moved_urls()
        if moved:
            n = repoint_endpoints(boto3.client("dynamodb"), self.env["CLIPPER_REGISTRY_TABLE"], moved)
            log(f"{n} registered endpoint(s) now on other ports (theirs were taken): {moved}")

    def start_frontend(self) -> str:
        port = self.args.port
        env = {
            **self.env,
            "CLIPPER_LOCAL_PROCESSES_FILE": str(self.dir / "processes.json"),
            "CLIPPER_LOCAL_REQUEST_LOG": str(self.dir / "requests.log"),
        }
        command = [sys.executable, "-m", "uvicorn", "infra.local.gateway:app", "--lifespan", "off"]
        command += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"]
        frontend = self.spawn("frontend", command, Stage.FRONTEND, env)
        url = f"http://127.0.0.1:{port}"
        self.wait_ready(url + "/health", frontend, "frontend")
        return url

    def say_ready(self, url: str, took_s: float) -> None:
        body, label = demo.sample_query(Path(self.args.models), self.manifest)
        try:
            log(f"sample query answered: {demo.query(url, demo.APP, body)} (label {label})")
        except OSError as e:
            log(f"sample query not answered: {e}")
        keep = ("CLIPPER_", "AWS_", "REDIS")
        # `clipper logs` finds a state folder other than the repository's .local-stack by this variable
        default = self.dir.resolve() == (self.repo / ".local-stack").resolve()
        where = "" if default else f" CLIPPER_LOCAL_STATE_DIR={shlex.quote(str(self.dir))}"
        (self.dir / "env.json").write_text(json.dumps({k: v for k, v in self.env.items() if k.startswith(keep)}))
        print(
            f"\nClipper local stack ready in {took_s:.0f} s: {url}  (state, logs: {self.dir}; Ctrl-C stops it)\n"
            f"  curl -s -X POST {url}/{demo.APP}/predict -H 'Content-Type: application/json' -d '{body}'\n"
            f"  OpenAPI: {url}/docs (queries), {url}/admin/docs (management)\n"
            f"  admin:   export CLIPPER_URL={url} CLIPPER_ADMIN_TOKEN={self.env['CLIPPER_ADMIN_TOKEN']}{where}\n"
            f"  logs:    tail -f {self.dir}/logs/*.log {self.dir}/requests.log; processes: {self.dir}/processes.json\n",
            flush=True,
        )

    # -- running ---------------------------------------------------------------------------------------
    def watch(self) -> None:
        """Until a signal: follow the registry (replicas, deleted versions) and see whether Redis's append-only file
        is due a rewrite (``infra.local.aof``) every ``RECONCILE_S``, copy moto's state when it changed every
        ``--snapshot-s``. They run on a thread of their own at the background niceness (no query waits for them);
        this thread waits for the signal."""
        follower = threading.Thread(target=self._follow, name="stack-follow", daemon=True)
        follower.start()
        while not (self.stop_requested or self.stopping.is_set()):
            time.sleep(0.1)
        self.stopping.set()
        follower.join(timeout=10)

    def _follow(self) -> None:
        lower_thread_priority(self.args.background_nice, "stack-follow")
        snapshot_at = time.monotonic() + self.args.snapshot_s
        reconcile_at = time.monotonic()
        compactor = aof.AofCompactor(RespClient.from_url(self.env["REDIS_URL"]))
        while not self.stopping.wait(0.5):
            if not self.state_ready.is_set():
                continue
            try:
                if time.monotonic() >= reconcile_at:
                    reconcile_at = time.monotonic() + RECONCILE_S
                    if self.serving is not None:
                        self.serving.reconcile()  # replica counts and deleted versions, as the admin API set them
                    compactor.tick()  # Redis's append-only file, rewritten when it is quiet
                if time.monotonic() >= snapshot_at:
                    snapshot_at = time.monotonic() + self.args.snapshot_s
                    self.take_snapshot()
            except Exception:  # this thread copies the state out and applies replica changes: it goes on
                logger.exception("stack-follow pass failed; going on")

    def take_snapshot(self) -> None:
        """Copy moto's state out (what changed), then tell the feedback worker up to when its work is on disk
        (``DURABLE_KEY``: the time the copy began reading)."""
        if self.snapshot is None or not self.state_ready.is_set():
            return
        generation = self._moto_generation
        began = time.time()
        try:
            self.snapshot.take(lambda: self.state_ready.is_set() and generation == self._moto_generation)
        except OSError as e:  # the state folder: a full disk, or removed under the stack
            if not self._snapshot_failing:
                logger.warning("the state copy could not be written (%s): the last copy stays; tried again", e)
            self._snapshot_failing = True
            return
        except Exception as e:  # moto went away meanwhile: the last copy stays
            logger.debug("snapshot not taken: %s", e)
            return
        if self._snapshot_failing:
            self._snapshot_failing = False
            logger.info("the state copy is written again")
        if self.args.queue == "redis" and self.state_ready.is_set() and generation == self._moto_generation:
            self._last_copy_began = began  # (a copy that moto's restart cut short wrote nothing: no mark)
            self._set_local_key(DURABLE_KEY, repr(began))

    def _set_local_key(self, key: str, value: str) -> None:
        try:
            if self._keys_client is None:  # one client (a pool) for every copy's mark, not a connection each
                self._keys_client = RespClient.from_url(self.env["REDIS_URL"])
            self._keys_client.execute([("SET", key, value)], timeout=1.0)
        except Exception as e:  # redis down: the worker holds its acknowledgements meanwhile
            logger.debug("%s not set: %s", key, e)

    def _moto_exited(self, code: int) -> None:
        self.state_ready.clear()
        self._moto_generation += 1
        if self.ready.is_set() and not self.stopping.is_set():
            logger.warning("moto's state went with it: the last snapshot is restored once it is back")
        if self.args.queue == "redis":
            # what was applied since the last copy began is gone with it: the feedback worker must not acknowledge
            # it when the next copy (of the restored state) passes it, but let it come back to be applied again
            self._set_local_key(LOST_KEY, f"{self._last_copy_began!r} {time.time()!r}")

    def _moto_restarted(self) -> None:
        """Create the stack in the restarted moto and put the last snapshot back; tried again (1 s, 2 s, ... 30 s
        apart) until it works, moto dies again (its next restart takes over) or the stack stops."""
        while not self.ready.wait(1.0):  # died while the stack was starting: restored once the start is done
            if self.stopping.is_set():
                return
        if self.stopping.is_set():
            return
        generation = self._moto_generation
        attempt = 0
        while generation == self._moto_generation and not self.stopping.is_set():
            attempt += 1
            try:
                with gate.passing():
                    self._restore_moto()
            except Exception as e:  # moto died again, or a transient failure
                logger.warning("moto not restored yet (try %d): %s", attempt, e)
                self.stopping.wait(min(30.0, 2.0 ** (attempt - 1)))
                continue
            if self._open_gate(generation):
                self.state_ready.set()
                logger.info("moto restored: the stack, the last snapshot and the uploaded versions' stacks")
            return

    def _open_gate(self, generation: int) -> bool:
        """Open the restored moto's gate, tried again on its own (the restore is not repeated: its stack exists
        now) until it opens, moto dies again (a moto started since is closed and not restored: left closed for its
        own restore) or the stack stops."""
        attempt = 0
        while generation == self._moto_generation and not self.stopping.is_set():
            attempt += 1
            try:
                gate.open_gate(self.env["AWS_ENDPOINT_URL"])
                return True
            except OSError as e:
                logger.warning("moto's gate not opened yet (try %d): %s", attempt, e)
                self.stopping.wait(min(5.0, 0.25 * 2 ** (attempt - 1)))
        return False

    def _restore_moto(self) -> None:
        from infra.local.uploads import connect_uploads

        child = self.supervisor.get("moto")
        assert child is not None
        self.wait_ready(f"{self.env['AWS_ENDPOINT_URL']}/moto-api/", child, "moto server")
        self.deploy()
        assert self.snapshot is not None
        self.snapshot.restore()
        connect_uploads(self.name, self.outputs["ModelBucketName"])
        if self.serving is not None:
            self.serving.recreate_stacks()
        if self.dispatcher is not None:  # the queue of upload events went with moto
            replayed = self.dispatcher.replay_lost()
            if replayed:
                logger.info("uploads whose events went with moto, handed to the model updater: %s", ", ".join(replayed))

    # -- stop ------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop in order: frontend, batchers, model servers, feedback worker, the upload dispatcher (after a last
        copy of moto's state), redis, moto."""
        self.stopping.set()
        if self.dispatcher is not None:
            self.dispatcher.halt.set()  # no new upload starts processes from here on
        sup = self.supervisor
        for stage in (Stage.FRONTEND, Stage.BATCHERS, Stage.SERVERS):
            sup.stop_stage(stage)
        self.take_snapshot()  # the feedback worker acknowledges at its stop what this copy holds
        sup.stop_stage(Stage.WORKERS)
        if self.dispatcher is not None and not self.dispatcher.finish(timeout_s=10):
            logger.warning("an upload was still being handled after 10 s when the stack stopped")
        self.take_snapshot()
        if self.args.queue == "sqs":
            self._say_feedback_dropped()
        for stage in (Stage.REDIS, Stage.MOTO):
            sup.stop_stage(stage)
        sup.halt()

    def _say_feedback_dropped(self) -> None:
        """With ``QUEUE=sqs`` the feedback queue is moto's, whose messages no copy keeps: say how many accepted
        feedback messages were not applied yet and go with it (with Redis Streams' queues they survive)."""
        url = self.outputs.get("FeedbackQueueUrl")
        if not url:
            return
        try:
            left = unapplied(boto3.client("sqs"), url)
        except Exception as e:  # moto gone already: nothing to count
            logger.info("the feedback queue's depth not read at stop: %s", e)
            return
        if left:
            logger.warning(
                "%d accepted feedback message(s) not applied yet are dropped with moto's SQS (QUEUE=sqs); with the "
                "default Redis Streams queues they would be applied after the restart",
                left,
            )


# SQS's counts of a queue's messages not deleted: visible, received and in flight, delayed
QUEUE_COUNTS = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)


def unapplied(sqs: Any, queue_url: str) -> int:
    """The messages of an SQS queue not deleted yet (visible, in flight or delayed)."""
    attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=list(QUEUE_COUNTS))["Attributes"]
    return sum(int(attrs.get(name, 0)) for name in QUEUE_COUNTS)


def log(msg: str) -> None:
    logger.info("%s", msg)


def write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    f: IO[str]
    with os.fdopen(fd, "w") as f:
        f.write(text)


def admin_token(state_dir: Path) -> str:
    """CLIPPER_ADMIN_TOKEN when set, else the token of the last run (kept in the state folder), else a new one."""
    if os.environ.get("CLIPPER_ADMIN_TOKEN"):
        return os.environ["CLIPPER_ADMIN_TOKEN"]
    path = state_dir / "admin-token"
    with contextlib.suppress(OSError):
        token = path.read_text().strip()
        if token:
            return token
    token = secrets.token_urlsafe(18)
    write_private(path, token)
    return token
