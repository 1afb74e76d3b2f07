"""The local stack: the whole product on one machine, no Docker, no AWS account.

    make run                 (PORT=8080, QUEUE=redis by default; FRESH=1 starts from a clean state)

1. a moto server on loopback (AWS_ENDPOINT_URL points every boto3 client at it);
2. redis-server (reply channel, cache, and the request queues on Redis Streams; QUEUE=sqs keeps moto's SQS for
   them), its append-only file in the state folder;
3. template.yaml translated offline and created in moto's CloudFormation, and one model stack
   (infra/model-stack.yaml) per demo model: the same tables, queues and bucket as on AWS;
4. what the last run kept (``infra/local/state.py``) put back: registry, bandit states, uploaded models;
5. per demo model: the ONNX Runtime endpoint server and a long-poll batcher driver beside it; the feedback worker;
6. the demo applications and models, registered when missing (changes made to them are kept);
7. the S3 -> model updater dispatch (``infra/local/uploads.py``), and the processes of every uploaded version;
8. the frontend (the same FastAPI apps the Lambda handlers wrap) on http://127.0.0.1:PORT.

Every process is supervised (``infra/local/supervisor.py``): one that dies is started again, on its port, after a
back-off, and ``processes.json`` says so; nothing one process does stops the stack. It prints a curl line that
works, then runs until Ctrl-C (or SIGTERM), and stops every process in order: frontend, batchers, model servers,
feedback worker, the upload dispatcher, redis, moto. The state folder (``.local-stack/``, or
``CLIPPER_LOCAL_STATE_DIR``) holds the state, ``logs/<process>.log``, ``requests.log`` and ``processes.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

STARTED = time.monotonic()
REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "shared"), str(REPO)]
from infra.local.state import port_is_free  # noqa: E402  (stdlib only: the port is checked before any import)

STACK = "clipper"
# The niceness of redis-server, the batchers and the model servers with Redis Streams queues (--backend-nice). On one
# shared core (bench/README.md, "Front door"), 5 against 0 over ten alternating pairs of MLP trials: p50 12 % and p99
# 10 % lower at 1,000 q/s, 20 % and 21 % at 1,250; 10 (three pairs) passed fewer trials, as did 3 or redis-server alone.
# The CNN, whose model server is the busiest process, pays in its tail (p99 at 150 q/s 58 -> 74 ms, passes alike).
BACKEND_NICE = 5
logger = logging.getLogger("clipper.local")


def log(msg: str) -> None:
    logger.info("%s", msg)


def wait_http(url: str, alive: Callable[[], str | None], what: str, timeout_s: float = 60) -> None:
    """Wait until ``url`` answers; ``alive`` returns why the process is gone (None while it runs)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        gone = alive()
        if gone:
            raise RuntimeError(f"{what} {gone}")
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


