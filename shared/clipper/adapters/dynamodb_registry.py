"""The registry of applications, models, versions and links, in one DynamoDB table.

Items (``pk``, ``sk``):
    APP#<app>     APP            the application (input type, shape, default output, SLO, policy)
    APP#<app>     LINK#<model>   a link from the application to a model (linked_at: N, ns, kept when linked
                                 again: links are listed in the order they were made, so the "single"
                                 policy's model is the first one linked, not the first by name)
    MODEL#<model> APP#<app>      the same link seen from the model (written and deleted with it)
    MODEL#<model> MODEL          the model: active_version, history (L of S: the versions active before, oldest
                                 first), switches (N: changes of the active version, the condition of the next;
                                 ``clipper.models.history``), previous_version (the last of history, for
                                 readers of the older layout), auto_promote (BOOL), replicas (N, absent: 1)
    MODEL#<model> VERSION#<v>    a deployed version (input type, shape, queue URL, endpoint, labels; artifact
                                 and sha256 when the model updater registered it from an upload)
    MODEL#<model> REJECTED#<v>   the latest rejected upload of a version (``clipper.models.updater``)
    MODEL#<model> DELETED#<v>    the upload a deleted version was registered from (upload_id, sha256): not
                                 registered again from the same upload (``delete_version``)
    MODEL#<model> BATCHER#<v>    the batching controller's state for that version (survives cold starts)
    MODEL#<model> EVENT#<t>#<id> a canary event; the model item's ``canary`` map and every canary write:
                                 ``clipper.adapters.dynamodb_canary_control`` (a mixin of the registry)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from clipper.adapters.aws_errors import aws_call, cancellation_codes, error_code, translate
from clipper.adapters.dynamodb_canary_control import (
    CanaryRunning,
    DynamoDBCanaryControl,
    canary_of,
    item_exists,
    unless_canary,
)
from clipper.adapters.dynamodb_history import history_of, switch_update
from clipper.core.domain import (
    Application,
    BatchingSettings,
    Canary,
    InputType,
    Model,
    ModelRecord,
    ModelVersion,
)
from clipper.errors import ChangedMeanwhile, Conflict, NotFound
from clipper.models.history import VersionHistory
from clipper.selection.params import PolicyParams

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
else:
    DynamoDBClient = Any


def _shape_attr(shape: tuple[int, ...] | None) -> dict[str, Any]:
    return {"L": [{"N": str(d)} for d in shape]} if shape else {"NULL": True}


def _shape_of(attr: dict[str, Any] | None) -> tuple[int, ...] | None:
    if not attr or "L" not in attr:
        return None
    return tuple(int(d["N"]) for d in attr["L"])


def _plain(attr: dict[str, Any]) -> Any:
    """A DynamoDB attribute value as plain JSON."""
    if "S" in attr:
        return attr["S"]
    if "N" in attr:
        return int(attr["N"]) if attr["N"].lstrip("-").isdigit() else float(attr["N"])
    if "BOOL" in attr:
        return attr["BOOL"]
    if "L" in attr:
        return [_plain(x) for x in attr["L"]]
    return None


_ARTIFACT_ATTRS = ("status", "artifact", "artifact_version_id", "sha256", "etag", "size", "created_at", "promoted_at")
_REJECTED_ATTRS = ("status", "reasons", "rejected_at", "artifact", "artifact_version_id", "sha256", "etag", "size")


def _rejections(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A model partition's rejected uploads by version (its ``REJECTED#<version>`` items)."""
    return {
        i["sk"]["S"].removeprefix("REJECTED#"): {a: _plain(i[a]) for a in _REJECTED_ATTRS if a in i}
        for i in items
        if i["sk"]["S"].startswith("REJECTED#")
    }


def _describe(item: dict[str, Any]) -> str:
    """What an item is, in the API's words (never its internal key)."""
    pk, sk = item["pk"]["S"], item["sk"]["S"]
    kind, _, name = pk.partition("#")
    if kind == "APP" and sk == "APP":
        return f"application {name}"
    if kind == "MODEL" and sk.startswith("VERSION#"):
        return f"model version {name}:{sk.removeprefix('VERSION#')}"
    return f"{kind.lower()} {name}"


