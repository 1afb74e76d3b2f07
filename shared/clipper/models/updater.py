"""Event-triggered model updates: a file uploaded to ``models/<name>/<version>/model.onnx`` in the model
bucket is validated (``clipper.models.validation``) against the applications linked to the model, then
registered as a new version or recorded as rejected. A rejected file is never served.

:meth:`ModelUpdater.handle_object` decides, for one uploaded object:
- ``ignored``: the key is not ``models/<name>/<version>/model.onnx`` (admin's name rules), or the object is
  gone or was replaced since the event (a later event covers the new one). Nothing is written.
- ``duplicate``: this upload (its S3 version id, else its ETag) was handled already, or the version is
  registered with the same bytes (sha256). Nothing is written: a redelivered event changes nothing.
- ``rejected``: the file fails validation (its sample run stopped at the validation time limit included:
  ``clipper.models.isolated``), or the version exists with other bytes (versions are immutable),
  or there are no serving resources to give it. Recorded on ``REJECTED#<v>``; nothing is registered.
- ``registered``: ``VERSION#<v>`` is written. With ``ServingStacks`` (``clipper.models.serving``), the version
  gets its own queue and endpoint, created (with the model's ``replicas``) before it is registered; the endpoint
  loads exactly the object version read here and checks its sha256 before serving it. Without stacks (a
  deployment with ModelStacks off), nothing would load the file: a later version is rejected with the reason
  (taking the active version's queue and endpoint would report it active while the old model answers), and
  only a model's first version may take ``ServingDefaults`` (settings; ``{model}`` in them is the model's name:
  resources its operator runs for that model). Labels come from the active version. A model's first version
  becomes active, as with ``add_model``. When the model item says ``auto_promote``, the new version becomes
  active in the same transaction (conditional on the version history read, ``clipper.models.history``).
  Registered versions are never changed, so a query in flight finishes on the version that accepted it.

Items written in the registry table (layout of ``clipper.adapters.dynamodb_registry``):

    MODEL#<m> VERSION#<v>   what ``put_version`` writes (input_type, input_shape, queue_url, endpoint,
                            labels, created_at N) and status "registered", artifact "s3://<bucket>/<key>",
                            artifact_version_id (S3 version id; "" in an unversioned bucket), etag, size N,
                            sha256, upload_id (version id, else etag), signature (JSON of
                            ``Signature.to_dict``), promoted_at N (only when auto-promotion activated it)
    MODEL#<m> REJECTED#<v>  the latest rejected upload of the version (the serving path never reads it):
                            status "rejected", reasons (L of S), rejected_at N, and artifact,
                            artifact_version_id, etag, size, sha256 ("" when not read), upload_id,
                            signature ("" when the file did not load). Deleted when the version registers.
    MODEL#<m> MODEL         read: active_version and its history, auto_promote (BOOL, absent: false), replicas.
                            Created (active = the version) with a model's first version; promotion moves the
                            old active_version into the history (``dynamodb_history.switch_update``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from clipper.adapters.aws_errors import aws_call, cancellation_codes, error_code, translate
from clipper.adapters.dynamodb_canary_control import unless_canary
from clipper.adapters.dynamodb_history import history_of, switch_update
from clipper.adapters.dynamodb_registry import DynamoDBRegistry, batching_of
from clipper.core.domain import Application, BatchingSettings, ModelVersion
from clipper.errors import Conflict, NotFound, Throttled, Unavailable
from clipper.models.history import VersionHistory
from clipper.models.isolated import SubprocessValidator
from clipper.models.serving import (
    PROMOTE_METADATA,
    ModelArtifact,
    ServerDidNotStart,
    ServingStacks,
    StackServesAnotherFile,
    lambda_mapping,
    unserved_reason,
)
from clipper.models.validation import Signature, ValidationResult, validate_model
from clipper.ports import Clock

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client
else:
    DynamoDBClient = S3Client = Any

logger = logging.getLogger(__name__)

NAME, VERSION = r"[a-z0-9][a-z0-9-]{0,63}", r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"  # admin's AddModel rules
MODEL_KEY = re.compile(rf"models/(?P<model>{NAME})/(?P<version>{VERSION})/model\.onnx")
Status = Literal["registered", "rejected", "duplicate", "ignored"]


@dataclass(frozen=True)
class Upload:
    """One uploaded object, as its S3 event names it."""

    bucket: str
    key: str
    model: str
    version: str
    size: int
    etag: str
    version_id: str = ""

    @property
    def upload_id(self) -> str:
        return self.version_id or self.etag


@dataclass(frozen=True)
class ArtifactRecord:
    """What is recorded about an upload, on ``VERSION#<v>`` (registered) or ``REJECTED#<v>`` (rejected)."""

    upload: Upload
    sha256: str
    signature: Signature | None
    at: int  # created_at or rejected_at
    reasons: tuple[str, ...] = ()
    promoted: bool = False


