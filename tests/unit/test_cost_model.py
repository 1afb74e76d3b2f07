"""The cost model of a prediction on AWS: each line follows the code's requests and the price file, fixed costs
spread over the rate, and the always-on endpoint and the per-request services cross."""

from __future__ import annotations

import dataclasses

import pytest

from clipper.cost.model import Deployment, Measured, Prices, compare, crossings, realtime_cost, stack_cost

pytestmark = pytest.mark.unit

FIGURES = Measured(
    frontend_hit_ms=0.6,
    frontend_miss_ms=3.2,
    batch_rows=8.0,
    instance_rows_per_s=400_000.0,
    unbatched_per_s=5_000.0,
    inference_ms=0.05,
    request_bytes=400,
    message_bytes=500,
    response_bytes=80,
    log_bytes_per_query=900,
)


def test_the_price_file_says_where_and_when_its_prices_come_from():
    prices = Prices.load()
    assert prices["region"] and prices["as_of"] and prices["sources"]
    assert "us-east-1" in prices.label


def test_a_miss_pays_the_lambda_for_its_wait_and_sqs_per_model():
    prices = Prices.load()
    one = stack_cost(prices, FIGURES, Deployment(), rate_qps=100).per_query
    # billed ms: ceil(3.2 + 40 ms of SQS) = 44 ms at 1 GB, plus the invocation
    assert one["frontend Lambda"] == pytest.approx(0.2e-6 + 44 / 1000 * 0.0000166667)
    # one send, and the receive and delete shared by 8 messages
    assert one["SQS"] == pytest.approx((1 + 2 / 8) * 0.4e-6)
    four = stack_cost(prices, FIGURES, Deployment(models_per_query=4), rate_qps=100).per_query
    assert four["SQS"] == pytest.approx(4 * one["SQS"])
    hits = stack_cost(prices, FIGURES, Deployment(cache_hit_ratio=1.0), rate_qps=100).per_query
    assert hits["SQS"] == 0
    assert hits["frontend Lambda"] == pytest.approx(0.2e-6 + 1 / 1000 * 0.0000166667)


def test_deletes_share_a_call_within_the_acknowledgement_linger():
    prices = Prices.load()
    singles = dataclasses.replace(FIGURES, batch_rows=1.0)
    # one message a receive; at 1,000 q/s one batcher answers 20 in 20 ms: a delete call takes 10 of them
    busy = stack_cost(prices, singles, Deployment(), rate_qps=1000).per_query
    assert busy["SQS"] == pytest.approx((1 + 1 + 1 / 10) * 0.4e-6)
    # at 100 q/s, 2 in 20 ms
    assert stack_cost(prices, singles, Deployment(), rate_qps=100).per_query["SQS"] == pytest.approx(
        (1 + 1 + 1 / 2) * 0.4e-6
    )
    # without the linger each batch deletes on its own
    alone = stack_cost(prices, singles, Deployment(ack_linger_s=0), rate_qps=1000).per_query
    assert alone["SQS"] == pytest.approx(3 * 0.4e-6)


def test_elasticache_is_priced_as_the_template_deploys_it_serverless():
    prices = Prices.load()
    valkey = stack_cost(prices, FIGURES, Deployment(store="redis"), rate_qps=10)
    # the minimum stored data (100 MB on Valkey) an hour, and an ECPU a command: lookup + 4 a model asked
    assert valkey.per_hour["ElastiCache (stored data)"] == pytest.approx(0.1 * 0.084)
    assert valkey.per_query["ElastiCache (ECPUs)"] == pytest.approx(5 * 0.0023 / 1e6)
    redis = stack_cost(prices, FIGURES, Deployment(cache_engine="redis", cache_gb=3, models_per_query=4), 10)
    assert redis.per_hour["ElastiCache (stored data)"] == pytest.approx(3 * 0.125)
    assert redis.per_query["ElastiCache (ECPUs)"] == pytest.approx(17 * 0.0034 / 1e6)
    hits = stack_cost(prices, FIGURES, Deployment(cache_hit_ratio=1.0), rate_qps=10)
    assert hits.per_query["ElastiCache (ECPUs)"] == pytest.approx(0.0023 / 1e6)


def test_dynamodb_replaces_the_cache_with_requests():
    prices = Prices.load()
    redis = stack_cost(prices, FIGURES, Deployment(store="redis"), rate_qps=10)
    dynamo = stack_cost(prices, FIGURES, Deployment(store="dynamodb"), rate_qps=10)
    assert "ElastiCache (stored data)" in redis.per_hour and not any("ElastiCache" in k for k in dynamo.lines)
    # 3 writes (claim, result, reply); 1 lookup + (3.2 + 40) / 10 reply polls
    assert dynamo.per_query["DynamoDB (cache, replies)"] == pytest.approx((3 * 0.625 + (1 + 4.32) * 0.125) / 1e6)


def test_fixed_costs_are_spread_over_the_rate_and_instances_follow_it():
    prices = Prices.load()
    slow, fast = (stack_cost(prices, FIGURES, Deployment(), r) for r in (1, 1000))
    assert slow.per_hour == fast.per_hour and fast.instances == 1
    fixed = sum(slow.per_hour.values())  # the same per hour, over 1,000 times fewer queries
    # per query the same, but for the deletes: at 1,000 q/s 10 share a call within the linger, at 1 q/s a receive's 8
    sqs = slow.per_query["SQS"] - fast.per_query["SQS"]
    assert sqs == pytest.approx((1 / 8 - 1 / 10) * 0.4e-6)
    assert slow.per_million - fast.per_million == pytest.approx(fixed / 3600 * 1e6 * (1 - 1 / 1000) + sqs * 1e6)
    busy = stack_cost(prices, FIGURES, Deployment(), rate_qps=2_000_000)
    assert busy.instances == 3  # 2 M rows/s over 2 vCPUs x 400 k rows/s
    direct = realtime_cost(prices, FIGURES, Deployment(), rate_qps=25_000)
    assert direct.instances == 3  # one request per call: 10 k/s per instance