def _batching_attr(b: BatchingSettings) -> dict[str, Any]:
    return {
        "M": {
            "controller": {"S": b.controller},
            "batch_size": {"N": str(b.batch_size)},
            "max_batch_size": {"N": str(b.max_batch_size)},
            "batch_wait_ms": {"N": repr(float(b.batch_wait_ms))},
        }
    }


def batching_of(attr: dict[str, Any] | None) -> BatchingSettings:
    """A model's stored batching settings; the defaults for a model that never set them."""
    if not attr:
        return BatchingSettings()
    m = attr["M"]
    return BatchingSettings(
        controller=m["controller"]["S"],
        batch_size=int(m["batch_size"]["N"]),
        max_batch_size=int(m["max_batch_size"]["N"]),
        batch_wait_ms=float(m["batch_wait_ms"]["N"]),
    )


class DynamoDBRegistry(DynamoDBCanaryControl):
    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table

    # -- reads -----------------------------------------------------------------------------------------
    def _query(self, pk: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}},
        }
        while True:
            with aws_call("dynamodb.Query(registry)"):
                resp = self._client.query(**kwargs)
            items.extend(resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return items
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def app_and_links(self, name: str) -> tuple[Application, list[str]]:
        items = self._query(f"APP#{name}")
        app_item = next((i for i in items if i["sk"]["S"] == "APP"), None)
        if app_item is None:
            raise NotFound("application", name)
        links = [name for _, name in sorted(_link_of(i) for i in items if i["sk"]["S"].startswith("LINK#"))]
        app = Application(
            name=name,
            input_type=InputType(app_item["input_type"]["S"]),
            default_output=app_item["default_output"]["S"],
            latency_slo_micros=int(app_item["latency_slo_micros"]["N"]),
            input_shape=_shape_of(app_item.get("input_shape")),
            policy=app_item.get("policy", {}).get("S", "single"),
            confidence_threshold=float(app_item.get("confidence_threshold", {}).get("N", "0")),
            default_when_unsure=bool(app_item.get("default_when_unsure", {}).get("BOOL", False)),
            policy_params=PolicyParams.from_dict(
                {k: v["N"] for k, v in app_item.get("policy_params", {}).get("M", {}).items()}
            ),
            incarnation=int(app_item.get("incarnation", {}).get("N", "0")),
            revision=int(app_item.get("revision", {}).get("N", "0")),
        )
        return app, links

    def get_app(self, name: str) -> Application:
        return self.app_and_links(name)[0]

    def linked_models(self, app: str) -> list[str]:
        return self.app_and_links(app)[1]

    def model_and_versions(self, name: str) -> tuple[Model, dict[str, ModelVersion]]:
        record = self.model_record(name)
        return record.head, record.versions

    def model_record(self, name: str) -> ModelRecord:
        """The model, its versions, its settings and its rejected uploads, in one query."""
        items = self._query(f"MODEL#{name}")
        head = next((i for i in items if i["sk"]["S"] == "MODEL"), None)
        if head is None:
            raise NotFound("model", name)
        versions, artifacts = {}, {}
        rejected = _rejections(items)
        apps = sorted(i["sk"]["S"].removeprefix("APP#") for i in items if i["sk"]["S"].startswith("APP#"))
        for i in items:
            sk = i["sk"]["S"]
            if sk.startswith("REJECTED#"):
                continue
            if not sk.startswith("VERSION#"):
                continue
            v = sk[len("VERSION#") :]
            versions[v] = ModelVersion(
                name=name,
                version=v,
                input_type=InputType(i["input_type"]["S"]),
                queue_url=i["queue_url"]["S"],
                endpoint=i["endpoint"]["S"],
                input_shape=_shape_of(i.get("input_shape")),
                labels=tuple(x["S"] for x in i.get("labels", {}).get("L", [])),
                created_at=int(i.get("created_at", {}).get("N", "0")),
            )
            artifacts[v] = {a: _plain(i[a]) for a in _ARTIFACT_ATTRS if a in i}
        return ModelRecord(
            Model(name, head["active_version"]["S"], canary_of(head.get("canary"))),
            versions,
            auto_promote=bool(head.get("auto_promote", {}).get("BOOL", False)),
            replicas=int(head.get("replicas", {}).get("N", "1")),
            artifacts=artifacts,
            rejected=rejected,
            linked_apps=apps,
            batching=batching_of(head.get("batching")),
        )

    def rejected_uploads(self, name: str) -> dict[str, dict[str, Any]]:
        """The model's rejected uploads by version, kept whether or not any version of it was ever registered (a
        new model's first upload rejected has no model item: ``model_record`` is NotFound)."""
        return _rejections(self._query(f"MODEL#{name}"))

    def apps_linked_to(self, model: str) -> list[str]:
        """The applications a model is linked to (its reverse link items; no scan)."""
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :app)",
            "ExpressionAttributeValues": {":pk": {"S": f"MODEL#{model}"}, ":app": {"S": "APP#"}},
        }
        while True:
            with aws_call("dynamodb.Query(registry)"):
                resp = self._client.query(**kwargs)
            items.extend(resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return sorted(i["sk"]["S"].removeprefix("APP#") for i in items)
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def active_version(self, model: str) -> ModelVersion:
        head, versions = self.model_and_versions(model)
        if head.active_version not in versions:
            raise NotFound("model version", f"{model}:{head.active_version}")
        return versions[head.active_version]

    def canary(self, model: str) -> Canary | None:
        try:
            return self.model_record(model).head.canary
        except NotFound:
            return None

    def get_version(self, model: str, version: str) -> ModelVersion:
        _, versions = self.model_and_versions(model)
        if version not in versions:
            raise NotFound("model version", f"{model}:{version}")
        return versions[version]

    # -- writes ----------------------------------------------------------------------------------------
    def _put(self, item: dict[str, Any], condition: str | None = None) -> None:
        kwargs: dict[str, Any] = {"TableName": self._table, "Item": item}
        if condition:
            kwargs["ConditionExpression"] = condition
        try:
            self._client.put_item(**kwargs)
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                raise Conflict(_describe(item) + " already exists") from e
            raise translate(e, "dynamodb.PutItem(registry)") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.PutItem(registry)") from e

    def put_app(self, app: Application, overwrite: bool = False) -> None:
        """Add the application (``Conflict`` when it exists), or with ``overwrite`` replace it: only while it still
        exists as the same incarnation (``NotFound`` when it was deleted meanwhile, ``Conflict`` when it was deleted
        and added again), so a change made from a read never brings back a deleted application or rewrites a new
        one of the same name; and only over the revision it was read at (``ChangedMeanwhile`` when another change
        landed since: read again and redo it), so of two changes made at once neither is lost. The stored
        revision is ``app.revision + 1``."""
        item = {
            "pk": {"S": f"APP#{app.name}"},
            "sk": {"S": "APP"},
            "input_type": {"S": app.input_type.value},
            "default_output": {"S": app.default_output},
            "latency_slo_micros": {"N": str(app.latency_slo_micros)},
            "input_shape": _shape_attr(app.input_shape),
            "policy": {"S": app.policy},
            "confidence_threshold": {"N": repr(float(app.confidence_threshold))},
            "default_when_unsure": {"BOOL": app.default_when_unsure},
            "policy_params": {"M": {k: {"N": repr(v)} for k, v in app.policy_params.to_dict().items()}},
            "incarnation": {"N": str(app.incarnation)},
            "revision": {"N": str(app.revision + 1 if overwrite else app.revision)},
            "updated_at": {"N": str(int(time.time()))},
        }
        if not overwrite:
            self._put(item, "attribute_not_exists(pk)")
            return
        same = "incarnation = :i" if app.incarnation else "(attribute_not_exists(incarnation) OR incarnation = :i)"
        read = "revision = :r" if app.revision else "(attribute_not_exists(revision) OR revision = :r)"
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "Item": item,
            "ConditionExpression": f"attribute_exists(pk) AND {same} AND {read}",
            "ExpressionAttributeValues": {":i": {"N": str(app.incarnation)}, ":r": {"N": str(app.revision)}},
        }
        try:
            self._client.put_item(**kwargs)
        except ClientError as e:
            if error_code(e) != "ConditionalCheckFailedException":
                raise translate(e, "dynamodb.PutItem(registry)") from e
            now = self.get_app(app.name)  # NotFound: deleted meanwhile
            if now.incarnation == app.incarnation:
                raise ChangedMeanwhile(f"application {app.name} was changed meanwhile: look at it again") from e
            raise Conflict(f"application {app.name} was deleted and added again meanwhile: look at it again") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.PutItem(registry)") from e

    def _link_items(self, app: str, model: str) -> list[dict[str, Any]]:
        return [
            {"pk": {"S": f"APP#{app}"}, "sk": {"S": f"LINK#{model}"}},
            {"pk": {"S": f"MODEL#{model}"}, "sk": {"S": f"APP#{app}"}},
        ]

    def link(self, app: str, model: str) -> None:
        """The link and its reverse item, in one transaction with a check that the application still exists
        (``NotFound`` otherwise: a link left by a link racing ``delete_app`` would pass to a new application of the
        same name, whatever its input)."""
        forward, reverse = self._link_items(app, model)
        first_linked = {  # a link made again keeps its place in the order
            "TableName": self._table,
            "Key": forward,
            "UpdateExpression": "SET linked_at = if_not_exists(linked_at, :t)",
            "ExpressionAttributeValues": {":t": {"N": str(time.time_ns())}},
        }
        actions: list[Any] = [{"Update": first_linked}, {"Put": {"TableName": self._table, "Item": reverse}}]
        actions.append(item_exists(self._table, {"pk": {"S": f"APP#{app}"}, "sk": {"S": "APP"}}))
        try:
            self._client.transact_write_items(TransactItems=actions)
        except ClientError as e:
            if cancellation_codes(e)[2:3] == ["ConditionalCheckFailed"]:
                raise NotFound("application", app) from e
            raise translate(e, "dynamodb.TransactWriteItems(registry)") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.TransactWriteItems(registry)") from e

    def put_version(self, mv: ModelVersion, activate: bool = False) -> None:
        """Register a new version (``Conflict`` when it exists: a version is immutable, and a second write would
        drop the attributes its registration recorded, such as its file's sha256). With ``activate`` it is made
        active in the same transaction, so a refusal (``CanaryRunning``: a canary started meanwhile) registers
        nothing either: the operation can be made again once the canary ended."""
        item = {
            "pk": {"S": f"MODEL#{mv.name}"},
            "sk": {"S": f"VERSION#{mv.version}"},
            "input_type": {"S": mv.input_type.value},
            "input_shape": _shape_attr(mv.input_shape),
            "queue_url": {"S": mv.queue_url},
            "endpoint": {"S": mv.endpoint},
            "labels": {"L": [{"S": x} for x in mv.labels]},
            "created_at": {"N": str(int(time.time()))},
        }
        if not activate:
            self._put(item, "attribute_not_exists(pk)")
            return
        put = {"Put": {"TableName": self._table, "Item": item, "ConditionExpression": "attribute_not_exists(pk)"}}
        for _ in range(5):
            before = self.version_history(mv.name, missing_ok=True)
            switch = {
                "Update": unless_canary(switch_update(self._table, mv.name, before, before.switched_to(mv.version)))
            }
            try:
                self._client.transact_write_items(TransactItems=[put, switch])
                return
            except ClientError as e:
                codes = cancellation_codes(e)
                if not codes:
                    raise translate(e, "dynamodb.TransactWriteItems(registry)") from e
                if codes[0] == "ConditionalCheckFailed":
                    raise Conflict(_describe(item) + " already exists") from e
                running = self.running_canary(mv.name) if codes[1:2] == ["ConditionalCheckFailed"] else None
                if running is not None:
                    raise CanaryRunning(mv.name, running) from e
                # the active version changed since the read (or a concurrent write on the items): read again
            except BotoCoreError as e:
                raise translate(e, "dynamodb.TransactWriteItems(registry)") from e
        raise Conflict(f"model {mv.name}: its active version kept changing; {mv.version} was not registered - retry")

    def set_active_version(self, model: str, version: str) -> str | None:
        """Make ``version`` active (creating the model item for a first version); the one it replaces joins the
        version history (for rollback). Returns that one. A concurrent change of the active version is read again
        and the switch retried; other attributes of the model item are kept."""
        for _ in range(5):
            before = self.version_history(model, missing_ok=True)
            if before.active == version:
                return version
            try:
                self.switch_version(model, before, before.switched_to(version))
            except CanaryRunning:
                raise
            except Conflict:
                continue
            return before.active
        raise Conflict(f"model {model}: its active version kept changing; {version} was not made active")

    def version_history(self, model: str, missing_ok: bool = False) -> VersionHistory:
        """The model's active version and those before it (a consistent read); ``NotFound`` without the model
        item unless ``missing_ok`` (then an empty history)."""
        with aws_call("dynamodb.GetItem(registry)"):
            item = self._client.get_item(
                TableName=self._table, Key={"pk": {"S": f"MODEL#{model}"}, "sk": {"S": "MODEL"}}, ConsistentRead=True
            ).get("Item")
        if item is None:
            if missing_ok:
                return VersionHistory(None)
            raise NotFound("model", model)
        return history_of(item)

    def switch_version(self, model: str, before: VersionHistory, after: VersionHistory) -> None:
        """Replace the history ``before`` with ``after``, in one transaction with a check that the version made
        active is still registered; ``Conflict`` when the active version changed since ``before`` was read (nothing
        is written); ``CanaryRunning`` while a canary runs; ``NotFound`` when the version was deleted meanwhile
        (an active version without its item would leave every query of the model with the default)."""
        items: list[dict[str, Any]] = [{"Update": unless_canary(switch_update(self._table, model, before, after))}]
        if after.active:
            items.append(item_exists(self._table, self._key(model, f"VERSION#{after.active}")))
        try:
            self._client.transact_write_items(TransactItems=items)
        except ClientError as e:
            codes = cancellation_codes(e)
            if codes[:1] == ["ConditionalCheckFailed"]:
                running = self.running_canary(model)
                if running is not None:
                    raise CanaryRunning(model, running) from e
            if codes[1:2] == ["ConditionalCheckFailed"]:
                raise NotFound("model version", f"{model}:{after.active}") from e
            if codes:  # the history changed, or a concurrent write on the same items
                raise Conflict(
                    f"model {model}: the active version changed meanwhile (it was {before.active}); "
                    f"{after.active} was not made active - look at the model again and retry"
                ) from e
            raise translate(e, "dynamodb.TransactWriteItems(registry)") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.TransactWriteItems(registry)") from e

    def set_model_settings(
        self,
        model: str,
        auto_promote: bool | None = None,
        replicas: int | None = None,
        batching: BatchingSettings | None = None,
    ) -> None:
        """Change a model's settings; ``NotFound`` when the model does not exist."""
        sets: list[str] = []
        values: dict[str, Any] = {}
        if batching is not None:
            sets.append("batching = :b")
            values[":b"] = _batching_attr(batching)
        if auto_promote is not None:
            sets.append("auto_promote = :a")
            values[":a"] = {"BOOL": auto_promote}
        if replicas is not None:
            sets.append("replicas = :r")
            values[":r"] = {"N": str(replicas)}
        if not sets:
            return
        try:
            self._client.update_item(
                TableName=self._table,
                Key={"pk": {"S": f"MODEL#{model}"}, "sk": {"S": "MODEL"}},
                UpdateExpression="SET " + ", ".join(sets),
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues=values,
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                raise NotFound("model", model) from e
            raise translate(e, "dynamodb.UpdateItem(registry)") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.UpdateItem(registry)") from e

    def previous_version(self, model: str) -> str | None:
        """The version a rollback returns to first (if it is still registered)."""
        earlier = self.version_history(model, missing_ok=True).earlier
        return earlier[-1] if earlier else None

    def _scan(self, sk: str, keys_only: bool = False) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "FilterExpression": "sk = :sk",
            "ExpressionAttributeValues": {":sk": {"S": sk}},
        }
        if keys_only:  # the names alone: a frontend's list of applications (``CachedRegistry``) during a flood
            kwargs["ProjectionExpression"] = "pk"
        while True:
            with aws_call("dynamodb.Scan(registry)"):
                resp = self._client.scan(**kwargs)
            items.extend(resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return items
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def app_names(self) -> list[str]:
        return _names(self._scan("APP", keys_only=True), "APP#")

    def model_names(self) -> list[str]:
        return _names(self._scan("MODEL"), "MODEL#")

    def canaried_model_names(self) -> list[str]:
        """The models whose item holds a running canary: what the reviewer's rounds need, from the same scan
        (a reviewer reads each of them fresh before it decides)."""
        return _names((i for i in self._scan("MODEL") if "canary" in i), "MODEL#")

    def _delete(self, pk: str, sk: str) -> None:
        with aws_call("dynamodb.DeleteItem(registry)"):
            self._client.delete_item(TableName=self._table, Key={"pk": {"S": pk}, "sk": {"S": sk}})

    def unlink(self, app: str, model: str) -> None:
        keys = self._link_items(app, model)
        actions: list[Any] = [{"Delete": {"TableName": self._table, "Key": k}} for k in keys]
        with aws_call("dynamodb.TransactWriteItems(registry)"):
            self._client.transact_write_items(TransactItems=actions)

    def delete_app(self, name: str) -> None:
        """The application and its links (models stay): the links first, the application's own item last, so a
        delete that stops half way (a timeout, throttling) leaves the application there to delete again, never
        links without it for a new application of the same name to inherit."""
        items = self._query(f"APP#{name}")
        for item in items:
            sk = item["sk"]["S"]
            if sk.startswith("LINK#"):
                self.unlink(name, sk.removeprefix("LINK#"))
        for item in items:
            sk = item["sk"]["S"]
            if not sk.startswith("LINK#") and sk != "APP":
                self._delete(item["pk"]["S"], sk)
        self._delete(f"APP#{name}", "APP")


class DynamoDBControllerStore:
    """Batching controller state in the registry table (``MODEL#<model>`` / ``BATCHER#<version>``)."""

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table

    def load(self, model: str, version: str) -> dict[str, Any] | None:
        with aws_call("dynamodb.GetItem(controller)"):
            resp = self._client.get_item(
                TableName=self._table, Key={"pk": {"S": f"MODEL#{model}"}, "sk": {"S": f"BATCHER#{version}"}}
            )
        item = resp.get("Item")
        if not item:
            return None
        state: dict[str, Any] = json.loads(item["state"]["S"])
        return state

    def save(self, model: str, version: str, state: dict[str, Any]) -> None:
        with aws_call("dynamodb.PutItem(controller)"):
            self._client.put_item(
                TableName=self._table,
                Item={
                    "pk": {"S": f"MODEL#{model}"},
                    "sk": {"S": f"BATCHER#{version}"},
                    "state": {"S": json.dumps(state)},
                    "updated_at": {"N": str(int(time.time()))},
                },
            )


def _names(items: Iterable[dict[str, Any]], prefix: str) -> list[str]:
    """The names of scanned items, sorted (their partition key without ``prefix``)."""
    return sorted(i["pk"]["S"][len(prefix) :] for i in items)


def _link_of(item: dict[str, Any]) -> tuple[int, str]:
    """A link item's place in its application's order: when it was first made (links made before this was recorded
    come first, by name), then the model's name."""
    return int(item.get("linked_at", {}).get("N", "0")), item["sk"]["S"][len("LINK#") :]