@dataclass(frozen=True)
class Outcome:
    status: Status
    key: str
    model: str = ""
    version: str = ""
    promoted: bool = False  # the version became active
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServingDefaults:
    """Queue URL and endpoint of a model's first version (``{model}`` is replaced); empty: none."""

    queue_url: str = ""
    endpoint: str = ""


@dataclass(frozen=True)
class Seen:
    upload_id: str
    sha256: str


@dataclass(frozen=True)
class ModelView:
    """One model and one of its versions, as the updater needs them."""

    exists: bool = False
    auto_promote: bool = False
    replicas: int = 1
    active: ModelVersion | None = None
    registered: Seen | None = None  # VERSION#<v>; upload_id and sha256 "" when added without an artifact
    rejected: Seen | None = None  # REJECTED#<v>
    history: VersionHistory = field(default_factory=lambda: VersionHistory(None))  # active and earlier versions
    canary: str | None = None  # the version of the model's running canary
    deleted: Seen | None = None  # DELETED#<v>: the upload a deleted version was registered from
    batching: BatchingSettings | None = None  # the model's batching settings, when set_model_batching set them


class UpdaterRegistry(Protocol):
    def model_view(self, model: str, version: str) -> ModelView: ...

    def apps_linked_to(self, model: str) -> list[Application]: ...

    def register(self, mv: ModelVersion, record: ArtifactRecord, create_model: bool, history: VersionHistory) -> None:
        """Write the version with the new model item, or with its promotion (``record.promoted``), atomically;
        ``Conflict`` when the version (or, with ``create_model``, the model) exists, or the model's version
        ``history`` changed since it was read."""
        ...

    def reject(self, record: ArtifactRecord) -> bool:
        """Record a rejection; False when this upload's rejection is already recorded."""
        ...


@dataclass(frozen=True)
class Artifact:
    data: bytes
    promote: bool | None = None  # the uploader's wish (the object's clipper-promote metadata), over auto_promote


class ArtifactStore(Protocol):
    def read(self, upload: Upload) -> Artifact:
        """Exactly the uploaded bytes; ``NotFound`` when that object is gone or was replaced."""
        ...


class ModelValidator(Protocol):
    def validate(self, data: bytes, apps: Sequence[Application]) -> ValidationResult:
        """``validate_model``'s answer, or a rejection when it takes too long (``clipper.models.isolated``)."""
        ...


class InProcessValidator:
    """``validate_model`` in this process, with no time limit: for tests of the updater's other decisions."""

    def validate(self, data: bytes, apps: Sequence[Application]) -> ValidationResult:
        return validate_model(data, apps)


def validated_prefix(model: str, version: str) -> str:
    """Where a version's validated files are kept (deleted with its serving stack)."""
    return f"validated/{model}/{version}/"


def validated_key(model: str, version: str, sha256: str) -> str:
    """Where the validated file is kept for serving: a key no upload URL names, so nothing replaces it (an upload
    URL can be used again for minutes, and a SageMaker instance started later, by a scale-out or a replacement,
    loads what its stack names then)."""
    return f"{validated_prefix(model, version)}{sha256}/model.onnx"


