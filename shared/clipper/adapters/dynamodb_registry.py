"""The registry of applications, models, versions and links, in one DynamoDB table.

Items (``pk``, ``sk``):
    APP#<app>     APP            the application (input type, shape, default output, SLO, policy)
    APP#<app>     LINK#<model>   a link from the application to a model
    MODEL#<model> MODEL          the model (its active version)
    MODEL#<model> VERSION#<v>    a deployed version (input type, shape, queue URL, endpoint, labels)
    MODEL#<model> BATCHER#<v>    the batching controller's state for that version (survives cold starts)
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from clipper.adapters.aws_errors import aws_call, error_code, translate
from clipper.core.domain import Application, InputType, Model, ModelVersion
from clipper.errors import Conflict, NotFound

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


class DynamoDBRegistry:
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
        links = sorted(i["sk"]["S"][len("LINK#") :] for i in items if i["sk"]["S"].startswith("LINK#"))
        app = Application(
            name=name,
            input_type=InputType(app_item["input_type"]["S"]),
            default_output=app_item["default_output"]["S"],
            latency_slo_micros=int(app_item["latency_slo_micros"]["N"]),
            input_shape=_shape_of(app_item.get("input_shape")),
            policy=app_item.get("policy", {}).get("S", "single"),
            confidence_threshold=float(app_item.get("confidence_threshold", {}).get("N", "0")),
            default_when_unsure=bool(app_item.get("default_when_unsure", {}).get("BOOL", False)),
        )
        return app, links

    def get_app(self, name: str) -> Application:
        return self.app_and_links(name)[0]

    def linked_models(self, app: str) -> list[str]:
        return self.app_and_links(app)[1]

    def model_and_versions(self, name: str) -> tuple[Model, dict[str, ModelVersion]]:
        items = self._query(f"MODEL#{name}")
        head = next((i for i in items if i["sk"]["S"] == "MODEL"), None)
        if head is None:
            raise NotFound("model", name)
        versions = {}
        for i in items:
            if not i["sk"]["S"].startswith("VERSION#"):
                continue
            v = i["sk"]["S"][len("VERSION#") :]
            versions[v] = ModelVersion(
                name=name,
                version=v,
                input_type=InputType(i["input_type"]["S"]),
                queue_url=i["queue_url"]["S"],
                endpoint=i["endpoint"]["S"],
                input_shape=_shape_of(i.get("input_shape")),
                labels=tuple(x["S"] for x in i.get("labels", {}).get("L", [])),
            )
        return Model(name, head["active_version"]["S"]), versions

    def active_version(self, model: str) -> ModelVersion:
        head, versions = self.model_and_versions(model)
        if head.active_version not in versions:
            raise NotFound("model version", f"{model}:{head.active_version}")
        return versions[head.active_version]

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
                raise Conflict(f"{item['pk']['S']} {item['sk']['S']} already exists") from e
            raise translate(e, "dynamodb.PutItem(registry)") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.PutItem(registry)") from e

    def put_app(self, app: Application, overwrite: bool = False) -> None:
        self._put(
            {
                "pk": {"S": f"APP#{app.name}"},
                "sk": {"S": "APP"},
                "input_type": {"S": app.input_type.value},
                "default_output": {"S": app.default_output},
                "latency_slo_micros": {"N": str(app.latency_slo_micros)},
                "input_shape": _shape_attr(app.input_shape),
                "policy": {"S": app.policy},
                "confidence_threshold": {"N": repr(float(app.confidence_threshold))},
                "default_when_unsure": {"BOOL": app.default_when_unsure},
                "updated_at": {"N": str(int(time.time()))},
            },
            None if overwrite else "attribute_not_exists(pk)",
        )

    def link(self, app: str, model: str) -> None:
        self._put({"pk": {"S": f"APP#{app}"}, "sk": {"S": f"LINK#{model}"}})

    def put_version(self, mv: ModelVersion, activate: bool = False) -> None:
        self._put(
            {
                "pk": {"S": f"MODEL#{mv.name}"},
                "sk": {"S": f"VERSION#{mv.version}"},
                "input_type": {"S": mv.input_type.value},
                "input_shape": _shape_attr(mv.input_shape),
                "queue_url": {"S": mv.queue_url},
                "endpoint": {"S": mv.endpoint},
                "labels": {"L": [{"S": x} for x in mv.labels]},
                "created_at": {"N": str(int(time.time()))},
            }
        )
        if activate:
            self.set_active_version(mv.name, mv.version)

    def set_active_version(self, model: str, version: str) -> None:
        """Make ``version`` active; the one it replaces becomes ``previous_version`` (for rollback). Other
        attributes of the model item are kept."""
        with aws_call("dynamodb.UpdateItem(registry)"):
            self._client.update_item(
                TableName=self._table,
                Key={"pk": {"S": f"MODEL#{model}"}, "sk": {"S": "MODEL"}},
                UpdateExpression="SET previous_version = if_not_exists(active_version, :v), active_version = :v",
                ExpressionAttributeValues={":v": {"S": version}},
            )

    def previous_version(self, model: str) -> str | None:
        with aws_call("dynamodb.GetItem(registry)"):
            item = self._client.get_item(
                TableName=self._table, Key={"pk": {"S": f"MODEL#{model}"}, "sk": {"S": "MODEL"}}, ConsistentRead=True
            ).get("Item", {})
        prev = item.get("previous_version", {}).get("S")
        return prev if prev and prev != item.get("active_version", {}).get("S") else None

    def _scan(self, sk: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "FilterExpression": "sk = :sk",
            "ExpressionAttributeValues": {":sk": {"S": sk}},
        }
        while True:
            with aws_call("dynamodb.Scan(registry)"):
                resp = self._client.scan(**kwargs)
            items.extend(resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return items
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def app_names(self) -> list[str]:
        return sorted(i["pk"]["S"][len("APP#") :] for i in self._scan("APP"))

    def model_names(self) -> list[str]:
        return sorted(i["pk"]["S"][len("MODEL#") :] for i in self._scan("MODEL"))

    def _delete(self, pk: str, sk: str) -> None:
        with aws_call("dynamodb.DeleteItem(registry)"):
            self._client.delete_item(TableName=self._table, Key={"pk": {"S": pk}, "sk": {"S": sk}})

    def unlink(self, app: str, model: str) -> None:
        self._delete(f"APP#{app}", f"LINK#{model}")

    def delete_app(self, name: str) -> None:
        """The application and its links (models stay)."""
        for item in self._query(f"APP#{name}"):
            self._delete(item["pk"]["S"], item["sk"]["S"])

    def delete_version(self, model: str, version: str) -> None:
        self._delete(f"MODEL#{model}", f"VERSION#{version}")


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
