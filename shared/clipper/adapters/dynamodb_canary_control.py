"""A model's canary on its registry item: starting one, ending it (promoted or not), deleting its version, and its
events. A mixin of ``DynamoDBRegistry`` (the ``CanaryControl`` port and the admin API's canary operations).

Items (``pk``, ``sk``):
    MODEL#<model> MODEL                  canary (M: version S, share N, started_at N, params M of N), absent while
                                         none runs; the version history beside it (``dynamodb_history``)
    MODEL#<model> VERSION#<v>            canaried_at (N): when the version last started as a canary
    MODEL#<model> EVENT#<iso time>#<id>  a canary event: at (N, seconds since the epoch), kind (S), event (S: the
                                         event as JSON). The registry table has no TTL: events stay (a few a trial)

Every write is conditional on what it read, so two deciders (a reviewer and an operator) cannot both end one trial:
- ``start_canary``: one transaction, on the condition that the version is registered, is not the active one, and
  that no canary runs.
- ``end_canary``: one UpdateItem that removes the canary on the condition that the running canary is still the
  trial's (its version and start); promoting also switches the active version there, with the history update
  that ``rollback`` walks back (on the condition that the history is the one read), so a rollback after a
  promotion returns to the version active before the canary.
- while a canary runs the active version is not switched by hand (``set_model_version``, ``rollback_model``,
  ``add_model`` with activate): the registry's ``switch_version`` carries ``attribute_not_exists(canary)``
  (:func:`unless_canary`) and a refusal raises :class:`CanaryRunning` (409), naming the canary.
- ``delete_version`` of the canary's version ends the canary in the same transaction (and answers it).
A transaction needs the permission of each of its actions: GetItem, Query, PutItem, UpdateItem, DeleteItem and
ConditionCheckItem are used, what the admin function's role grants (tests/iac/test_function_permissions.py).
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from clipper.adapters.aws_errors import aws_call, cancellation_codes, error_code, translate
from clipper.adapters.dynamodb_history import forgetting, history_of, switch_update
from clipper.canary import CanaryParams
from clipper.core.domain import Canary
from clipper.errors import ChangedMeanwhile, Conflict, InvalidInput, NotFound

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
else:
    DynamoDBClient = Any

_RETRIES = 5
_NAMES = {"#c": "canary", "#v": "version", "#s": "started_at"}


class CanaryRunning(Conflict):
    """The active version cannot be switched by hand while a canary runs: promote or abort it first."""

    def __init__(self, model: str, canary: Canary) -> None:
        self.model = model
        self.canary = canary
        super().__init__(
            f"model {model} has a canary running ({model}:{canary.version} on {canary.share:.0%} of its queries, "
            f"trial {canary.trial}): promote or abort it first (clipper canary {model} --promote or --abort)"
        )


def canary_attr(canary: Canary) -> dict[str, Any]:
    params = {k: {"N": repr(v)} for k, v in asdict(canary.params).items()}
    return {
        "M": {
            "version": {"S": canary.version},
            "share": {"N": repr(float(canary.share))},
            "started_at": {"N": repr(float(canary.started_at))},
            "params": {"M": params},
        }
    }


def canary_of(attr: dict[str, Any] | None) -> Canary | None:
    """A model item's ``canary`` map, absent while none runs (params absent: the defaults)."""
    if not attr:
        return None
    m = attr["M"]
    kinds = {f.name: f.type for f in fields(CanaryParams)}
    stored = m.get("params", {}).get("M", {})
    params: dict[str, Any] = {
        k: int(float(v["N"])) if kinds[k] == "int" else float(v["N"]) for k, v in stored.items() if k in kinds
    }
    return Canary(m["version"]["S"], float(m["share"]["N"]), float(m["started_at"]["N"]), CanaryParams(**params))


def unless_canary(update: dict[str, Any]) -> dict[str, Any]:
    """A version switch (``dynamodb_history.switch_update``) that is refused while a canary runs."""
    return {**update, "ConditionExpression": f"({update['ConditionExpression']}) AND attribute_not_exists(canary)"}