class ModelUpdater:
    def __init__(
        self,
        registry: UpdaterRegistry,
        store: ArtifactStore,
        clock: Clock,
        defaults: ServingDefaults | None = None,
        max_bytes: int = 512 * 1024**2,
        stacks: ServingStacks | None = None,
        validator: ModelValidator | None = None,
    ) -> None:
        self._registry, self._store, self._clock = registry, store, clock
        self._defaults = defaults or ServingDefaults()
        self._stacks = stacks
        self._max_bytes = max_bytes
        self._validator = validator or InProcessValidator()

    def handle_object(self, bucket: str, key: str, size: int, etag: str, version_id: str | None = None) -> Outcome:
        match = MODEL_KEY.fullmatch(key)
        if match is None:
            return Outcome("ignored", key, reasons=("not a model artifact (models/<name>/<version>/model.onnx)",))
        up = Upload(bucket, key, match["model"], match["version"], size, etag.strip('"'), version_id or "")
        view = self._registry.model_view(up.model, up.version)
        if any(s and up.upload_id and s.upload_id == up.upload_id for s in (view.registered, view.rejected)):
            return _outcome(up, "duplicate")
        if view.deleted and up.upload_id and view.deleted.upload_id == up.upload_id and view.registered is None:
            why = f"{up.model}:{up.version} was registered from this upload and deleted since (upload it again)"
            return _outcome(up, "ignored", (why,))
        if size > self._max_bytes:
            return self._reject(up, "", None, f"the file has {size} bytes, over the limit of {self._max_bytes}")
        try:
            artifact = self._store.read(up)
            data = artifact.data
        except NotFound:
            return _outcome(up, "ignored", ("the object is gone or was replaced since the event",))
        digest = hashlib.sha256(data).hexdigest()
        apps = self._registry.apps_linked_to(up.model)
        result = self._validator.validate(data, apps)
        for _ in range(3):  # a lost race (a concurrent delivery, a new model's first versions) looks again
            if view.registered is not None:
                if view.registered.sha256 == digest:
                    return _outcome(up, "duplicate")
                other = "with other bytes" if view.registered.sha256 else "(added without an artifact)"
                why = f"{up.model}:{up.version} is already registered {other}; versions are immutable"
                return self._reject(up, digest, result.signature, why)
            if not result.ok or result.signature is None:
                return self._reject(up, digest, result.signature, *result.reasons)
            outcome = self._register(up, view, digest, result.signature, apps, artifact.promote)
            if outcome is not None:
                return outcome
            view = self._registry.model_view(up.model, up.version)
        raise Conflict(f"{up.model}:{up.version}: the registry kept changing during the update")

    def _register(
        self,
        up: Upload,
        view: ModelView,
        digest: str,
        sig: Signature,
        apps: list[Application],
        wish: bool | None = None,
    ) -> Outcome | None:
        current = view.active
        input_type = sig.input_type([current.input_type] if current else [a.input_type for a in apps])
        if input_type is None:
            return self._reject(up, digest, sig, f"no input type suits the model's input ({sig.input.element_type})")
        if self._stacks is not None:  # Unavailable when it cannot be created: the event is retried
            keep = getattr(self._store, "keep_validated", None)  # served from a copy nothing can replace
            artifact = (
                keep(up, digest)
                if keep is not None
                else ModelArtifact(f"s3://{up.bucket}/{up.key}", up.version_id, digest)
            )
            mapping = lambda_mapping(view.batching) if view.batching is not None else None
            try:
                serving = self._stacks.create(up.model, up.version, artifact, view.replicas, mapping)
            except ServerDidNotStart as e:  # the local stack's own model server: nothing of the version is left
                return self._reject(up, digest, sig, str(e))
            except StackServesAnotherFile as e:
                if view.deleted is not None and e.sha256 and e.sha256 == view.deleted.sha256:
                    # the deleted version's own stack, kept (another version uses its queue) or not deleted (its
                    # delete failed): no registration will come, so waiting would leave the upload without an answer
                    why = (
                        f"{up.model}:{up.version}'s serving stack still serves the file of the deleted version (kept: "
                        "another version uses its queue, or its delete failed): upload the file as a new version"
                    )
                    return self._reject(up, digest, sig, why)
                # another upload's stack: looked at again (it registers once its stack is up)
                logger.info("%s:%s not registered from %s yet: %s", up.model, up.version, up.upload_id, e)
                return None
            queue_url, endpoint = serving.queue_url, serving.endpoint
        elif not view.exists:
            queue_url = self._defaults.queue_url.replace("{model}", up.model)
            endpoint = self._defaults.endpoint.replace("{model}", up.model)
        else:
            queue_url = endpoint = ""
        if not queue_url or not endpoint:
            return self._reject(up, digest, sig, unserved_reason(up.model, up.version, view.history.active))
        # a row of free size is recorded as the linked applications' shape when they agree on one; when they differ
        # (the model serves each), as none: recorded as the first's, the registry's own check then refused the
        # version for the others (no switching back to it, no canary), though the upload had made it active
        shapes = {a.input_shape for a in apps if a.input_shape}
        shape = sig.fixed_row_shape or (next(iter(shapes)) if len(shapes) == 1 else None)
        labels = current.labels if current else ()
        mv = ModelVersion(up.model, up.version, input_type, queue_url, endpoint, shape, labels)
        # an explicit wish of the uploader wins over the model's setting; a new model's first version is active
        promote = view.exists and (view.auto_promote if wish is None else wish)
        if promote and view.canary is not None:  # the live evidence decides while a canary runs, not an upload
            logger.info("%s:%s not promoted: canary %s is running", up.model, up.version, view.canary)
            promote = False
        record = ArtifactRecord(up, digest, sig, int(self._clock.now()), promoted=promote)
        try:
            self._registry.register(mv, record, create_model=not view.exists, history=view.history)
        except Conflict:
            return None
        logger.info("registered %s:%s from s3://%s/%s (promoted: %s)", up.model, up.version, up.bucket, up.key, promote)
        return _outcome(up, "registered", promoted=promote or not view.exists)

    def _reject(self, up: Upload, digest: str, sig: Signature | None, *reasons: str) -> Outcome:
        if not self._registry.reject(ArtifactRecord(up, digest, sig, int(self._clock.now()), reasons)):
            return _outcome(up, "duplicate")
        logger.warning(
            "rejected %s:%s from s3://%s/%s: %s", up.model, up.version, up.bucket, up.key, "; ".join(reasons)
        )
        return _outcome(up, "rejected", reasons)


