"""Queries from the command line: ``clipper predict`` and ``clipper update``, honouring the application's input
type and shape (read from the admin API when a token is at hand; without one, guessed from the input).

    clipper predict digits --input '[0, 0, 5, 13, ...]'
    clipper predict digits --npy rows.npy              # one input, or an input_batch of several
    clipper predict sentiment --input 'a fine day'     # a strings app: the text as given
    clipper predict images --file cat.jpg              # a bytes app: the file, base64-encoded
    clipper update digits-exp3 --uid 7 --input '[...]' --label 1

It prints the answer's JSON (query_id, output, default, default_explanation); a default answer is also said on
stderr. Feedback is Clipper's: the input and its true label (the query API keys it by input, not by query id).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clipper.cli.files import load_npy
from clipper.client import AdminError, ClipperConnection
from clipper.client_query import QueryError, batch, shaped


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, what in (("predict", "one query (or a batch) to an application"), ("update", "feedback: a label")):
        q = sub.add_parser(name, help=what)
        q.add_argument("app")
        given = q.add_mutually_exclusive_group(required=True)
        given.add_argument("--input", help="a JSON list, @file.json, text (strings app) or base64 (bytes app)")
        several = ", or several (an input_batch)" if name == "predict" else " (one feedback, one input)"
        given.add_argument("--npy", help=f"a .npy: one input of the app's shape{several}")
        given.add_argument("--file", help="a file's bytes (for a bytes app)")
        q.add_argument("--uid", help="Clipper's user id (bandit state per user); sent as typed: 007 is not 7")
        if name == "predict":
            q.add_argument("--debug", action="store_true", help="the models, timings and cache hits too")
        else:
            q.add_argument("--label", required=True, help="the true label (a number, or text)")
            q.add_argument("--feedback-id", help="a key of yours: the same feedback sent again with it is applied once")


@dataclass(frozen=True)
class Declared:
    """What the application declares about its input, when the admin API tells it (no token: both None)."""

    input_type: str | None = None
    input_shape: list[int] | None = None


def declared(conn: ClipperConnection, app: str) -> Declared:
    try:
        info = conn.get_app_info(app)
    except AdminError:  # no token, or no such app: the query API says so
        return Declared()
    return Declared(str(info["input_type"]), info.get("input_shape") or None)


def read_input(args: argparse.Namespace, app: Declared) -> Any:
    """The input the command line names, as the application wants it: text for a strings app, base64 text or a
    file's bytes for a bytes app, numbers as one input or a batch by the declared shape."""
    if args.file:
        if app.input_type not in (None, "bytes", "strings"):
            raise SystemExit(
                f"clipper: --file: a file's bytes are an input of a bytes (or strings) application, and "
                f"{args.app} takes {app.input_type}: give its numbers with --input @file.json or --npy"
            )
        data = Path(args.file).read_bytes()
        return data if app.input_type in (None, "bytes") else data.decode()
    if args.npy:
        value = shaped(load_npy(args.npy, "--npy"), app.input_shape)
        return value.inputs[0] if isinstance(value, batch) and len(value.inputs) == 1 else value
    text: str = args.input
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as e:
            raise SystemExit(f"clipper: --input {text}: {e.strerror or e}") from None
    if app.input_type in ("strings", "bytes"):
        return text  # a bytes app's input is base64 text, as the query API takes it
    try:
        value = json.loads(text)
    except ValueError:
        if app.input_type is None:
            return text  # not JSON: text, for a strings app
        raise SystemExit(f"clipper: --input: a JSON list of {app.input_type} expected, got {text[:40]!r}") from None
    return shaped(value, app.input_shape)


def _uid(raw: str | None) -> str | None:
    """The user id as typed: the API takes 7 and "7" as one user, so the text is always that user, while an
    integer made of it was another ("007" became 7) or refused (past 64 bits)."""
    return raw


def run(args: argparse.Namespace, conn: ClipperConnection) -> int:
    value = read_input(args, declared(conn, args.app))
    if args.command == "update":
        if isinstance(value, batch):  # refused before any request, as the API would (an exit of 2)
            raise SystemExit(f"clipper: update: one input per feedback; --npy holds {len(value.inputs)} inputs")
        label: Any = args.label
        with contextlib.suppress(ValueError):  # else a text label
            label = json.loads(label)
        try:
            answer = conn.update(args.app, value, label, _uid(args.uid), args.feedback_id)
        except QueryError as e:
            key = e.feedback_id or e.detail.get("retry_feedback_id")  # no answer, or the queue did not confirm it
            if key:  # the server's cause names the JSON field; on the command line it is an option
                print(f"clipper: send it again with --feedback-id {key} to have it applied once", file=sys.stderr)
            raise
        print(json.dumps(answer, indent=2))
        return 0
    answer = conn.predict(args.app, value, _uid(args.uid), args.debug)
    print(json.dumps(answer, indent=2))
    answers = answer.get("batch_predictions", [answer])
    for a in answers:
        if a.get("default"):
            print(
                f"clipper: default output for query {a.get('query_id')}: {a.get('default_explanation')}",
                file=sys.stderr,
            )
    return 0