def _forgetting_update(
    base: dict[str, Any], forget: tuple[list[str], list[str], dict[str, Any], str] | None, removes: Sequence[str] = ()
) -> dict[str, Any]:
    """``base`` (a condition on the model item) as an Update that also drops the deleted version from the history
    (``forgetting``), on the condition that the history is the one read; a REMOVE of ``removes`` besides."""
    sets, dropped, values, condition = forget if forget else ([], [], {}, "")
    clauses = (["SET " + ", ".join(sets)] if sets else []) + (
        ["REMOVE " + ", ".join([*removes, *dropped])] if [*removes, *dropped] else []
    )
    update = dict(base)
    update["UpdateExpression"] = " ".join(clauses)
    update["ExpressionAttributeValues"] = {**base.get("ExpressionAttributeValues", {}), **values}
    if condition:
        update["ConditionExpression"] = f"({base['ConditionExpression']}) AND {condition}"
    return update


def item_exists(table: str, key: dict[str, Any]) -> dict[str, Any]:
    """A transaction's check that the item under ``key`` exists (it fails the transaction otherwise)."""
    return {"ConditionCheck": {"TableName": table, "Key": key, "ConditionExpression": "attribute_exists(pk)"}}


def _event_key(at: float) -> str:
    stamp = datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    return f"EVENT#{stamp}Z#{secrets.token_hex(4)}"