def _outcome(up: Upload, status: Status, reasons: tuple[str, ...] = (), promoted: bool = False) -> Outcome:
    return Outcome(status, up.key, up.model, up.version, promoted, reasons)


def build_model_updater(
    dynamodb: Any,
    s3: Any,
    registry_table: str,
    clock: Clock,
    defaults: ServingDefaults,
    max_bytes: int,
    stacks: ServingStacks | None = None,
    validation_timeout_s: float | None = None,
    validation_load_timeout_s: float | None = None,
    memory_mb: int | None = None,
) -> ModelUpdater:
    """The updater over these clients; with ``validation_timeout_s``, each file is validated in a child process
    whose sample run is stopped at that limit and its start and load at ``validation_load_timeout_s``
    (``SubprocessValidator``; ``memory_mb``, the function's, is named when the child is killed for its memory),
    else in this process with no limit."""
    registry = DynamoDBUpdaterRegistry(dynamodb, registry_table)
    validator = (
        SubprocessValidator(validation_timeout_s, validation_load_timeout_s, memory_mb=memory_mb)
        if validation_timeout_s is not None
        else None
    )
    return ModelUpdater(registry, S3ArtifactStore(s3), clock, defaults, max_bytes, stacks, validator)


# -- adapters ------------------------------------------------------------------------------------------
# what S3 answers for an upload deleted, or replaced since its event (its version gone, its ETag changed)
_UPLOAD_GONE = frozenset({"NoSuchKey", "NoSuchVersion", "PreconditionFailed", "404", "412"})


