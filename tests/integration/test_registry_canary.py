"""The canary's control plane on the registry item, in moto: starting a canary is refused for an unknown or active
version, a bad share and a second canary; ending one is conditional on its trial (a stale trial changes nothing);
a promotion is a version switch that rollback walks back; while a canary runs the active version is not switched
by hand; deleting the canary's version ends it; events come back newest first."""

from __future__ import annotations

import pytest

from clipper.adapters.dynamodb_canary_control import CanaryRunning
from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.canary import CanaryParams
from clipper.errors import Conflict, InvalidInput, NotFound
from tests.fakes import model_version

pytestmark = pytest.mark.integration
T0 = 1_790_000_000.0


@pytest.fixture
def registry(aws) -> DynamoDBRegistry:
    r = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    r.put_version(model_version("mlp", "1"), activate=True)
    r.put_version(model_version("mlp", "2"), activate=True)
    r.put_version(model_version("mlp", "3"))
    return r


def test_a_started_canary_is_read_back_with_its_params(registry):
    started = registry.start_canary("mlp", "3", 0.1, T0, CanaryParams(min_feedback=30, margin=0.02))

    head = registry.model_record("mlp").head
    assert head.active_version == "2"
    assert head.canary == started
    assert head.canary.params.min_feedback == 30 and head.canary.params.margin == 0.02
    assert registry.canary("mlp") == started and started.trial == f"3@{int(T0 * 1000)}"


@pytest.mark.parametrize(
    ("version", "share", "error", "named"),
    [
        ("9", 0.1, NotFound, "mlp:9"),
        ("2", 0.1, InvalidInput, "model_version"),
        ("3", 0.0, InvalidInput, "share"),
        ("3", 1.0, InvalidInput, "share"),
        ("3", float("nan"), InvalidInput, "share"),
    ],
)
def test_start_is_refused_for_an_unknown_or_active_version_and_a_bad_share(registry, version, share, error, named):
    with pytest.raises(error) as refused:
        registry.start_canary("mlp", version, share, T0)
    assert named in str(refused.value)
    assert registry.canary("mlp") is None


def test_start_is_refused_for_an_unknown_model_and_while_another_canary_runs(registry):
    with pytest.raises(NotFound, match="model 'nope'"):
        registry.start_canary("nope", "1", 0.1, T0)
    first = registry.start_canary("mlp", "3", 0.1, T0)
    with pytest.raises(Conflict, match="canary running already"):
        registry.start_canary("mlp", "1", 0.2, T0 + 1)
    assert registry.canary("mlp") == first


def test_ending_a_stale_trial_returns_false_and_changes_nothing(registry):
    old = registry.start_canary("mlp", "3", 0.1, T0)
    assert registry.end_canary("mlp", old.trial, promote=False)
    new = registry.start_canary("mlp", "3", 0.2, T0 + 60)  # the same version again: another trial
    before = registry.version_history("mlp")

    assert not registry.end_canary("mlp", old.trial, promote=True)
    assert not registry.end_canary("mlp", old.trial, promote=False)

    assert registry.canary("mlp") == new
    assert registry.version_history("mlp") == before


def test_ending_without_promotion_keeps_the_active_version(registry):
    canary = registry.start_canary("mlp", "3", 0.1, T0)
    assert registry.end_canary("mlp", canary.trial, promote=False)
    assert registry.canary("mlp") is None and registry.version_history("mlp").active == "2"
    assert not registry.end_canary("mlp", canary.trial, promote=False)  # once only


def test_a_promotion_switches_the_version_and_rollback_returns_to_the_one_before_the_canary(registry):
    canary = registry.start_canary("mlp", "3", 0.1, T0)
    before = registry.version_history("mlp")

    assert registry.end_canary("mlp", canary.trial, promote=True)

    after = registry.version_history("mlp")
    assert registry.canary("mlp") is None
    assert after.active == "3" and after.earlier == ("1", "2") and after.switches == before.switches + 1
    rolled = after.rolled_back(registry.model_record("mlp").versions.keys())
    registry.switch_version("mlp", after, rolled)
    assert registry.version_history("mlp").active == "2"


def test_the_active_version_is_not_switched_by_hand_while_a_canary_runs(registry):
    canary = registry.start_canary("mlp", "3", 0.1, T0)
    now = registry.version_history("mlp")

    with pytest.raises(CanaryRunning, match="canary running") as refused:
        registry.set_active_version("mlp", "1")
    assert refused.value.canary == canary
    with pytest.raises(CanaryRunning):
        registry.switch_version("mlp", now, now.rolled_back({"1", "2", "3"}))
    assert registry.version_history("mlp") == now
    registry.end_canary("mlp", canary.trial, promote=False)
    assert registry.set_active_version("mlp", "1") == "2"


def test_deleting_the_canarys_version_ends_the_canary(registry):
    canary = registry.start_canary("mlp", "3", 0.1, T0)
    assert registry.delete_version("mlp", "1") is None  # another version: the canary runs on
    assert registry.canary("mlp") == canary

    assert registry.delete_version("mlp", "3") == canary

    assert registry.canary("mlp") is None
    assert set(registry.model_record("mlp").versions) == {"2"}


def test_events_come_back_newest_first_and_do_not_disturb_the_model(registry):
    for i, kind in enumerate(["start", "continue", "rollback"]):
        registry.add_canary_event("mlp", {"kind": kind, "at": T0 + i, "figures": {"difference": 0.1 * i}})
    registry.add_canary_event("other", {"kind": "start", "at": T0 + 9})

    events = registry.canary_events("mlp")

    assert [e["kind"] for e in events] == ["rollback", "continue", "start"]
    assert events[0] == {"kind": "rollback", "at": T0 + 2, "figures": {"difference": 0.2}}
    assert [e["kind"] for e in registry.canary_events("mlp", limit=2)] == ["rollback", "continue"]
    assert set(registry.model_record("mlp").versions) == {"1", "2", "3"}


class EndedAfterRead(DynamoDBRegistry):
    """The registry, except that right after its first read of the model item another decider ends the canary and
    an operator starts a new trial of the same version (the read is then stale)."""

    raced = False

    def _model_item(self, model):
        item = super()._model_item(model)
        if not self.raced:
            self.raced = True
            other = DynamoDBRegistry(self._client, self._table)
            other.end_canary(model, other.canary(model).trial, promote=False)
            other.start_canary(model, "3", 0.5, T0 + 60)
        return item


@pytest.mark.parametrize("promote", [True, False])
def test_the_end_is_conditional_on_the_trial_read(aws, registry, promote):
    old = registry.start_canary("mlp", "3", 0.1, T0)
    racing = EndedAfterRead(aws.dynamodb, aws.registry_table)

    assert not racing.end_canary("mlp", old.trial, promote=promote)

    assert registry.canary("mlp").started_at == T0 + 60
    assert registry.version_history("mlp").active == "2"


class StartedAfterRead(DynamoDBRegistry):
    """The registry, except that right after delete_version's first read an operator starts the version as the
    canary."""

    raced = False

    def running_canary(self, model):
        seen = super().running_canary(model)
        if not self.raced:
            self.raced = True
            DynamoDBRegistry(self._client, self._table).start_canary(model, "3", 0.1, T0)
        return seen


def test_a_canary_started_on_a_version_while_it_is_deleted_ends_with_it(aws, registry):
    racing = StartedAfterRead(aws.dynamodb, aws.registry_table)

    ended = racing.delete_version("mlp", "3")

    assert ended is not None and ended.version == "3"
    assert registry.canary("mlp") is None and "3" not in registry.model_record("mlp").versions
