"""The ``clipper`` command: its parser and the exit codes (0 done; 1 the API is unreachable, unavailable (5xx: try
again), not Clipper's (no JSON), or a request could not be signed (no AWS credentials); 2 refused by the API
(4xx); 3 a deployment or a version that failed its check or was rejected).

Admin requests carry the admin token (the local stack) or a SigV4 signature (a deployed stack): ``--auth`` /
``CLIPPER_AUTH`` and ``--region`` / ``CLIPPER_REGION``, as :mod:`clipper.client_auth` says."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from clipper.cli import admin, local, query, report
from clipper.cli.tables import canary_table, inspect_table, metrics_table
from clipper.client import AdminError, BadUrl, ClipperConnection
from clipper.client_auth import AUTH_MODES, SigningError
from clipper.client_query import ApiError
from clipper.cost import cli as cost_cli
from clipper.errors import ClipperError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clipper", description="Clipper serverless: the management API, queries and the local stack."
    )
    p.add_argument("--url", help="the API's address (default: $CLIPPER_URL)")
    p.add_argument("--token", help="the admin token (default: $CLIPPER_ADMIN_TOKEN)")
    p.add_argument(
        "--auth",
        choices=AUTH_MODES,
        help="token: the admin token (the local stack); sigv4: sign admin requests with AWS credentials (a deployed "
        "stack); auto: sigv4 for an execute-api URL when no token is given (default: $CLIPPER_AUTH, else auto)",
    )
    p.add_argument("--region", help="the AWS region SigV4 signs for (default: $CLIPPER_REGION, else the URL's)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    admin.add_parsers(sub)
    query.add_parsers(sub)
    local.add_parsers(sub)
    report.add_parser(sub)
    report.add_selection_parser(sub)
    cost_cli.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `clipper ... | head`: the reader has gone; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:  # Ctrl-C while waiting (a deploy, a slow answer): no traceback
        print("clipper: interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:
        if isinstance(e.code, str):  # a bad argument or file on the command line, named by the message: refused
            print(e.code, file=sys.stderr)
            return 2
        raise


def _main(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    if args.command == "cost":  # local: no API call
        return cost_cli.run(args)
    if args.command == "logs":
        return local.run_logs(args)
    try:
        conn = ClipperConnection(args.url, args.token, auth=args.auth, region=args.region)
    except (SigningError, BadUrl) as e:  # CLIPPER_AUTH not one of the modes, a URL without http(s)://
        print(f"clipper: {e}", file=sys.stderr)
        return 2
    try:
        if args.command in ("predict", "update"):
            return query.run(args, conn)
        if args.command == "report":
            return report.run(args, conn)
        if args.command == "selection":
            return report.run_selection(args, conn)
        if args.command == "inspect":
            state = conn.inspect_instance()
            processes = _local_processes(conn)
            if args.json:
                print(json.dumps({**state, "processes": processes} if processes is not None else state, indent=2))
            else:
                print(inspect_table(state, processes))
            return 0
        result = admin.run(args, conn)
    except ApiError as e:  # refused (4xx); unreachable, unavailable (5xx), not Clipper's API, or not signed
        print(f"clipper: {e}", file=sys.stderr)
        return 2 if 400 <= e.status < 500 else 1
    except ClipperError as e:  # a deployment that failed its check or was rejected
        print(f"clipper: {e}", file=sys.stderr)
        return 3
    except BrokenPipeError:
        raise  # the reader of the output has gone (main's), not a file of the command line
    except OSError as e:  # a file named on the command line
        print(f"clipper: {e}", file=sys.stderr)
        return 2
    if args.command == "metrics":
        print(metrics_table(result))
        return 0
    if args.command == "canary" and not args.json and "events" in result:  # the status, not an action's answer
        print(canary_table(result))
        return 0
    print(json.dumps(result, indent=2))
    if args.command == "model" and isinstance(result, dict) and result.get("status") == "rejected":
        print(f"clipper: {args.name}:{args.version} was rejected", file=sys.stderr)
        return 3
    return 0


def _local_processes(conn: ClipperConnection) -> list[Any] | None:
    """The processes the local stack's gateway lists; None on AWS, or when its /metrics does not answer."""
    try:
        return conn.get_local_processes()
    except AdminError:
        return None