class S3ArtifactStore:
    """Reads exactly the uploaded object: its version id when the bucket is versioned, else If-Match its ETag."""

    def __init__(self, client: S3Client) -> None:
        self._client = client

    def read(self, upload: Upload) -> Artifact:
        pin = {"VersionId": upload.version_id} if upload.version_id else {"IfMatch": f'"{upload.etag}"'}
        try:
            got = self._client.get_object(Bucket=upload.bucket, Key=upload.key, **pin)
            data: bytes = got["Body"].read()
            wish = got.get("Metadata", {}).get(PROMOTE_METADATA)
        except ClientError as e:
            if error_code(e) in _UPLOAD_GONE:
                raise NotFound("model artifact", f"s3://{upload.bucket}/{upload.key}") from e
            raise translate(e, "s3.GetObject(model)") from e
        except BotoCoreError as e:
            raise translate(e, "s3.GetObject(model)") from e
        return Artifact(data, None if wish not in ("true", "false") else wish == "true")

    def keep_validated(self, upload: Upload, sha256: str) -> ModelArtifact:
        """A copy of exactly the uploaded object (its version, else If-Match its ETag) under ``validated_key``:
        what the version's stack serves. ``NotFound`` when the upload is gone or was replaced since."""
        key = validated_key(upload.model, upload.version, sha256)
        source: dict[str, str] = {"Bucket": upload.bucket, "Key": upload.key}
        pin: dict[str, Any] = {}
        if upload.version_id:
            source["VersionId"] = upload.version_id
        else:
            pin["CopySourceIfMatch"] = f'"{upload.etag}"'
        try:
            done = self._client.copy_object(Bucket=upload.bucket, Key=key, CopySource=source, **pin)
        except ClientError as e:
            if error_code(e) in _UPLOAD_GONE:
                raise NotFound("model artifact", f"s3://{upload.bucket}/{upload.key}") from e
            raise translate(e, "s3.CopyObject(model)") from e
        except BotoCoreError as e:
            raise translate(e, "s3.CopyObject(model)") from e
        return ModelArtifact(f"s3://{upload.bucket}/{key}", str(done.get("VersionId") or ""), sha256)


def _record_attrs(r: ArtifactRecord) -> dict[str, Any]:
    up = r.upload
    return {
        "pk": {"S": f"MODEL#{up.model}"},
        "artifact": {"S": f"s3://{up.bucket}/{up.key}"},
        "artifact_version_id": {"S": up.version_id},
        "etag": {"S": up.etag},
        "size": {"N": str(up.size)},
        "sha256": {"S": r.sha256},
        "upload_id": {"S": up.upload_id},
        "signature": {"S": json.dumps(r.signature.to_dict()) if r.signature else ""},
    }


