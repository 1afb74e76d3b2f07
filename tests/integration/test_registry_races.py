"""A model's active version always names a registered version, whatever lands between an operation's read and
its write: deleting a canary's version while the reviewer promotes it, or rolling back to a version deleted
meanwhile. Each race is placed exactly: the competing write runs inside the operation's own read. Over moto."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.admin import schemas
from clipper.admin.service import AdminService
from clipper.errors import InvalidInput, NotFound

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(aws) -> DynamoDBRegistry:
    return DynamoDBRegistry(aws.dynamodb, aws.registry_table)


def add(service: AdminService, version: str, activate: bool) -> None:
    req = schemas.AddModel(
        model_name="m",
        model_version=version,
        input_type="floats",
        queue_url=f"q{version}",
        endpoint=f"e{version}",
        activate=activate,
    )
    service.add_model(req)


def after_first_read(registry: DynamoDBRegistry, method: str, competing) -> None:
    """Run ``competing`` right after the next call of ``registry.<method>`` has read (once)."""
    real = getattr(registry, method)

    def racing(*args, **kwargs):
        setattr(registry, method, real)
        got = real(*args, **kwargs)
        competing()
        return got

    setattr(registry, method, racing)


def test_deleting_a_canarys_version_that_the_reviewer_promotes_meanwhile_is_refused(registry):
    service = AdminService(registry)
    add(service, "1", True)
    add(service, "2", False)
    service.start_canary(schemas.StartCanary(model_name="m", model_version="2", share_percent=10))
    promote = lambda: registry.end_canary("m", registry.running_canary("m").trial, True)  # noqa: E731
    after_first_read(registry, "model_record", promote)
    with pytest.raises(InvalidInput, match="model_version"):
        service.delete_versioned_model("m", "2")
    head, versions = registry.model_and_versions("m")
    assert head.active_version == "2" and sorted(versions) == ["1", "2"]
    assert registry.active_version("m").version == "2"  # served, not NotFound


def test_deleting_a_version_made_active_meanwhile_is_refused(registry):
    service = AdminService(registry)
    add(service, "1", True)
    add(service, "2", False)
    after_first_read(registry, "model_record", lambda: registry.set_active_version("m", "2"))
    with pytest.raises(InvalidInput, match="model_version"):
        service.delete_versioned_model("m", "2")
    assert registry.active_version("m").version == "2"


def test_rolling_back_to_a_version_deleted_meanwhile_is_refused_and_changes_nothing(registry):
    service = AdminService(registry)
    add(service, "1", True)
    add(service, "2", True)
    after_first_read(registry, "version_history", lambda: registry.delete_version("m", "1"))
    with pytest.raises(NotFound, match="m:1"):
        service.rollback_model("m")
    head, versions = registry.model_and_versions("m")
    assert head.active_version == "2" and sorted(versions) == ["2"]
    assert registry.active_version("m").version == "2"


def test_switching_to_a_version_deleted_meanwhile_is_refused(registry):
    service = AdminService(registry)
    add(service, "1", True)
    add(service, "2", False)
    after_first_read(registry, "model_record", lambda: registry.delete_version("m", "2"))
    with pytest.raises(NotFound, match="m:2"):
        service.set_model_version("m", "2")
    assert registry.active_version("m").version == "1"


def test_an_inactive_version_is_still_deleted(registry):
    service = AdminService(registry)
    add(service, "1", True)
    add(service, "2", False)
    assert service.delete_versioned_model("m", "2") == {"deleted": "m:2"}
    assert sorted(registry.model_and_versions("m")[1]) == ["1"]


def digits(service: AdminService, input_type: str = "floats") -> None:
    req = schemas.AddApp(name="a", input_type=input_type, default_output="0", latency_slo_micros=100_000)
    service.add_app(req)


def test_a_delete_of_an_application_that_stops_half_way_leaves_it_to_delete_again(registry):
    service = AdminService(registry)
    add(service, "1", True)
    digits(service)
    service.add_model_links("a", ["m"])
    writes = {"_delete": registry._delete, "unlink": registry.unlink}

    def second_write_times_out(name: str):
        def write(*args: str) -> None:
            if writes.setdefault("done", 0):
                raise TimeoutError("the function timed out")  # after its first write, whichever that is
            writes["done"] = 1
            writes[name](*args)

        return write

    for name in ("_delete", "unlink"):
        setattr(registry, name, second_write_times_out(name))
    with pytest.raises(TimeoutError):
        service.delete_app("a")
    for name in ("_delete", "unlink"):
        setattr(registry, name, writes[name])
    assert service.delete_app("a") == {"deleted": "a"}  # still there to delete
    digits(service, "strings")  # a new application of the name inherits no link
    assert service.get_linked_models("a") == []


def test_a_link_racing_the_delete_of_its_application_is_refused_and_leaves_no_link(registry):
    service = AdminService(registry)
    add(service, "1", True)
    digits(service)
    after_first_read(registry, "model_and_versions", lambda: registry.delete_app("a"))
    with pytest.raises(NotFound, match="a"):
        service.add_model_links("a", ["m"])
    digits(service, "strings")
    assert service.get_linked_models("a") == []
    assert registry.model_record("m").linked_apps == []


def test_a_policy_change_racing_a_delete_never_brings_the_application_back(registry):
    from clipper.errors import Conflict

    service = AdminService(registry)
    digits(service)
    after_first_read(registry, "app_and_links", lambda: registry.delete_app("a"))
    with pytest.raises(NotFound):
        service.set_app_policy(schemas.SetPolicy(name="a", policy="exp3"))
    assert "a" not in registry.app_names()
    # deleted and added again meanwhile: the new application is left as it was added
    digits(service)
    readd = lambda: (registry.delete_app("a"), digits(service))  # noqa: E731
    after_first_read(registry, "app_and_links", readd)
    with pytest.raises(Conflict, match="deleted and added again"):
        service.set_app_policy(schemas.SetPolicy(name="a", policy="exp3"))
    assert registry.app_and_links("a")[0].policy == "single"


def test_a_version_registered_meanwhile_is_not_overwritten(registry, aws):
    from clipper.core.domain import InputType, ModelVersion
    from clipper.errors import Conflict

    service = AdminService(registry)
    add(service, "1", True)
    # the model updater registers 2 from its upload (with its file's sha256) while add_model is between its read
    # and its write of the same version
    uploaded = ModelVersion("m", "2", InputType.FLOATS, "q-up", "e-up")
    key = {"pk": {"S": "MODEL#m"}, "sk": {"S": "VERSION#2"}}

    def register_upload() -> None:
        registry.put_version(uploaded)
        aws.dynamodb.update_item(
            TableName=aws.registry_table,
            Key=key,
            UpdateExpression="SET sha256 = :s",
            ExpressionAttributeValues={":s": {"S": "ab12"}},
        )

    after_first_read(registry, "model_and_versions", register_upload)
    with pytest.raises(Conflict, match="m:2 already exists"):
        add(service, "2", False)
    item = aws.dynamodb.get_item(TableName=aws.registry_table, Key=key)["Item"]
    assert item["queue_url"]["S"] == "q-up" and item["sha256"]["S"] == "ab12"


def test_two_changes_of_an_application_at_once_both_land(registry):
    """set_app_policy and set_policy_params each read the application and write it whole: a second change that
    landed between the first's read and its write was overwritten (last write won). Now the first is redone
    from a fresh read, so both land."""
    service = AdminService(registry)
    digits(service)
    service.set_app_policy(schemas.SetPolicy(name="a", policy="exp3"))
    gamma = lambda: service.set_policy_params(schemas.SetPolicyParams(name="a", gamma=0.2))  # noqa: E731
    after_first_read(registry, "app_and_links", gamma)
    service.set_policy_params(schemas.SetPolicyParams(name="a", eta=0.3))
    app = registry.get_app("a")
    assert (app.policy_params.eta, app.policy_params.gamma) == (0.3, 0.2)
    # a policy change lands inside a parameter change's read: the parameter change is redone over it
    exp4 = lambda: service.set_app_policy(schemas.SetPolicy(name="a", policy="exp4"))  # noqa: E731
    after_first_read(registry, "app_and_links", exp4)
    service.set_policy_params(schemas.SetPolicyParams(name="a", eta=0.4))
    app = registry.get_app("a")
    assert (app.policy, app.policy_params.eta, app.policy_params.gamma) == ("exp4", 0.4, 0.2)
    # the revision is the registry's write guard, not shown (an answer showed the one read, one behind the stored)
    assert "revision" not in service.get_application("a")


def test_a_change_that_no_longer_fits_what_landed_meanwhile_is_refused_not_forced(registry):
    service = AdminService(registry)
    digits(service)
    service.set_app_policy(schemas.SetPolicy(name="a", policy="exp4"))
    exp3 = lambda: service.set_app_policy(schemas.SetPolicy(name="a", policy="exp3"))  # noqa: E731
    after_first_read(registry, "app_and_links", exp3)
    with pytest.raises(InvalidInput, match="k"):  # read as exp4's parameter; exp3 takes no k
        service.set_policy_params(schemas.SetPolicyParams(name="a", k=2))
    app = registry.get_app("a")
    assert (app.policy, app.policy_params.k) == ("exp3", None)


def test_an_application_changed_on_every_attempt_answers_409(registry):
    from clipper.admin.service import CHANGE_ATTEMPTS
    from clipper.errors import ChangedMeanwhile

    service = AdminService(registry)
    digits(service)
    real_read, real_put = registry.app_and_links, registry.put_app
    tries = []

    def always_changed(name):  # another writer changes the application right after every read
        got = real_read(name)
        app = real_read(name)[0]
        real_put(replace(app, confidence_threshold=app.confidence_threshold + 0.01), overwrite=True)
        return got

    def put(app, overwrite=False):
        tries.append(app.policy)
        return real_put(app, overwrite)

    registry.app_and_links, registry.put_app = always_changed, put
    with pytest.raises(ChangedMeanwhile, match="changed meanwhile"):
        service.set_app_policy(schemas.SetPolicy(name="a", policy="exp3"))
    registry.app_and_links, registry.put_app = real_read, real_put
    assert tries == ["exp3"] * CHANGE_ATTEMPTS and registry.get_app("a").policy == "single"


def test_a_canary_on_a_version_registered_again_right_after_its_delete_is_left_running(registry):
    """After its guarded delete, delete_version looked for a canary on the version once more and ended it: since
    the guard refuses a canary on the version in the delete's own transaction, the only canary it could find was
    one on the version registered again and canaried meanwhile, which it aborted (its event said the version was
    deleted). Found by a review helper."""
    service = AdminService(registry)
    add(service, "1", True)
    add(service, "2", False)

    def again():  # the version is registered again and canaried right after the delete's own write
        add(service, "2", False)
        service.start_canary(schemas.StartCanary(model_name="m", model_version="2", share_percent=10))

    after_first_read(registry, "_delete_inactive", again)
    service.delete_versioned_model("m", "2")
    record = registry.model_record("m")
    assert "2" in record.versions and record.head.canary is not None and record.head.canary.version == "2"


def test_adding_an_active_version_refused_by_a_canary_started_meanwhile_registers_nothing(registry):
    """add_model(activate=True) registered the version, then found the canary (started inside its read) when it
    switched: a 409 "promote or abort it first" with the version registered anyway, its batch_size and
    auto_promote dropped, and the same request, made again after the canary, a 400 "3 exists". The version and
    its switch are now one transaction. Found by a review helper."""
    from clipper.errors import Conflict

    service = AdminService(registry)
    add(service, "1", True)
    add(service, "2", False)
    canary = lambda: service.start_canary(schemas.StartCanary(model_name="m", model_version="2", share_percent=10))  # noqa: E731
    after_first_read(registry, "model_and_versions", canary)
    with pytest.raises(Conflict, match="canary"):
        add(service, "3", True)
    record = registry.model_record("m")
    assert "3" not in record.versions and record.head.active_version == "1" and record.head.canary.version == "2"
    service.end_canary("m", promote=False)  # what the 409 says to do (abort it)
    add(service, "3", True)  # the same request again
    assert registry.model_record("m").head.active_version == "3"


def test_a_canary_start_tells_the_active_version_it_really_runs_beside(registry):
    """A version made active inside start_canary's read: the canary ran beside the new active version while the
    answer and the start event named the one read (the operator was told the wrong comparison). The start is now
    conditional on the active version read, and made again from a fresh read. Found by a review helper."""
    service = AdminService(registry)
    add(service, "1", True)
    add(service, "2", False)
    after_first_read(registry, "model_record", lambda: add(service, "3", True))
    out = service.start_canary(schemas.StartCanary(model_name="m", model_version="2", share_percent=10))
    head = registry.model_record("m").head
    start = registry.canary_events("m", 1)[0]
    assert (head.active_version, head.canary.version) == ("3", "2")
    assert out["active_version"] == "3" and start["active_version"] == "3" and start["reason"].endswith("beside 3")
