"""An application deleted and added again under the same name is a new application: the bandit states learned
for the old one (the application's and its users') are not used for it, by the frontend's selection or by
feedback. Over the real adapters in moto (DynamoDB registry and selection store, the prediction cache) and the
admin service's own add and delete."""

from __future__ import annotations

import random

import numpy as np
import pytest

from clipper.adapters.clock import SystemClock
from clipper.adapters.dynamodb_cache import DynamoDBPredictionCache
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.adapters.dynamodb_selection import DynamoDBSelectionStore
from clipper.admin import schemas
from clipper.admin.service import AdminService
from clipper.core.cache_keys import record_keys
from clipper.core.messages import encode_rows
from clipper.feedback import FeedbackMessage, FeedbackProcessor
from clipper.frontend.selection import Selector
from clipper.selection import Selection, state_key

pytestmark = pytest.mark.integration

ROWS = np.eye(64, dtype=np.float32)[5:6]
APP = {"name": "digits", "input_type": "floats", "default_output": "-1", "latency_slo_micros": 100000}


@pytest.fixture
def world(aws):
    aws.dynamodb.create_table(
        TableName="selection",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    aws.dynamodb.create_table(
        TableName="cache",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    store = DynamoDBSelectionStore(aws.dynamodb, "selection")
    cache = DynamoDBPredictionCache(aws.dynamodb, "cache", ttl_s=3600)
    return AdminService(registry), registry, store, FeedbackProcessor(registry, store, cache), cache


def add_app(admin: AdminService, registry: DynamoDBRegistry) -> None:
    admin.add_app(schemas.AddApp(**APP, policy="exp3"))
    for model in ("a", "b"):
        registry.link("digits", model)


def learn(processor: FeedbackProcessor, cache: DynamoDBPredictionCache, n: int, user: str | None = None) -> None:
    """``n`` labels, each judging model "b" (the one Exp3 picked, as the frontend recorded it) wrong."""
    (key,) = record_keys("digits", user, ROWS)
    selection = Selection("exp3", ("b",), {"a": 0.5, "b": 0.5}, 0)
    incarnation = processor.registry.get_app("digits").incarnation  # the frontend records whose prediction it is
    cache.put_many({key: {"selection": selection.to_dict(), "outputs": {"b": 0}, "incarnation": incarnation}})
    for i in range(n):
        message = FeedbackMessage(
            feedback_id=f"fb-{user}-{random.random()}-{i}",
            app="digits",
            user=user,
            payload=encode_rows(ROWS)[0],
            label=5,
        )
        processor.process(message)


def weights(registry: DynamoDBRegistry, store: DynamoDBSelectionStore, user: str | None) -> dict[str, float]:
    """The weights the frontend's selection uses for a query now (no cached copy)."""
    selector = Selector(registry, store, SystemClock(), random.Random(0), ttl_s=0)
    return selector.state_for(registry.get_app("digits"), ["a", "b"], user).weights


def test_an_application_added_again_starts_with_fresh_bandit_states(world):
    admin, registry, store, processor, cache = world
    add_app(admin, registry)
    learn(processor, cache, 2, user="u1")  # u1's state and the application's: 2 labels each
    learn(processor, cache, 3)  # the application's: 5
    learned, learned_u1 = weights(registry, store, None), weights(registry, store, "u1")
    assert learned["a"] > learned_u1["a"] > 0.5
    assert weights(registry, store, "u2") == pytest.approx(learned)  # a user without a state: the app's weights

    admin.delete_app("digits")
    add_app(admin, registry)
    assert weights(registry, store, None) == {"a": 0.5, "b": 0.5}
    assert weights(registry, store, "u1") == {"a": 0.5, "b": 0.5}  # the old user state is not used either

    # labels for the new application: learned from its fresh states, saved over the old items (the conditional
    # writes continue their versions)
    learn(processor, cache, 1)
    fresh = weights(registry, store, None)
    assert 0.5 < fresh["a"] < learned_u1["a"]  # one label, against two
    assert weights(registry, store, "u1") == pytest.approx(fresh)  # u1 as a new user: the new app's weights
    learn(processor, cache, 1, user="u1")  # u1 starts from the new application's weights, as a new user does
    assert weights(registry, store, "u1") == pytest.approx(weights(registry, store, None))
    stored, stored_u1 = store.load(state_key("digits")), store.load(state_key("digits", "u1"))
    assert stored is not None and stored_u1 is not None
    assert stored.incarnation == stored_u1.incarnation == registry.get_app("digits").incarnation != 0
    assert (stored.updates, stored_u1.updates) == (2, 1)


def test_an_application_kept_keeps_what_it_learned(world):
    admin, registry, store, processor, cache = world
    add_app(admin, registry)
    learn(processor, cache, 3)
    before = weights(registry, store, None)
    admin.set_app_policy(schemas.SetPolicy(name="digits", policy="exp3"))  # rewritten, the same application
    assert weights(registry, store, None) == pytest.approx(before) and before["a"] > 0.5


def test_a_demo_application_registered_again_by_the_local_stack_is_a_new_one(aws):
    from infra.local.demo import seed

    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    models = [{"name": "mlp"}]
    queues, endpoints = {"mlp": {"QueueUrl": "https://sqs.local/q-mlp"}}, {"mlp": "http://127.0.0.1:9"}
    seed(registry, models, queues, endpoints, 100.0)
    first = {name: registry.get_app(name).incarnation for name in ("digits", "digits-exp3", "digits-exp4")}
    assert 0 not in first.values() and len(set(first.values())) == 3
    registry.delete_app("digits-exp3")  # deleted by hand; the next make run registers it again
    seed(registry, models, queues, endpoints, 100.0)
    again = {name: registry.get_app(name).incarnation for name in first}
    assert again["digits"] == first["digits"] and again["digits-exp4"] == first["digits-exp4"]  # kept as they were
    assert again["digits-exp3"] not in (0, first["digits-exp3"])


def test_feedback_on_a_prediction_of_the_deleted_application_is_not_learned(world):
    admin, registry, store, processor, cache = world
    add_app(admin, registry)
    (key,) = record_keys("digits", None, ROWS)
    selection = Selection("exp3", ("b",), {"a": 0.5, "b": 0.5}, 0)
    old = registry.get_app("digits").incarnation
    cache.put_many({key: {"selection": selection.to_dict(), "outputs": {"b": 0}, "incarnation": old}})
    admin.delete_app("digits")
    add_app(admin, registry)  # the old prediction's record is still in the cache (its TTL)
    message = FeedbackMessage(feedback_id="fb-old", app="digits", payload=encode_rows(ROWS)[0], label=5)
    assert processor.process(message) == "no_record"
    assert store.load(state_key("digits")) is None
