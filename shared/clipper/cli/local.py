"""The local stack's processes and logs from the command line (``make run`` keeps them in its state folder,
``.local-stack/`` or ``$CLIPPER_LOCAL_STATE_DIR``): ``clipper logs``, and the processes ``clipper inspect`` shows.

    clipper logs                  # every process: status, restarts, log file
    clipper logs batcher-mlp      # the last 40 lines of its log
    clipper logs requests -f      # the front door's request log, followed
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"a number of lines, 0 or more; got {text!r}")
    return n


def state_dir(given: str | None = None) -> Path:
    return Path(given or os.environ.get("CLIPPER_LOCAL_STATE_DIR") or ".local-stack")


def processes(folder: Path) -> list[dict[str, Any]] | None:
    """The supervisor's processes.json; None when there is no local stack here."""
    try:
        return list(json.loads((folder / "processes.json").read_text())["processes"])
    except (OSError, ValueError, KeyError):
        return None


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lg = sub.add_parser("logs", help="the local stack's processes and their logs (a process's, or 'requests')")
    lg.add_argument("process", nargs="?", help="a process name (see `clipper logs`), or 'requests'")
    lg.add_argument("-n", "--lines", type=_count, default=40, help="how many of the last lines (0 or more)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing what is appended (Ctrl-C stops)")
    lg.add_argument(
        "--state-dir", help="the local stack's state folder (default: $CLIPPER_LOCAL_STATE_DIR or .local-stack)"
    )


def log_path(folder: Path, process: str) -> Path:
    return folder / "requests.log" if process == "requests" else folder / "logs" / f"{process}.log"


def run_logs(args: argparse.Namespace) -> int:
    folder = state_dir(args.state_dir)
    if not args.process:
        listed = processes(folder)
        if listed is None:  # no stack there (as no API at a URL: 1), not a bad argument (2)
            print(
                f"clipper: no local stack state in {folder}: run this from where `make run` runs, or name its state "
                "folder (--state-dir, or CLIPPER_LOCAL_STATE_DIR as make run had it)",
                file=sys.stderr,
            )
            return 1
        width = max(len(p["name"]) for p in listed) if listed else 8
        for p in listed:
            log = log_path(folder, p["name"])
            print(f"{p['name']:<{width}}  {p['status']:<10} restarts {p.get('restarts', 0):<3} {log}")
        print(f"{'requests':<{width}}  {'':<10} {'':<12} {log_path(folder, 'requests')}")
        return 0
    path = log_path(folder, args.process)
    if not path.exists():
        if not (folder / "logs").is_dir():
            raise SystemExit(
                f"clipper: no local stack state in {folder}: run this from where `make run` runs, or name its state "
                "folder (--state-dir, or CLIPPER_LOCAL_STATE_DIR as make run had it)"
            )
        known = sorted(p.stem for p in (folder / "logs").glob("*.log"))
        raise SystemExit(f"clipper: no log {path}; processes: {', '.join([*known, 'requests'])}")
    with path.open("rb") as f:
        lines = f.readlines()[-args.lines :] if args.lines > 0 else []
        sys.stdout.write(b"".join(lines).decode(errors="replace"))
        sys.stdout.flush()
        if args.follow:
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how following ends: quietly, status 0
                follow(f)
    return 0


def follow(f: BinaryIO) -> None:
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two reads
    while True:
        chunk = f.read()
        if chunk:
            sys.stdout.write(text.decode(chunk))
            sys.stdout.flush()
        else:
            time.sleep(0.25)