class DynamoDBUpdaterRegistry:
    """:class:`UpdaterRegistry` over the registry table; applications are read through ``DynamoDBRegistry``.
    The applications linked to a model are found by the model's reverse link items (one query)."""

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client, self._table = client, table
        self._registry = DynamoDBRegistry(client, table)

    def model_view(self, model: str, version: str) -> ModelView:
        keys = [
            {"pk": {"S": f"MODEL#{model}"}, "sk": {"S": sk}}
            for sk in ("MODEL", f"VERSION#{version}", f"REJECTED#{version}", f"DELETED#{version}")
        ]
        with aws_call("dynamodb.BatchGetItem(updater)"):
            resp = self._client.batch_get_item(RequestItems={self._table: {"Keys": keys, "ConsistentRead": True}})
        if resp.get("UnprocessedKeys"):
            raise Throttled("dynamodb.BatchGetItem(updater): unprocessed keys")
        items = {i["sk"]["S"]: i for i in resp.get("Responses", {}).get(self._table, [])}
        head = items.get("MODEL")
        rejected = _seen(items.get(f"REJECTED#{version}"))
        deleted = _seen(items.get(f"DELETED#{version}"))
        if head is None:
            return ModelView(rejected=rejected, deleted=deleted)
        history = history_of(head)
        active = head.get("active_version", {}).get("S")
        try:
            current = self._registry.get_version(model, active) if active else None
        except NotFound:
            current = None
        auto = bool(head.get("auto_promote", {}).get("BOOL", False))
        replicas = int(head.get("replicas", {}).get("N", "1"))
        canary = head.get("canary", {}).get("M", {}).get("version", {}).get("S")
        registered = _seen(items.get(f"VERSION#{version}"))
        batching = batching_of(head["batching"]) if "batching" in head else None
        return ModelView(True, auto, replicas, current, registered, rejected, history, canary, deleted, batching)

    def apps_linked_to(self, model: str) -> list[Application]:
        names = self._registry.apps_linked_to(model)
        apps = []
        for name in sorted(names):
            try:
                apps.append(self._registry.get_app(name))
            except NotFound:  # a link left behind by a deleted application
                continue
        return apps

    def register(self, mv: ModelVersion, record: ArtifactRecord, create_model: bool, history: VersionHistory) -> None:
        pk, at = {"S": f"MODEL#{mv.name}"}, {"N": str(record.at)}
        item = _record_attrs(record) | {
            "sk": {"S": f"VERSION#{mv.version}"},
            "status": {"S": "registered"},
            "input_type": {"S": mv.input_type.value},
            "input_shape": {"L": [{"N": str(d)} for d in mv.input_shape]} if mv.input_shape else {"NULL": True},
            "queue_url": {"S": mv.queue_url},
            "endpoint": {"S": mv.endpoint},
            "labels": {"L": [{"S": x} for x in mv.labels]},
            "created_at": at,
        }
        if record.promoted:
            item["promoted_at"] = at
        new = "attribute_not_exists(pk)"
        actions: list[dict[str, Any]] = [
            {"Put": {"TableName": self._table, "Item": item, "ConditionExpression": new}},
            {"Delete": {"TableName": self._table, "Key": {"pk": pk, "sk": {"S": f"REJECTED#{mv.version}"}}}},
        ]
        head: dict[str, Any] = {"pk": pk, "sk": {"S": "MODEL"}}
        if create_model:
            head |= {"active_version": {"S": mv.version}, "history": {"L": []}, "switches": {"N": "1"}}
            actions.append({"Put": {"TableName": self._table, "Item": head, "ConditionExpression": new}})
        elif record.promoted:
            # refused if a canary started since the view was read: the registration then looks again (Conflict)
            switch = switch_update(self._table, mv.name, history, history.switched_to(mv.version))
            actions.append({"Update": unless_canary(switch)})
        try:
            self._client.transact_write_items(TransactItems=actions)
        except ClientError as e:
            if error_code(e) != "TransactionCanceledException":
                raise translate(e, "dynamodb.TransactWriteItems(updater)") from e
            codes = set(cancellation_codes(e))
            if codes - {"None", "ConditionalCheckFailed", "TransactionConflict"}:
                raise Unavailable(f"dynamodb.TransactWriteItems(updater): cancelled, {sorted(codes)}") from e
            raise Conflict(f"{mv.name}:{mv.version} was registered concurrently") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.TransactWriteItems(updater)") from e

    def reject(self, record: ArtifactRecord) -> bool:
        item = _record_attrs(record) | {
            "sk": {"S": f"REJECTED#{record.upload.version}"},
            "status": {"S": "rejected"},
            "reasons": {"L": [{"S": r} for r in record.reasons]},
            "rejected_at": {"N": str(record.at)},
        }
        try:
            self._client.put_item(
                TableName=self._table,
                Item=item,
                ConditionExpression="attribute_not_exists(upload_id) OR upload_id <> :u",
                ExpressionAttributeValues={":u": item["upload_id"]},
            )
        except ClientError as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return False
            raise translate(e, "dynamodb.PutItem(updater)") from e
        except BotoCoreError as e:
            raise translate(e, "dynamodb.PutItem(updater)") from e
        return True


def _seen(item: dict[str, Any] | None) -> Seen | None:
    return Seen(item.get("upload_id", {}).get("S", ""), item.get("sha256", {}).get("S", "")) if item else None
