"""The management API's commands (the same operations as the Python client)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from clipper.cli.files import load_estimator, load_npy
from clipper.client import ClipperConnection


def number(text: str) -> float:
    """A float option: a finite number (argparse names the option when this refuses); ``nan`` and ``inf``, which
    Python's float() takes, were sent on and refused with a confusing bound ('greater than 0')."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number, e.g. 0.1; got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"a finite number; got {text!r}")
    return value


POLICY_PARAMS = ("eta", "gamma", "epsilon", "k", "loss_scale")
CANARY_PARAMS = (
    ("alpha", number, "chance of rolling back a canary as good as the active version (default 0.05)"),
    ("beta", number, "chance of promoting a canary worse by the margin (default 0.10)"),
    ("margin", number, "the loss-rate difference called worse (default 0.05)"),
    ("min_feedback", int, "feedback labels each version needs before the loss test (default 50)"),
    ("max_feedback", int, "canary labels after which the side the evidence leans to wins (default 5000)"),
)


def input_shape(text: str) -> list[int]:
    """``--input-shape``: comma-separated positive dimensions (argparse names the option when this refuses)."""
    try:
        dims = [int(d) for d in text.split(",")]
    except ValueError:
        dims = []
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"comma-separated positive integers, e.g. 64 or 3,32,32; got {text!r}")
    return dims


def _canary_options(p: argparse.ArgumentParser) -> None:
    for name, kind, what in CANARY_PARAMS:
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, help=what)


