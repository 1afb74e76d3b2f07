from __future__ import annotations

import threading

import pytest
import redis

from clipper.adapters.dynamodb_cache import DynamoDBPredictionCache
from clipper.adapters.redis_cache import RedisPredictionCache
from clipper.adapters.resp import RespClient
from tests.integration.conftest import create_tables
from tests.services import AtomicRequests, redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", "dynamodb"])
def cache(request):
    if request.param == "redis":
        redis.Redis.from_url(request.getfixturevalue("redis_url")).flushdb()
        return RedisPredictionCache(RespClient.from_url(request.getfixturevalue("redis_url")), ttl_s=60)
    aws = request.getfixturevalue("aws")
    aws.dynamodb.create_table(
        TableName="cache",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return DynamoDBPredictionCache(AtomicRequests(aws.dynamodb), "cache", ttl_s=60)


def test_put_and_get_many(cache):
    keys = [f"k{i}" for i in range(130)]  # more than one DynamoDB batch
    cache.put_many({k: i for i, k in enumerate(keys)})
    cache.put_many({"vec": [0.5, 1.5], "text": "seven"})
    got = cache.get_many([*keys, "vec", "text", "absent"])
    assert got["k0"] == 0 and got["k129"] == 129 and got["vec"] == [0.5, 1.5] and got["text"] == "seven"
    assert "absent" not in got
    assert cache.get_many([]) == {}


def test_claim_is_exclusive_until_filled(cache):
    assert cache.claim(["a", "b"], ttl_s=30) == {"a", "b"}
    assert cache.claim(["a", "c"], ttl_s=30) == {"c"}
    cache.put_many({"a": 1})
    assert cache.get_many(["a"]) == {"a": 1}


def test_expired_claim_can_be_taken_again(cache):
    assert cache.claim(["x"], ttl_s=0.05) == {"x"}
    import time

    time.sleep(0.1)
    assert cache.claim(["x"], ttl_s=30) == {"x"}


def test_concurrent_claims_have_exactly_one_owner(cache):
    owners: list[set[str]] = []
    barrier = threading.Barrier(8)

    def contend():
        barrier.wait()
        owners.append(cache.claim(["hot"], ttl_s=30))

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(len(o) for o in owners) == 1


__all__ = ["create_tables"]


def test_a_failed_claim_tells_its_cause_then_frees_the_key(cache):
    import time

    assert cache.claim(["k", "other"], ttl_s=30) == {"k", "other"}
    assert cache.poll(["k", "other"]) == ({}, {})  # computing: neither an output nor a failure yet
    cache.fail_many({"k": "model mlp:1: endpoint error: boom"}, ttl_s=1.0, owner="1")
    assert cache.poll(["k", "other"]) == ({}, {"k": "model mlp:1: endpoint error: boom"})
    assert cache.claim(["k"], ttl_s=30) == set()  # held while followers read the cause
    time.sleep(1.1)
    assert cache.poll(["k"]) == ({}, {})
    assert cache.claim(["k"], ttl_s=30) == {"k"}  # then a new query computes it again


def test_a_filled_entry_is_never_reported_failed(cache):
    cache.claim(["k"], ttl_s=30)
    cache.put_many({"k": 4})
    cache.fail_many({"k": "late failure"}, ttl_s=1.0, owner="1")
    assert cache.poll(["k"]) == ({"k": 4}, {})


def test_lookup_returns_hits_and_claims_the_misses_once(cache):
    cache.put_many({"hit": 7})
    hits, owned = cache.lookup(["hit", "miss", "miss", "other"], claim_ttl_s=30)
    assert hits == {"hit": 7} and owned == {"miss", "other"}
    again_hits, again_owned = cache.lookup(["hit", "miss"], claim_ttl_s=30)
    assert again_hits == {"hit": 7} and again_owned == set()  # another query computes "miss"


def test_dynamodb_an_entry_in_the_second_it_expires_is_claimed_not_waited_on(aws):
    """A read took expires_at <= now (seconds) as expired, the claim's condition freed only expires_at < now:
    in that second a lookup neither hit nor claimed, and the query waited out its SLO for a computation that
    did not exist."""
    import time

    aws.dynamodb.create_table(
        TableName="cache",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    cache = DynamoDBPredictionCache(aws.dynamodb, "cache", ttl_s=60)
    while time.time() % 1 > 0.5:  # room in this second for the write and the lookup
        time.sleep(0.01)
    item = {"key": {"S": "k"}, "output": {"S": "7"}, "expires_at": {"N": str(int(time.time()))}}
    aws.dynamodb.put_item(TableName="cache", Item=item)
    assert cache.lookup(["k"], claim_ttl_s=1.0) == ({}, {"k"})


def test_dynamodb_an_output_over_the_item_limit_is_not_cached_and_the_others_are(aws):
    """One output over DynamoDB's 400 KB item limit failed the BatchWriteItem: none of the batch's outputs were
    cached (moto does not enforce the limit, so the test looks at what was written)."""
    aws.dynamodb.create_table(
        TableName="cache",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    cache = DynamoDBPredictionCache(aws.dynamodb, "cache", ttl_s=60)
    cache.put_many({"big": [0.123456789] * 40_000, "small": 3})
    assert cache.get_many(["big", "small"]) == {"small": 3}


def test_put_new_keeps_what_a_key_holds(cache):
    """A query no model answered records itself only where its input has no record: a failed retry does not
    replace the record of the answer given before."""
    cache.put_many({"rec": {"outputs": {"a": 1}}})
    cache.put_new({"rec": {"outputs": {}}, "fresh": {"outputs": {}}})
    assert cache.get_many(["rec", "fresh"]) == {"rec": {"outputs": {"a": 1}}, "fresh": {"outputs": {}}}


def test_only_a_claims_owner_ends_it(cache):
    """A query's late release or failure (its claim expired and another query claimed the key) leaves the new
    owner's claim be: it overwrote it, and the new owner's followers took a failure that was not theirs."""
    import time

    assert cache.claim(["k"], ttl_s=0.2, owner="a") == {"k"}
    time.sleep(1.1)  # a's claim expired (DynamoDB reads whole seconds for expiry)
    assert cache.claim(["k"], ttl_s=30, owner="b") == {"k"}
    cache.fail_many({"k": "model mlp:1: endpoint error: late"}, ttl_s=1.0, owner="a")
    cache.release(["k"], owner="a")
    assert cache.poll(["k"]) == ({}, {})  # b's claim: no failure to read
    assert cache.claim(["k"], ttl_s=30, owner="c") == set()  # and still held
    cache.fail_many({"k": "model mlp:1: endpoint error: boom"}, ttl_s=1.0, owner="b")
    assert cache.poll(["k"]) == ({}, {"k": "model mlp:1: endpoint error: boom"})


def test_a_released_claim_is_taken_by_a_waiting_query(cache):
    cache.put_many({"hit": 1})
    assert cache.claim(["k", "held", "failed"], ttl_s=30, owner="a") == {"k", "held", "failed"}
    cache.fail_many({"failed": "model mlp:1: endpoint error: boom"}, ttl_s=5.0, owner="a")
    keys = ["hit", "k", "held", "failed", "free", "k"]
    assert cache.poll_or_claim(keys, 30, "b") == ({"hit": 1}, {"failed": "model mlp:1: endpoint error: boom"}, {"free"})
    cache.release(["k"], owner="a")  # a ran out of time: its followers compute the input themselves
    hits, failed, owned = cache.poll_or_claim(keys, 30, "b")
    assert owned == {"k"} and hits == {"hit": 1} and set(failed) == {"failed"}
    assert cache.poll_or_claim(["k"], 30, "c")[2] == set()  # b holds it now
    assert cache.lookup(["k"], claim_ttl_s=30, owner="c") == ({}, set())
    cache.release(["k"], owner="b")
    assert cache.lookup(["k"], claim_ttl_s=30, owner="c") == ({}, {"k"})  # a plain lookup takes it too


def test_an_owners_failure_after_its_claim_expired_leaves_the_key_free(cache):
    """Expired, the claim is gone: the owner's late failure or release does not bring it back (a new identical
    query computes the input instead of taking the old failure for 250 ms)."""
    import time

    assert cache.claim(["k", "j"], ttl_s=0.05, owner="a") == {"k", "j"}
    time.sleep(0.1)
    cache.fail_many({"k": "model mlp:1: endpoint error: late"}, ttl_s=1.0, owner="a")
    cache.release(["j"], owner="a")
    assert cache.poll(["k", "j"]) == ({}, {})
    assert cache.lookup(["k", "j"], claim_ttl_s=30, owner="b") == ({}, {"k", "j"})