def test_serverless_is_cheapest_at_low_rates_and_the_endpoint_at_high_ones():
    prices = Prices.load()
    rates = [0.1, 1, 10, 100, 1000, 10_000]
    costs = compare(prices, FIGURES, Deployment(), rates)
    assert costs["serverless"][0].per_million < costs["realtime"][0].per_million
    assert costs["realtime"][-1].per_million < costs["serverless"][-1].per_million
    assert len(crossings(costs, "serverless", "realtime")) == 1
    for c in costs["stack"]:
        assert c.per_million == pytest.approx(sum(c.lines.values()))
        assert c.per_month == pytest.approx(c.per_million * c.rate_qps * 3600 * 730 / 1e6)


def test_clipper_cost_prints_the_model_for_the_figures_given(tmp_path, capsys):
    import dataclasses
    import json

    from clipper.cli import main

    figures = tmp_path / "cost.json"
    figures.write_text(json.dumps({"measured": dataclasses.asdict(FIGURES)}))
    assert main(["cost", "--rate", "200", "--figures", str(figures), "--store", "dynamodb", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = stack_cost(Prices.load(), FIGURES, Deployment(store="dynamodb"), 200)
    assert out["cost"]["stack"]["per_million"] == pytest.approx(expected.per_million)
    assert set(out["cost"]) == {"stack", "realtime", "serverless"}
    assert main(["cost", "--rate", "1", "--figures", str(tmp_path / "none.json")]) == 2  # refused, one line
    assert "make bench-cost" in capsys.readouterr().err
    assert main(["cost", "--rate", "1", "--figures", str(figures), "--instance-type", "ml.nope"]) == 2
    assert "no price for instance type" in capsys.readouterr().err
    # the instance type the figures are for is said (the template deploys another by default); an engine given
    # with the DynamoDB store, which has none, is refused (it was ignored)
    assert main(["cost", "--rate", "100", "--figures", str(figures)]) == 0
    assert "model endpoint: ml.c5.large, 2 vCPUs" in capsys.readouterr().out
    both = ["--store", "dynamodb", "--cache-engine", "redis"]
    assert main(["cost", "--rate", "1", "--figures", str(figures), *both]) == 2
    assert "--cache-engine" in capsys.readouterr().err
    assert main(["cost", "--rate", "1", "--figures", str(figures), "--cache-engine", "redis", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["deployment"]["cache_engine"] == "redis"


def test_the_benchmark_table_has_a_row_per_system_and_a_cell_per_rate():
    from bench.cost.report import breakdown, table

    costs = compare(Prices.load(), FIGURES, Deployment(), [1.0, 100.0])
    text = table(costs, [1.0, 100.0]).splitlines()
    assert len(text) == 2 + 3 and all(line.count("|") == 4 for line in text)
    assert breakdown(costs["stack"][1]).splitlines()[-1].startswith("| total |")


def test_each_model_of_an_ensemble_has_its_own_endpoint():
    prices = Prices.load()
    one = stack_cost(prices, FIGURES, Deployment(), rate_qps=200)
    four = stack_cost(prices, FIGURES, Deployment(models_per_query=4), rate_qps=200)
    assert (one.instances, four.instances) == (1, 4)  # infra/model-stack.yaml: a stack, an endpoint, a model
    for line in ("endpoint instances", "SQS idle long polls", "CloudWatch metrics"):
        assert four.per_hour[line] == pytest.approx(4 * one.per_hour[line])  # a batcher per model
    busy = stack_cost(prices, FIGURES, Deployment(models_per_query=2), rate_qps=1_000_000)
    assert busy.instances == 2 * 2  # each model's 1 M rows/s over 2 vCPUs x 400 k rows/s
    direct = [realtime_cost(prices, FIGURES, Deployment(models_per_query=n), 25_000) for n in (1, 3)]
    assert (direct[0].instances, direct[1].instances) == (3, 9)
    assert direct[1].per_query["data processed"] == pytest.approx(3 * direct[0].per_query["data processed"])
    from clipper.cost.model import serverless_cost

    alone, three = (serverless_cost(prices, FIGURES, Deployment(models_per_query=n), 10).per_million for n in (1, 3))
    assert three == pytest.approx(3 * alone)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--rate", "nan"),
        ("--rate", "inf"),
        ("--rate", "0"),
        ("--hit-ratio", "nan"),
        ("--models", "0"),
        ("--vcpus", "0"),
        ("--memory-mb", "-100"),
        ("--cache-gb", "-5"),
    ],
)
def test_clipper_cost_refuses_an_impossible_deployment_naming_the_option(tmp_path, capsys, option, value):
    import json

    from clipper.cli import main

    figures = tmp_path / "cost.json"
    figures.write_text(json.dumps({"measured": dataclasses.asdict(FIGURES)}))
    args = ["cost", "--figures", str(figures)] + ([] if option == "--rate" else ["--rate", "10"])
    assert main([*args, option, value]) == 2  # refused, one line, no traceback
    err = capsys.readouterr().err
    assert err.startswith(f"clipper: {option}: ") and len(err.splitlines()) == 1