def _canary_params(args: argparse.Namespace) -> dict[str, float]:
    return {name: getattr(args, name) for name, _, _ in CANARY_PARAMS if getattr(args, name) is not None}


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser("ping", help="is the management API up (and the token right)")
    sub.add_parser("apps", help="list applications").add_argument("-v", "--verbose", action="store_true")
    sub.add_parser("app", help="one application").add_argument("name")
    r = sub.add_parser("register-app", help="register an application")
    r.add_argument("name")
    r.add_argument("input_type", choices=["integers", "floats", "doubles", "bytes", "strings"])
    r.add_argument("default_output")
    r.add_argument("slo_micros", type=int)
    r.add_argument("--input-shape", type=input_shape, help="e.g. 64 or 3,32,32")
    r.add_argument("--policy", default="single", choices=["single", "epsilon_greedy", "exp3", "exp4"])
    sp = sub.add_parser("set-policy", help="change an application's selection policy")
    sp.add_argument("name")
    sp.add_argument("policy", choices=["single", "epsilon_greedy", "exp3", "exp4"])
    sp.add_argument("--confidence-threshold", type=number)
    sp.add_argument(
        "--default-when-unsure",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="exp4: answer the default output when the confidence is under the threshold (--no-...: say "
        "low_confidence instead); omitted: as it is",
    )
    pp = sub.add_parser("policy-params", help="an application's policy parameters (set them with options)")
    pp.add_argument("name")
    pp.add_argument("--eta", type=number, help="exp3's and exp4's learning rate")
    pp.add_argument("--gamma", type=number, help="exp3's exploration (each model gets gamma / K)")
    pp.add_argument("--epsilon", type=number, help="epsilon_greedy's share of random choices")
    pp.add_argument("--k", type=int, help="exp4: how many of the heaviest models answer")
    pp.add_argument(
        "--loss-scale",
        type=number,
        help="every policy: the absolute error of a score (a regression output) that counts as a whole loss (1)",
    )
    pp.add_argument("--default", nargs="+", default=[], choices=POLICY_PARAMS, help="back to the policy's default")
    sub.add_parser("delete-app", help="delete an application and its links").add_argument("name")
    sub.add_parser("models", help="list model versions").add_argument("-v", "--verbose", action="store_true")
    m = sub.add_parser("model", help="one model version")
    m.add_argument("name")
    m.add_argument("version")
    d = sub.add_parser("add-model", help="register a model version")
    d.add_argument("name")
    d.add_argument("version")
    d.add_argument("input_type", choices=["integers", "floats", "doubles", "bytes", "strings"])
    d.add_argument("--input-shape", type=input_shape, help="e.g. 64 or 3,32,32")
    d.add_argument("--queue-url")
    d.add_argument("--endpoint")
    d.add_argument("--no-activate", action="store_true", help="deploy without making it current")
    dp = sub.add_parser("deploy", help="check, upload and register a model (.onnx, or a scikit-learn pickle)")
    dp.add_argument("name")
    dp.add_argument("version")
    dp.add_argument("file", help="model.onnx, or .pkl / .joblib of a fitted scikit-learn model")
    dp.add_argument("--input-type", default="floats", choices=["integers", "floats", "doubles"])
    dp.add_argument("--sample-npy", help=".npy of sample input rows (required for a scikit-learn model)")
    dp.add_argument("--no-promote", action="store_true", help="register without making it the active version")
    dp.add_argument("--timeout", type=number, default=120.0, help="seconds to wait for the registration")
    dp.add_argument(
        "--canary",
        type=number,
        metavar="PERCENT",
        help="never make it active: once registered, start it as the model's canary on PERCENT %% of its queries "
        "(the decision options below tune when evidence promotes or rolls it back)",
    )
    _canary_options(dp)
    cn = sub.add_parser("canary", help="a model's canary: its evidence and events (promote, abort or start one)")
    cn.add_argument("name")
    act = cn.add_mutually_exclusive_group()
    act.add_argument("--promote", action="store_true", help="make the canary the active version now")
    act.add_argument("--abort", action="store_true", help="end the canary now; the active version keeps every query")
    act.add_argument("--start", metavar="VERSION", help="start a registered version as the canary")
    cn.add_argument("--share", type=number, metavar="PERCENT", help="--start's share (default 10)")
    cn.add_argument("--events", type=int, default=10, help="how many of the last events to show (default 10)")
    cn.add_argument("--json", action="store_true", help="the API's answer, as JSON")
    _canary_options(cn)
    rp = sub.add_parser("replicas", help="a model's number of replicas (set it with a second argument)")
    rp.add_argument("name")
    rp.add_argument("num_replicas", nargs="?", type=int)
    ap = sub.add_parser("auto-promote", help="whether uploaded versions become active at once")
    ap.add_argument("name")
    ap.add_argument("state", choices=["on", "off"])
    up = sub.add_parser("upload-url", help="a presigned URL to PUT models/<name>/<version>/model.onnx")
    up.add_argument("name")
    up.add_argument("version")
    up.add_argument(
        "--promote",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the uploaded version becomes active (signed into the URL: send the headers it names); "
        "unset: the model's auto-promote",
    )
    sv = sub.add_parser("set-version", help="make a version active")
    sv.add_argument("name")
    sv.add_argument("version")
    sub.add_parser("rollback", help="return to the previously active version").add_argument("name")
    dv = sub.add_parser("delete-version", help="delete an inactive version (and its serving stack)")
    dv.add_argument("name")
    dv.add_argument("version")
    for name, what in (("link", "link a model to an application"), ("unlink", "unlink a model from an application")):
        lk = sub.add_parser(name, help=what)
        lk.add_argument("app")
        lk.add_argument("model")
    sub.add_parser("linked", help="models linked to an application").add_argument("app")
    ins = sub.add_parser("inspect", help="applications, models, versions, links and local processes, as a table")
    ins.add_argument("--json", action="store_true", help="everything, as JSON (for scripts)")
    sub.add_parser("metrics", help="the frontend's counters, meters and histograms, as a table")
    bt = sub.add_parser("batching", help="a model's batching settings (set them with options)")
    bt.add_argument("name")
    bt.add_argument("--controller", choices=["aimd", "quantile", "fixed"])
    bt.add_argument("--batch-size", type=int, help="the fixed controller's size (alone: implies --controller fixed)")
    bt.add_argument("--max-batch-size", type=int, help="the adaptive size's upper bound")
    bt.add_argument("--batch-wait-ms", type=number, help="how long a batch waits for more after its first query")