class DynamoDBCanaryControl:
    """The canary writes of ``DynamoDBRegistry`` (which sets ``_client`` and ``_table``)."""

    _client: DynamoDBClient
    _table: str

    def _key(self, model: str, sk: str = "MODEL") -> dict[str, Any]:
        return {"pk": {"S": f"MODEL#{model}"}, "sk": {"S": sk}}

    def _model_item(self, model: str) -> dict[str, Any] | None:
        with aws_call("dynamodb.GetItem(registry)"):
            item: dict[str, Any] | None = self._client.get_item(
                TableName=self._table, Key=self._key(model), ConsistentRead=True
            ).get("Item")
        return item

    def running_canary(self, model: str) -> Canary | None:
        """The model's canary, read consistently (None: none runs, or no such model)."""
        item = self._model_item(model)
        return canary_of(item.get("canary")) if item else None

    # -- start -----------------------------------------------------------------------------------------
    def start_canary(
        self,
        model: str,
        version: str,
        share: float,
        now: float,
        params: CanaryParams | None = None,
        beside: str | None = None,
    ) -> Canary:
        """Give ``version`` (registered, not active) ``share`` of the model's queries from ``now``. ``NotFound``
        for an unknown model or version, ``InvalidInput`` for a share outside (0, 1) or the active version,
        ``Conflict`` while another canary runs; nothing is written then. ``beside``: the active version the
        caller read (and tells the operator the canary runs beside): ``ChangedMeanwhile`` when another is active
        now."""
        if not (math.isfinite(share) and 0.0 < share < 1.0):
            raise InvalidInput("share", "a fraction of the model's queries in (0, 1)", repr(share))
        canary = Canary(version, share, now, params or CanaryParams())
        actions: list[Any] = [
            {  # the version must exist; the update marks when it was last canaried
                "Update": {
                    "TableName": self._table,
                    "Key": self._key(model, f"VERSION#{version}"),
                    "UpdateExpression": "SET canaried_at = :t",
                    "ConditionExpression": "attribute_exists(pk)",
                    "ExpressionAttributeValues": {":t": {"N": repr(float(now))}},
                }
            },
            {
                "Update": {
                    "TableName": self._table,
                    "Key": self._key(model),
                    "UpdateExpression": "SET #c = :c",
                    "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(#c) AND active_version <> :v",
                    "ExpressionAttributeNames": {"#c": "canary"},
                    "ExpressionAttributeValues": {":c": canary_attr(canary), ":v": {"S": version}},
                }
            },
        ]
        if beside is not None:
            head = actions[1]["Update"]
            head["ConditionExpression"] += " AND active_version = :a"
            head["ExpressionAttributeValues"][":a"] = {"S": beside}
        try:
            self._client.transact_write_items(TransactItems=actions)
        except ClientError as e:
            if "ConditionalCheckFailed" in cancellation_codes(e):
                raise self._why_not_started(model, version, beside) from e
            if "TransactionConflict" in cancellation_codes(e):
                raise Conflict(f"model {model} was being changed meanwhile; no canary started - retry") from e
            raise translate(e, "dynamodb.TransactWriteItems(registry)") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.TransactWriteItems(registry)") from e
        return canary

    def _why_not_started(self, model: str, version: str, beside: str | None = None) -> Exception:
        item = self._model_item(model)
        if item is None:
            return NotFound("model", model)
        with aws_call("dynamodb.GetItem(registry)"):
            registered = "Item" in self._client.get_item(
                TableName=self._table, Key=self._key(model, f"VERSION#{version}"), ConsistentRead=True
            )
        if not registered:
            return NotFound("model version", f"{model}:{version}")
        running = canary_of(item.get("canary"))
        if running is not None:
            return Conflict(
                f"model {model} has a canary running already ({model}:{running.version}, trial {running.trial}): "
                "promote or abort it first"
            )
        active = item.get("active_version", {}).get("S")
        if beside is not None and active != beside and active != version:
            return ChangedMeanwhile(f"model {model}: its active version changed meanwhile (now {active}); look again")
        return InvalidInput("model_version", f"a version other than the active one ({version} is active)", version)

    # -- end -------------------------------------------------------------------------------------------
    def end_canary(self, model: str, trial: str, promote: bool) -> bool:
        """End the model's canary if ``trial`` still runs (``CanaryControl``): promote switches the active version
        to the canary's in the history rollback walks back, in the same conditional write. False when that trial
        no longer runs (someone ended it first); nothing is written then."""
        for _ in range(_RETRIES):
            item = self._model_item(model)
            running = canary_of(item.get("canary")) if item else None
            if item is None or running is None or running.trial != trial:
                return False
            stored = item["canary"]["M"]
            values = {":cv": stored["version"], ":cs": stored["started_at"]}
            same_trial = "#c.#v = :cv AND #c.#s = :cs"
            before = history_of(item)
            if promote and before.active != running.version:
                update = switch_update(self._table, model, before, before.switched_to(running.version))
                expression = update["UpdateExpression"]
                update["UpdateExpression"] = expression + (", #c" if " REMOVE " in expression else " REMOVE #c")
                update["ConditionExpression"] = f"({update['ConditionExpression']}) AND {same_trial}"
                update["ExpressionAttributeValues"] |= values
            else:
                update = {
                    "TableName": self._table,
                    "Key": self._key(model),
                    "UpdateExpression": "REMOVE #c",
                    "ConditionExpression": same_trial,
                    "ExpressionAttributeValues": values,
                }
            update["ExpressionAttributeNames"] = _NAMES
            try:
                self._client.update_item(**update)
            except ClientError as e:
                if error_code(e) == "ConditionalCheckFailedException":
                    continue  # ended by someone else, or the history changed: read again
                raise translate(e, "dynamodb.UpdateItem(registry)") from e
            except BotoCoreError as e:
                raise translate(e, "dynamodb.UpdateItem(registry)") from e
            return True
        raise Conflict(f"model {model}: its item kept changing; canary trial {trial} was not ended - retry")

    # -- deleting a version ----------------------------------------------------------------------------
    def delete_version(self, model: str, version: str) -> Canary | None:
        """Delete a version; when it is the running canary's, the canary ends with it (one transaction), and
        that canary is answered (None otherwise). A canary started on the version between the read and the delete
        makes the delete's guard fail (``_delete_inactive``): read again, it ends with the delete. Once the delete
        is written no canary can start on the version (a start needs its item), but one registered again can be
        canaried at once: nothing after the delete may end that canary, which is the new version's."""
        tombstone = self._tombstone(model, version)
        for _ in range(_RETRIES):
            running = self.running_canary(model)
            if running is None or running.version != version:
                if not self._delete_inactive(model, version, tombstone):
                    continue  # a canary started on it meanwhile: end it with the delete
                return None
            values = {":v": {"S": version}, ":s": {"N": repr(float(running.started_at))}}
            ending = {
                "Update": _forgetting_update(
                    {
                        "TableName": self._table,
                        "Key": self._key(model),
                        "ConditionExpression": "#c.#v = :v AND #c.#s = :s",
                        "ExpressionAttributeNames": _NAMES,
                        "ExpressionAttributeValues": values,
                    },
                    forgetting(self._model_item(model) or {}, version),
                    removes=["#c"],
                )
            }
            delete = {"Delete": {"TableName": self._table, "Key": self._key(model, f"VERSION#{version}")}}
            try:
                self._client.transact_write_items(TransactItems=[delete, ending, *tombstone])
            except ClientError as e:
                if cancellation_codes(e):  # the canary changed since it was read (or a concurrent write): again
                    continue
                raise translate(e, "dynamodb.TransactWriteItems(registry)") from e
            except BotoCoreError as e:
                raise translate(e, "dynamodb.TransactWriteItems(registry)") from e
            return running
        raise Conflict(f"model {model}: its canary kept changing; {model}:{version} was not deleted - retry")

    def _tombstone(self, model: str, version: str) -> list[dict[str, Any]]:
        """The Put, for the delete's transaction, of ``DELETED#<version>``: the upload the deleted version was
        registered from (its upload id and sha256), so that the same upload is not registered again (an
        S3 event delivered again, or the local stack finding the file in the bucket at its next start) while a
        new upload of the version is. None (an empty list) for a version added without an artifact."""
        with aws_call("dynamodb.GetItem(registry)"):
            got = self._client.get_item(
                TableName=self._table, Key=self._key(model, f"VERSION#{version}"), ConsistentRead=True
            )
        item = got.get("Item") or {}
        upload_id = item.get("upload_id", {}).get("S", "")
        if not upload_id:
            return []
        tomb = {
            **self._key(model, f"DELETED#{version}"),
            "upload_id": {"S": upload_id},
            "sha256": item.get("sha256", {"S": ""}),
            "deleted_at": {"N": repr(time.time())},
        }
        return [{"Put": {"TableName": self._table, "Item": tomb}}]

    def _delete_inactive(self, model: str, version: str, tombstone: list[dict[str, Any]] | None = None) -> bool:
        """Delete the version's item on the condition, checked in the same transaction, that it is not the active
        version and not a running canary's (an active version without its item would leave every query of the
        model with the default: a promotion or a switch can land between the caller's read and this delete).
        ``InvalidInput`` when it is the active version now; False when a canary runs on it now."""
        check = {
            "TableName": self._table,
            "Key": self._key(model),
            "ConditionExpression": (
                "(attribute_not_exists(active_version) OR active_version <> :v)"
                " AND (attribute_not_exists(#c) OR #c.#v <> :v)"
            ),
            "ExpressionAttributeNames": {"#c": _NAMES["#c"], "#v": _NAMES["#v"]},
            "ExpressionAttributeValues": {":v": {"S": version}},
        }
        delete = {"Delete": {"TableName": self._table, "Key": self._key(model, f"VERSION#{version}")}}
        forget = forgetting(self._model_item(model) or {}, version)
        guard = {"Update": _forgetting_update(check, forget)} if forget else {"ConditionCheck": check}
        try:
            self._client.transact_write_items(TransactItems=[guard, delete, *(tombstone or [])])
            return True
        except ClientError as e:
            if not cancellation_codes(e):
                raise translate(e, "dynamodb.TransactWriteItems(registry)") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.TransactWriteItems(registry)") from e
        item = self._model_item(model)
        if item is None:  # no model item (never made: a version is only registered with it): nothing to keep
            with aws_call("dynamodb.DeleteItem(registry)"):
                self._client.delete_item(TableName=self._table, Key=self._key(model, f"VERSION#{version}"))
            return True
        if item.get("active_version", {}).get("S") == version:
            raise InvalidInput("model_version", "an inactive version (set another version active first)", version)
        return False

    # -- events ----------------------------------------------------------------------------------------
    def add_canary_event(self, model: str, event: dict[str, Any]) -> None:
        """Keep an event (a start, a decision with its evidence, a promotion or abort by hand); ``at`` (seconds
        since the epoch) is the event's or now."""
        at = float(event.get("at") or time.time())
        body = {**event, "at": at}
        item = {
            **self._key(model, _event_key(at)),
            "at": {"N": repr(at)},
            "kind": {"S": str(event.get("kind", ""))},
            "event": {"S": json.dumps(body, sort_keys=True, default=str)},
        }
        with aws_call("dynamodb.PutItem(registry)"):
            self._client.put_item(TableName=self._table, Item=item)

    def canary_events(self, model: str, limit: int = 20) -> list[dict[str, Any]]:
        """The model's last ``limit`` canary events, newest first."""
        with aws_call("dynamodb.Query(registry)"):
            resp = self._client.query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :e)",
                ExpressionAttributeValues={":pk": {"S": f"MODEL#{model}"}, ":e": {"S": "EVENT#"}},
                ScanIndexForward=False,
                Limit=max(1, limit),
            )
        return [json.loads(i["event"]["S"]) for i in resp.get("Items", [])]
