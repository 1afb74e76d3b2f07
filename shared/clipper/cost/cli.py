"""``clipper cost``: what a prediction costs on AWS for a given rate and deployment, from measured figures
(``make bench-cost`` writes them to bench/results/cost.json) and the list prices of clipper/cost/prices.json.

    clipper cost --rate 200                       # the stack, SageMaker real-time direct, Serverless Inference
    clipper cost --rate 200 --store dynamodb --memory-mb 512 --hit-ratio 0.3 --models 4 --breakdown
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from clipper.cost.model import SYSTEMS, Deployment, Measured, Prices

DEFAULT_FIGURES = Path("bench/results/cost.json")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cost", help="cost per million predictions on AWS at a request rate (from bench-cost's figures)")
    p.add_argument("--rate", type=float, required=True, help="steady queries per second")
    p.add_argument("--figures", type=Path, default=DEFAULT_FIGURES, help="bench-cost's JSON (its measured figures)")
    p.add_argument("--prices", type=Path, help="a prices file of your own (default: the package's prices.json)")
    p.add_argument("--store", choices=["redis", "dynamodb"], default="redis", help="cache and reply channel")
    p.add_argument(
        "--cache-engine",
        choices=["valkey", "redis"],
        default=None,
        help="ElastiCache Serverless engine, with --store redis (default: valkey)",
    )
    p.add_argument("--cache-gb", type=float, default=0.0, help="GB the cache holds (default: the engine's minimum)")
    p.add_argument("--memory-mb", type=int, default=1024, help="the frontend Lambda's memory (FrontendMemorySize)")
    p.add_argument("--arch", choices=["x86_64", "arm64"], default="x86_64", help="the frontend Lambda's architecture")
    p.add_argument(
        "--instance-type",
        default="ml.c5.large",
        help="the model endpoint's instance type (default: ml.c5.large, a CPU instance as the row cost was measured "
        "on; the template deploys ModelInstanceType, ml.g4dn.xlarge by default)",
    )
    p.add_argument("--vcpus", type=int, default=2, help="vCPUs of that instance type (one model thread each)")
    p.add_argument("--hit-ratio", type=float, default=0.0, help="share of queries the prediction cache answers")
    p.add_argument("--models", type=int, default=1, help="models per query (an exp4 ensemble's size; an endpoint each)")
    p.add_argument("--breakdown", action="store_true", help="every line of this stack's cost")
    p.add_argument("--json", action="store_true", help="the figures as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        measured = json.loads(args.figures.read_text())["measured"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"clipper: no measured figures in {args.figures} ({e}); run `make bench-cost` first") from e
    for option, ok, wanted, value in (
        ("--rate", math.isfinite(args.rate) and args.rate > 0, "a finite number of queries a second > 0", args.rate),
        ("--hit-ratio", 0 <= args.hit_ratio <= 1, "a share from 0 to 1", args.hit_ratio),
        ("--models", args.models >= 1, "at least 1 model a query", args.models),
        ("--vcpus", args.vcpus >= 1, "at least 1 vCPU", args.vcpus),
        ("--memory-mb", 128 <= args.memory_mb <= 10_240, "Lambda's memory, 128 to 10240 MB", args.memory_mb),
        ("--cache-gb", math.isfinite(args.cache_gb) and args.cache_gb >= 0, "a finite size >= 0 GB", args.cache_gb),
    ):
        if not ok:
            raise SystemExit(f"clipper: {option}: {wanted}, got {value:g}")
    if args.store == "dynamodb" and args.cache_engine is not None:
        raise SystemExit("clipper: --cache-engine: an ElastiCache engine, for --store redis (dynamodb has none)")
    prices = Prices.load(args.prices)
    if args.instance_type not in prices["sagemaker_instance_hour"]:
        known = ", ".join(sorted(prices["sagemaker_instance_hour"]))
        raise SystemExit(f"clipper: no price for instance type {args.instance_type} (known: {known})")
    figures = Measured(**measured)
    deployment = Deployment(
        frontend_memory_mb=args.memory_mb,
        architecture=args.arch,
        store=args.store,
        cache_engine=args.cache_engine or "valkey",
        cache_gb=args.cache_gb,
        instance_type=args.instance_type,
        instance_vcpus=args.vcpus,
        cache_hit_ratio=args.hit_ratio,
        models_per_query=args.models,
    )
    costs = {name: f(prices, figures, deployment, args.rate) for name, f in SYSTEMS.items()}
    if args.json:
        out = {
            name: {"per_million": c.per_million, "per_month": c.per_month, "instances": c.instances, "lines": c.lines}
            for name, c in costs.items()
        }
        print(json.dumps({"prices": prices.label, "deployment": dataclasses.asdict(deployment), "cost": out}, indent=2))
        return 0
    print(f"{prices.label}; figures: {figures.source}")
    print(f"model endpoint: {args.instance_type}, {args.vcpus} vCPUs (--instance-type, --vcpus)")
    print(f"{'system':<52} {'USD / million':>14} {'USD / month':>12}")
    for c in costs.values():
        print(f"{c.system:<52} {c.per_million:>14.3f} {c.per_month:>12.2f}")
    if args.breakdown:
        stack = costs["stack"]
        print(f"\nthis stack at {args.rate:g} q/s, {stack.instances} endpoint instance(s):")
        for line, value in sorted(stack.lines.items(), key=lambda kv: -kv[1]):
            print(f"  {line:<32} {value:>10.3f}")
    return 0