def run(args: argparse.Namespace, conn: ClipperConnection) -> Any:
    c = args.command
    if c == "ping":
        return conn.ping()
    if c == "apps":
        return conn.get_all_apps(args.verbose)
    if c == "app":
        return conn.get_app_info(args.name)
    if c == "register-app":
        return conn.register_application(
            args.name, args.input_type, args.default_output, args.slo_micros, args.input_shape, args.policy
        )
    if c == "set-policy":
        return conn.set_app_policy(args.name, args.policy, args.confidence_threshold, args.default_when_unsure)
    if c == "policy-params":
        given: dict[str, float | None] = {p: getattr(args, p) for p in POLICY_PARAMS if getattr(args, p) is not None}
        given.update(dict.fromkeys(args.default))
        if not given:
            return conn.get_app_info(args.name)["policy_params"]
        return conn.set_policy_params(args.name, **given)
    if c == "delete-app":
        return conn.unregister_application(args.name)
    if c == "models":
        return conn.get_all_models(args.verbose)
    if c == "model":
        return conn.get_model_info(args.name, args.version)
    if c == "add-model":
        return conn.deploy_model(
            args.name,
            args.version,
            args.input_type,
            args.input_shape,
            args.queue_url,
            args.endpoint,
            activate=not args.no_activate,
        )
    if c == "deploy":
        return deploy(args, conn)
    if c == "replicas":
        if args.num_replicas is None:
            return conn.get_num_replicas(args.name)
        return conn.set_num_replicas(args.name, args.num_replicas)
    if c == "auto-promote":
        return conn.set_auto_promote(args.name, args.state == "on")
    if c == "upload-url":
        return conn.get_upload_url(args.name, args.version, args.promote)
    if c == "set-version":
        return conn.set_model_version(args.name, args.version)
    if c == "rollback":
        return conn.rollback_model(args.name)
    if c == "delete-version":
        return conn.stop_versioned_models({args.name: [args.version]})
    if c == "link":
        return conn.link_model_to_app(args.app, args.model)
    if c == "unlink":
        return conn.unlink_model_from_app(args.app, args.model)
    if c == "linked":
        return conn.get_linked_models(args.app)
    if c == "metrics":
        return conn.get_metrics()
    if c == "canary":
        if args.start:
            share = 10.0 if args.share is None else args.share
            return conn.start_canary(args.name, args.start, share, **_canary_params(args))
        ignored = ["--share"] * (args.share is not None) + [f"--{n.replace('_', '-')}" for n in _canary_params(args)]
        if ignored:  # they would be ignored: the command would look as if it changed the canary
            raise SystemExit(f"clipper: {', '.join(ignored)} go with --start VERSION (a running canary keeps its own)")
        if args.promote:
            return conn.promote_canary(args.name)
        if args.abort:
            return conn.abort_canary(args.name)
        return conn.get_canary(args.name, args.events)
    if c == "batching":
        changes = {k: getattr(args, k) for k in ("controller", "batch_size", "max_batch_size", "batch_wait_ms")}
        if args.batch_size and args.controller is None:  # a size is the fixed controller's only
            changes["controller"] = "fixed"
        if all(v is None for v in changes.values()):
            return conn.get_model_batching(args.name)
        return conn.set_model_batching(args.name, **{k: v for k, v in changes.items() if v is not None})
    raise SystemExit(f"clipper: unknown command {c}")


def deploy(args: argparse.Namespace, conn: ClipperConnection) -> Any:
    def progress(message: str) -> None:
        print(f"clipper: {message}", file=sys.stderr, flush=True)

    sample = load_npy(args.sample_npy, "--sample-npy") if args.sample_npy else None
    if sample is not None:
        from clipper.models.convert import DeployError, as_sample

        try:  # rows that are not of --input-type (text for a string model) are the option's fault, before any upload
            as_sample(sample, args.input_type)
        except DeployError as e:
            raise SystemExit(f"clipper: --sample-npy: {e}") from e
    options: dict[str, Any] = {"promote": not args.no_promote, "timeout_s": args.timeout, "progress": progress}
    if args.canary is not None:
        options |= {"canary": args.canary, "canary_params": _canary_params(args)}
    if args.file.endswith((".pkl", ".pickle", ".joblib")):
        if sample is None:
            raise SystemExit("clipper: a scikit-learn model needs --sample-npy (rows of its input)")
        model = load_estimator(args.file)
        return conn.deploy_sklearn_model(args.name, args.version, model, args.input_type, sample, **options)
    return conn.deploy_onnx_model(args.name, args.version, args.file, sample, args.input_type, **options)