@contextlib.contextmanager
def state_lock(folder: Path) -> Iterator[None]:
    """One stack per state folder: a second one fails at once instead of mixing their state."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise SystemExit(
                f"[local-stack] another local stack (pid {f.read().strip() or '?'}) uses {folder}: stop it first, "
                "or give this one its own folder (CLIPPER_LOCAL_STATE_DIR)"
            ) from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        yield


@contextlib.contextmanager
def foreground_terminal() -> Iterator[None]:
    """Under ``make run`` in a terminal, take the terminal's foreground for this process alone, so a Ctrl-C
    reaches the stack (which stops in order and exits 0), not make (which would die of it and report an error).
    The children run in process groups of their own and never see it. Nothing changes without a terminal or
    when this process already leads the foreground group (started by a shell, not by make)."""
    try:
        tty = os.open("/dev/tty", os.O_RDWR)
    except OSError:
        yield
        return
    before = os.getpgrp()
    took = False
    try:
        if os.tcgetpgrp(tty) == before and before != os.getpid():
            os.setpgid(0, 0)
            _set_foreground(tty, os.getpgrp())
            took = True
            # Ctrl-Z would stop this process alone, with make waiting for it and the shell for make: ignored
            signal.signal(signal.SIGTSTP, signal.SIG_IGN)
        yield
    finally:
        if took:
            with contextlib.suppress(OSError):
                _set_foreground(tty, before)
        os.close(tty)


def _set_foreground(tty: int, group: int) -> None:
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may not take it otherwise
    try:
        os.tcsetpgrp(tty, group)
    finally:
        signal.signal(signal.SIGTTOU, previous)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Run the Clipper local stack")
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    p.add_argument("--models", default=str(REPO / "build" / "models"), help="demo models folder")
    p.add_argument("--slo-ms", type=float, default=float(os.environ.get("CLIPPER_DEMO_SLO_MS", "500")))
    p.add_argument(
        "--queue",
        choices=["sqs", "redis"],
        default=os.environ.get("CLIPPER_QUEUE_TRANSPORT") or "redis",
        help="request queues: moto's SQS, or Redis Streams",
    )
    p.add_argument(
        "--background-nice",
        type=int,
        choices=range(20),
        metavar="0-19",
        default=os.environ.get("CLIPPER_LOCAL_BACKGROUND_NICE") or None,  # a string default goes through type
        help="CPU niceness of the work no query waits for: moto's server (the emulated AWS), the feedback worker and "
        "this launcher's background threads (the state copy and replica follow, the upload dispatch) (default: 19 "
        "with Redis Streams queues, so their bursts never hold up a query; 0 with --queue sqs, where every query "
        "goes through moto)",
    )
    p.add_argument(
        "--backend-nice",
        type=int,
        choices=range(20),
        metavar="0-19",
        default=os.environ.get("CLIPPER_LOCAL_BACKEND_NICE") or None,
        help="CPU niceness of the processes behind the frontend on a query's path: redis-server, the batchers and "
        "the model servers (default: 5 with Redis Streams queues, so on a busy core the frontend, the one event "
        "loop every query crosses twice, is not preempted by each of them as they wake; 0 with --queue sqs)",
    )
    p.add_argument(
        "--state-dir",
        default=os.environ.get("CLIPPER_LOCAL_STATE_DIR") or str(REPO / ".local-stack"),
        help="what the stack keeps across restarts, its logs and processes.json",
    )
    p.add_argument("--fresh", action="store_true", help="start from a clean state (the state folder is emptied)")
    p.add_argument("--snapshot-s", type=float, default=5.0, help="how often moto's state is copied when changed")
    p.add_argument("--check-port", action="store_true", help="only check that the port is free, then exit")
    p.add_argument("--clean-state", action="store_true", help="only empty the state folder (not while in use)")
    args = p.parse_args(argv)
    if not 1 <= args.slo_ms <= 30_000:  # the admin API's bounds of an application's SLO (schemas.MIN_SLO_MICROS)
        p.error(f"--slo-ms (CLIPPER_DEMO_SLO_MS): the demo applications' SLO, 1 to 30000 ms, got {args.slo_ms:g}")
    if args.background_nice is None:
        args.background_nice = 19 if args.queue == "redis" else 0
    if args.backend_nice is None:
        args.backend_nice = BACKEND_NICE if args.queue == "redis" else 0
    return args


def preflight(args: argparse.Namespace) -> str | None:
    """What keeps the stack from starting, found before anything starts."""
    if not port_is_free(args.port):
        return f"port {args.port} is in use: stop what listens there, or pick another one (make run PORT=8081)"
    if args.check_port:
        return None
    if shutil.which("redis-server") is None:
        return (
            "redis-server is not installed: `make run` installs it (make redis), "
            "or install it yourself (apt-get install redis-server)"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = None if args.clean_state else preflight(args)
    if problem:
        print(f"[local-stack] {problem}", file=sys.stderr, flush=True)
        return 2
    if args.check_port:
        return 0
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[local-stack] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # aws-sam-translator warns from a destructor about metrics it never publishes (nothing to publish offline)
    logging.getLogger("samtranslator").setLevel(logging.ERROR)
    # the upload dispatch prints each upload's outcome ("[local-stack] upload ...: rejected ..."); the updater's own
    # warning reached the terminal too, unprefixed (Python's last-resort handler)
    logging.getLogger("clipper.models.updater").setLevel(logging.ERROR)
    state_dir = Path(args.state_dir).resolve()
    if args.clean_state:
        with state_lock(state_dir):
            clear_state(state_dir)
        return 0
    with state_lock(state_dir), foreground_terminal():
        if args.fresh:
            clear_state(state_dir)
        from infra.local.stack import LocalStack

        stack = LocalStack(args, state_dir, STACK, REPO, wait_http, local_parameters)

        def on_signal(signum: int, _frame: Any) -> None:
            if not stack.ready.is_set():
                raise KeyboardInterrupt  # abandon the start; what started is stopped below
            stack.stop_requested = True  # watch() sees it within 0.1 s (no lock taken in a handler)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, on_signal)
        try:
            stack.start(STARTED)
            stack.watch()
            log("stopping")
            return 0
        except KeyboardInterrupt:
            log("stopping")
            return 0
        except Exception as e:  # a failed start still stops what was started
            logger.exception("failed: %s", e)
            return 1
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            stack.stop()
            log("all processes stopped")


def clear_state(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.name == "lock":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    log(f"clean state: {folder} emptied")


if __name__ == "__main__":
    sys.exit(main())
