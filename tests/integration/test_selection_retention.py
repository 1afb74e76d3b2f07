"""Users' bandit states expire (DynamoDB TTL) ``CLIPPER_USER_STATE_RETENTION_DAYS`` after their last feedback, the
applications' never: the feedback worker's real store over moto, through the settings the functions read."""

from __future__ import annotations

import pytest

from clipper.selection.state import SelectionState, initial_state, is_user_key, state_key
from clipper.settings import CommonSettings
from clipper.wiring import selection_store

pytestmark = pytest.mark.integration

DAY = 86400


@pytest.fixture
def table(aws) -> str:
    aws.dynamodb.create_table(
        TableName="selection",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    return "selection"


def store_for(aws, table: str, days: int | None, monkeypatch):
    monkeypatch.setenv("CLIPPER_REGISTRY_TABLE", "registry")
    monkeypatch.setenv("CLIPPER_REPLIES_TABLE", "replies")
    monkeypatch.setenv("CLIPPER_SELECTION_TABLE", table)
    if days is None:
        monkeypatch.delenv("CLIPPER_USER_STATE_RETENTION_DAYS", raising=False)
    else:
        monkeypatch.setenv("CLIPPER_USER_STATE_RETENTION_DAYS", str(days))
    store = selection_store(CommonSettings(), aws.dynamodb)  # type: ignore[call-arg]
    assert store is not None
    return store


def expires_at(aws, table: str, key: str) -> int | None:
    item = aws.dynamodb.get_item(TableName=table, Key={"pk": {"S": key}, "sk": {"S": "STATE"}})["Item"]
    return int(item["expires_at"]["N"]) if "expires_at" in item else None


def saved(store, key: str, state: SelectionState, expected: int, feedback: str | None = None) -> SelectionState:
    nxt = SelectionState(state.policy, state.arms, version=expected + 1, incarnation=state.incarnation)
    assert store.save(key, nxt, expected, feedback)
    return nxt


def test_a_users_state_expires_its_retention_after_its_last_save_and_the_apps_never(aws, table, monkeypatch):
    clock = [1_000_000.0]
    store = store_for(aws, table, 30, monkeypatch)
    store._now = lambda: clock[0]  # the store's clock, to see the expiry move with the saves
    user, app = state_key("digits", "u/1"), state_key("digits")
    assert is_user_key(user) and not is_user_key(app)
    state = initial_state("exp3", ["a", "b"], 7)
    first = saved(store, user, state, 0, "f1")
    saved(store, app, state, 0, "f1")
    assert expires_at(aws, table, user) == 1_000_000 + 30 * DAY
    assert expires_at(aws, table, app) is None
    clock[0] += 5 * DAY  # the next feedback moves the user's expiry on
    saved(store, user, first, first.version, "f2")
    assert expires_at(aws, table, user) == 1_000_000 + 35 * DAY
    assert store.load(user) is not None  # read back as it was saved


@pytest.mark.parametrize("days", [None, 0])
def test_without_a_retention_users_states_are_kept(aws, table, monkeypatch, days):
    store = store_for(aws, table, days, monkeypatch)
    saved(store, state_key("digits", "u1"), initial_state("exp3", ["a", "b"], 7), 0)
    assert expires_at(aws, table, state_key("digits", "u1")) is None


def test_user_keys_are_told_from_application_keys_whatever_the_names():
    for app in ("digits", "user", "a/user/b", "app"):
        assert not is_user_key(state_key(app))
        for user in ("u1", "user", "a/b", "app/x/user/y"):
            assert is_user_key(state_key(app, user))
