"""The management operations over the registry. Every rejection raises the project's errors before
anything is written: ``NotFound`` (unknown app, model or version), ``Conflict`` (duplicate), and
``InvalidInput`` naming the field (bad SLO, incompatible link, deleting the active version...)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from clipper.admin import schemas
from clipper.admin.batching import get_model_batching, set_model_batching
from clipper.admin.canary import (
    deleted_canary_event,
    end_by_hand,
    get_canary,
    record_event,
    refuse_switch_while_canary,
    start_canary,
)
from clipper.admin.compatibility import check_compatible, check_serves_linked_apps, linked_apps
from clipper.admin.policy_params import set_policy_params
from clipper.admin.ports import AdminRegistry, ModelUploads, ServingProbe
from clipper.admin.views import (
    app_info,
    models_state,
    no_version,
    params_in_use,
    rejection,
    replicas,
    version_info,
)
from clipper.core.domain import (
    Application,
    BatchingSettings,
    Canary,
    InputType,
    ModelRecord,
    ModelVersion,
    new_incarnation,
)
from clipper.errors import ChangedMeanwhile, ClipperError, Conflict, InvalidInput, NotFound, Unavailable
from clipper.models.serving import PROMOTE_METADATA, ServingStacks, check_idle, unserved_reason
from clipper.models.updater import validated_prefix
from clipper.ports import CanaryEvidenceStore, Clock

logger = logging.getLogger(__name__)

# a version's serving stack is deleted after its registry item: tried again after these waits before the operation
# answers 503 (a retry of it finds no version, so a transient failure left the stack serving nothing, billed)
RETIRE_BACKOFF_S = (0.25, 1.0, 2.0)
# a change of an application made from a read is redone this many times when another change lands between its
# read and its write (``ChangedMeanwhile``) before the operation answers 409
CHANGE_ATTEMPTS = 5

T = TypeVar("T")


def redone_on_change(change: Callable[[], T], attempts: int = CHANGE_ATTEMPTS) -> T:
    """``change()`` (a read, then a write over the revision read), read and made again while another change
    landed in between, at most ``attempts`` times (then its ``ChangedMeanwhile``, a 409, stands). Each attempt
    checks its request against what it read, so a change that no longer fits is refused, not forced."""
    for attempt in range(1, attempts + 1):
        try:
            return change()
        except ChangedMeanwhile:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


class AdminService:
    def __init__(
        self,
        registry: AdminRegistry,
        probe: ServingProbe | None = None,
        uploads: ModelUploads | None = None,
        stacks: ServingStacks | None = None,
        evidence: CanaryEvidenceStore | None = None,
        clock: Clock | None = None,
        feedback_queues: Mapping[str, str] | None = None,
    ) -> None:
        """``evidence``: where a canary's live evidence is counted (``get_canary`` shows it when given);
        ``feedback_queues``: the feedback queue's URL (``queue``) and its dead-letter queue's (``dead_letter``),
        whose depths ``get_state`` shows (with the probe)."""
        self._registry = registry
        self._probe = probe
        self._feedback_queues = {k: v for k, v in (feedback_queues or {}).items() if v}
        self._uploads = uploads
        self._stacks = stacks
        self._evidence = evidence
        self._now = clock.now if clock is not None else time.time

    # -- applications ----------------------------------------------------------------------------------
    def add_app(self, req: schemas.AddApp) -> dict[str, Any]:
        app = Application(
            req.name,
            InputType(req.input_type),
            req.default_output,
            req.latency_slo_micros,
            tuple(req.input_shape) if req.input_shape else None,
            req.policy,
            req.confidence_threshold,
            req.default_when_unsure,
            incarnation=new_incarnation(),
        )
        self._registry.put_app(app)  # Conflict when it exists
        return app_info(app, [])

    def get_application(self, name: str) -> dict[str, Any]:
        """The application, its links, and the parameters its policy runs with (``policy_params_in_use``: the set
        ones and the policy's defaults for the rest; Exp4's ``k`` as the number of models a query asks)."""
        app, links = self._registry.app_and_links(name)
        return {**app_info(app, links), "policy_params_in_use": params_in_use(app, links)}

    def get_all_applications(self, verbose: bool = False) -> list[Any]:
        names = self._registry.app_names()
        return [self.get_application(n) for n in names] if verbose else names

    def set_app_policy(self, req: schemas.SetPolicy) -> dict[str, Any]:
        """Change how an application selects models; its bandit state starts afresh for the new policy."""
        return redone_on_change(lambda: self._set_app_policy(req))

    def _set_app_policy(self, req: schemas.SetPolicy) -> dict[str, Any]:
        app, links = self._registry.app_and_links(req.name)
        updated = replace(
            app,
            policy=req.policy,
            confidence_threshold=app.confidence_threshold
            if req.confidence_threshold is None
            else req.confidence_threshold,
            default_when_unsure=app.default_when_unsure if req.default_when_unsure is None else req.default_when_unsure,
        )
        self._registry.put_app(updated, overwrite=True)
        return app_info(updated, links)

    def set_policy_params(self, req: schemas.SetPolicyParams) -> dict[str, Any]:
        return redone_on_change(lambda: set_policy_params(self._registry, req))

    def delete_app(self, name: str) -> dict[str, Any]:
        self._registry.app_and_links(name)  # NotFound
        self._registry.delete_app(name)
        return {"deleted": name}

    # -- models ----------------------------------------------------------------------------------------
    def add_model(self, req: schemas.AddModel) -> dict[str, Any]:
        try:
            head, versions = self._registry.model_and_versions(req.model_name)
        except NotFound:
            head, versions = None, {}
        if req.model_version in versions:
            raise InvalidInput("model_version", f"a new version of {req.model_name}", f"{req.model_version} exists")
        current = versions.get(head.active_version) if head else None
        queue_url = req.queue_url or (current.queue_url if current else "")
        endpoint = req.endpoint or (current.endpoint if current else "")
        if bool(queue_url) != bool(endpoint):
            raise InvalidInput("queue_url", "both queue_url and endpoint, or neither", "one of them")
        # Neither, for a new model: registered without serving resources, as Clipper's register_model does
        # (queries answer the default with that cause until a model file is deployed for it).
        mv = ModelVersion(
            req.model_name,
            req.model_version,
            InputType(req.input_type),
            queue_url,
            endpoint,
            tuple(req.input_shape) if req.input_shape else None,
            tuple(req.labels),
        )
        for app in linked_apps(self._registry, req.model_name):
            check_compatible(app, mv, "input_type")
        if req.activate and head is not None:
            refuse_switch_while_canary(head)
        fixed = req.batch_size or 0  # Clipper's batch_size: > 0 fixes it, -1 adapts
        batching = BatchingSettings("fixed", fixed, max(fixed, 256)) if fixed > 0 else None
        if batching is not None and batching.problems():
            raise InvalidInput("batch_size", "at most 10000 (or -1: adaptive)", str(fixed))
        self._registry.put_version(mv, activate=req.activate or head is None)
        if req.auto_promote is not None or batching is not None:
            self._registry.set_model_settings(req.model_name, auto_promote=req.auto_promote, batching=batching)
        return version_info(mv, mv.version if (req.activate or head is None) else head.active_version, batching)

    def get_model(self, model: str, version: str) -> dict[str, Any]:
        """A registered version (with its artifact, and the rejection of a later upload of it, if any); a
        version that was only ever rejected answers ``status: rejected`` with the reasons."""
        try:
            record = self._registry.model_record(model)
        except NotFound:
            record = None
        if record is not None:
            rejected = record.rejected.get(version)
        else:  # no version of it registered yet: its first uploads may have been rejected
            rejected = self._registry.rejected_uploads(model).get(version)
        if record is None or version not in record.versions:
            if rejected is not None:
                return {"model_name": model, "model_version": version, "status": "rejected", **rejection(rejected)}
            raise NotFound("model version", f"{model}:{version}")
        info = version_info(record.versions[version], record.head.active_version, record.batching)
        info |= {"status": "registered", **record.artifacts.get(version, {})}
        if rejected is not None:
            info["rejected_upload"] = rejection(rejected)
        return info

    def set_auto_promote(self, model: str, on: bool) -> dict[str, Any]:
        self._registry.set_model_settings(model, auto_promote=on)  # NotFound
        return {"model_name": model, "auto_promote": on}

    def set_num_replicas(self, model: str, replicas: int) -> dict[str, Any]:
        """Record the model's replica count and apply it to each version that has its own serving stack."""
        record = self._registry.model_record(model)  # NotFound
        if self._stacks is not None:
            check_idle(self._stacks, model, record.versions)  # a 409 changes nothing
        self._registry.set_model_settings(model, replicas=replicas)
        scaled, unmanaged = [], []
        for version in record.versions:
            if self._stacks is None:
                unmanaged.append(version)
                continue
            try:
                self._stacks.scale(model, version, replicas)
                scaled.append(version)
            except NotFound:  # added with add_model and explicit resources: not ours to scale
                unmanaged.append(version)
        return {
            "model_name": model,
            "num_replicas": replicas,
            "scaled_versions": scaled,
            "unmanaged_versions": unmanaged,
        }

    def get_num_replicas(self, model: str) -> dict[str, Any]:
        return {"model_name": model, "num_replicas": self._registry.model_record(model).replicas}

    def _retire(self, model: str, gone: ModelVersion, kept: Iterable[ModelVersion], sha256: str = "") -> None:
        """Delete a deleted version's serving stack, when it has one (its queue, endpoint and instances), unless
        a version that stays is served by the same queue: a version added without resources of its own copies
        the active version's, so the stack of an old version may serve the current one. With its stack goes the
        copy of the file it served (``sha256``: the file's, as registered; none for a version added without one)."""
        if self._stacks is None or any(v.queue_url == gone.queue_url for v in kept):
            return
        for wait_s in (*RETIRE_BACKOFF_S, None):
            try:
                self._stacks.delete(model, gone.version)
            except NotFound:
                pass  # no stack of its own, or gone already
            except Unavailable as e:  # throttled, or CloudFormation unreachable: the registry item is gone already
                if wait_s is None:  # a retry of the operation would find no version (404): say what is left
                    raise Unavailable(
                        f"{model}:{gone.version} was deleted from the registry, but its serving stack (queue, "
                        f"endpoint, instances) was not: {e}; delete the version's model stack with CloudFormation"
                    ) from e
                time.sleep(wait_s)
                continue
            self._drop_validated_copy(model, gone.version, sha256)
            return

    def _drop_validated_copy(self, model: str, version: str, sha256: str) -> None:
        """The file a deleted version's stack served, copied there by the model updater (``validated/<model>/
        <version>/<sha256>/``): nothing serves it once the stack is gone. Not when the version was registered again
        from the same bytes meanwhile (an upload handled while its stack was deleted: the copy is the new
        registration's; another file is copied under its own digest). Never fails the delete: the registry item
        and the stack are gone already; a copy left behind is storage only, and is logged."""
        if self._uploads is None or not sha256:
            return
        try:
            if _sha256(self._registry.model_record(model), version) == sha256:
                return
        except NotFound:
            pass
        prefix = f"{validated_prefix(model, version)}{sha256}/"
        try:
            self._uploads.delete_prefix(prefix)
        except (Unavailable, ClipperError) as e:
            logger.warning(
                "the validated copy of %s:%s was not deleted (%s): delete %s by hand", model, version, e, prefix
            )

    def get_upload_url(
        self, model: str, version: str, expires_s: int = 900, promote: bool | None = None
    ) -> dict[str, Any]:
        """A presigned PUT of the version's model file; with ``promote``, the object carries the wish as metadata
        (signed into the URL: the PUT must send ``headers``), which the model updater follows over the model's
        auto_promote. Refused (``Conflict``) for a version registered already (versions are immutable: another
        file there would be rejected, and must never be served), and, where uploads get no serving stacks, for
        a later version of a model (the updater would reject it: nothing would load its file), and, while the model
        runs a canary, for an upload that would make the version active (``promote``, or the model's auto_promote
        when not given: it would be registered and left inactive)."""
        if self._uploads is None:
            raise Unavailable("model uploads: this deployment has no model bucket (CLIPPER_MODEL_BUCKET is not set)")
        try:
            record: ModelRecord | None = self._registry.model_record(model)
        except NotFound:
            record = None
        head, versions = (record.head, record.versions) if record is not None else (None, {})
        if version in versions:
            other = (
                "; it is the active version"
                if head is not None and version == head.active_version
                else f" (or start this one as the canary: POST /admin/start_canary, `clipper canary {model} --start "
                f"{version}`)"
            )
            raise Conflict(
                f"{model}:{version} is registered already and versions are immutable: upload a new version{other}"
            )
        if head is not None and self._stacks is None:
            raise Conflict(unserved_reason(model, version, head.active_version))
        running = head.canary if head is not None else None
        if running is not None and (promote if promote is not None else record is not None and record.auto_promote):
            # the upload would be registered and not made active (the canary's evidence decides meanwhile)
            raise Conflict(
                f"model {model} has a canary running ({model}:{running.version}, trial {running.trial}): a new "
                "version cannot become active meanwhile; upload it with promote false (`clipper deploy "
                "--no-promote`, `clipper upload-url --no-promote`), or promote or abort the canary first"
            )
        key = f"models/{model}/{version}/model.onnx"
        metadata = None if promote is None else {PROMOTE_METADATA: "true" if promote else "false"}
        url = self._uploads.upload_url(key, expires_s, metadata)
        # a PUT of a form's content type hung the local stack's S3 (moto) or stored nothing; S3 takes any
        headers = {"Content-Type": "application/octet-stream"}
        headers |= {f"x-amz-meta-{k}": v for k, v in (metadata or {}).items()}
        return {
            "url": url,
            "method": "PUT",
            "headers": headers,
            "bucket": self._uploads.bucket,
            "key": key,
            "expires_s": expires_s,
        }

    def get_all_models(self, verbose: bool = False) -> list[Any]:
        out: list[Any] = []
        for name in self._registry.model_names():
            record = self._registry.model_record(name)
            if verbose:
                out.extend(
                    version_info(v, record.head.active_version, record.batching) for v in record.versions.values()
                )
            else:
                out.extend(f"{name}:{v}" for v in record.versions)
        return out

    # -- replicas, as Clipper lists its model containers -------------------------------------------------
    def get_all_containers(self, verbose: bool = False) -> list[Any]:
        """Clipper's model containers: one per replica of each served version (``name:version:replica``)."""
        out: list[Any] = []
        for name in self._registry.model_names():
            listed = replicas(self._registry.model_record(name))
            out.extend(r if verbose else f"{r['model_id']}:{r['model_replica_id']}" for r in listed)
        return out

    def get_container(self, model: str, version: str, replica_id: int) -> dict[str, Any]:
        for r in replicas(self._registry.model_record(model)):  # NotFound
            if r["model_version"] == version and r["model_replica_id"] == replica_id:
                return r
        raise NotFound("model replica", f"{model}:{version}:{replica_id}")

    # -- batching --------------------------------------------------------------------------------------
    def set_model_batching(self, req: schemas.ModelBatching) -> dict[str, Any]:
        return set_model_batching(self._registry, self._stacks, req)

    def get_model_batching(self, model: str) -> dict[str, Any]:
        return get_model_batching(self._registry, model)

    def set_model_version(self, model: str, version: str) -> dict[str, Any]:
        record = self._registry.model_record(model)  # NotFound
        if version not in record.versions:
            raise no_version(record, version)
        refuse_switch_while_canary(record.head)  # and the registry's write is conditional on no canary
        check_serves_linked_apps(self._registry, record.versions[version], "model_version", record.linked_apps)
        previous = self._registry.set_active_version(model, version)
        # the version active already: nothing written (no history entry: a rollback does not step back to it)
        changed = previous != version
        return {"model_name": model, "active_version": version, "previous_version": previous, "changed": changed}

    def rollback_model(self, model: str) -> dict[str, Any]:
        """Return to the version active before the current one, one step further back each time (3 -> 2 -> 1),
        skipping versions deleted since. A conditional write: ``Conflict`` (409) when the active version changed
        meanwhile (an auto-promotion, another rollback), and nothing is changed."""
        record = self._registry.model_record(model)  # NotFound
        refuse_switch_while_canary(record.head)
        now = self._registry.version_history(model)
        after = now.rolled_back(record.versions.keys())
        if after is None or after.active is None:
            raise InvalidInput("model_name", f"a model with an earlier active version to return to ({model} has none)")
        check_serves_linked_apps(self._registry, record.versions[after.active], "model_name", record.linked_apps)
        self._registry.switch_version(model, now, after)
        changed = after.active != now.active  # as set_model_version's answer: a rollback always changes one
        return {"model_name": model, "active_version": after.active, "previous_version": now.active, "changed": changed}

    def delete_versioned_model(self, model: str, version: str) -> dict[str, Any]:
        record = self._registry.model_record(model)  # NotFound
        head, versions = record.head, record.versions
        if version not in versions:
            raise no_version(record, version)
        if version == head.active_version:
            raise InvalidInput("model_version", "an inactive version (set another version active first)", version)
        self._deleted(model, self._registry.delete_version(model, version))
        kept = [v for k, v in versions.items() if k != version]
        self._retire(model, versions[version], kept, _sha256(record, version))
        return {"deleted": f"{model}:{version}"}

    def stop_inactive_model_versions(self, model: str) -> dict[str, Any]:
        """Delete every version that answers no query: not the active one, nor a running canary's (it answers its
        share: a cleanup call ended a 50 % canary without a word, a user's review; ``abort_canary`` ends one, or
        ``delete_versioned_model`` names it)."""
        record = self._registry.model_record(model)  # NotFound
        head, versions = record.head, record.versions
        serving = {head.active_version, head.canary.version if head.canary is not None else None}
        gone = [v for v in versions if v not in serving]
        for v in gone:
            self._deleted(model, self._registry.delete_version(model, v))
            self._retire(model, versions[v], [versions[k] for k in versions if k not in gone], _sha256(record, v))
        return {"deleted": [f"{model}:{v}" for v in gone]}

    def _deleted(self, model: str, ended: Canary | None) -> None:
        if ended is not None:  # the deleted version was the canary's: the canary ended with it
            record_event(self._registry, model, deleted_canary_event(model, ended, self._now()))  # logged if lost

    # -- canary ----------------------------------------------------------------------------------------
    def start_canary(self, req: schemas.StartCanary) -> dict[str, Any]:
        return redone_on_change(lambda: start_canary(self._registry, req, self._now()))

    def get_canary(self, model: str, events: int = 10) -> dict[str, Any]:
        return get_canary(self._registry, self._evidence, model, events)

    def end_canary(self, model: str, promote: bool) -> dict[str, Any]:
        return end_by_hand(self._registry, model, promote, self._now())

    # -- links -----------------------------------------------------------------------------------------
    def add_model_links(self, app_name: str, model_names: list[str]) -> dict[str, Any]:
        app, links = self._registry.app_and_links(app_name)
        for name in model_names:
            head, versions = self._registry.model_and_versions(name)
            check_compatible(app, versions[head.active_version], "model_names")
            if head.canary is not None and head.canary.version in versions:  # it answers a share of the queries
                check_compatible(app, versions[head.canary.version], "model_names")
        for name in model_names:
            self._registry.link(app_name, name)
        added = [m for m in dict.fromkeys(model_names) if m not in links]
        return {"app_name": app_name, "linked_models": links + added}  # the registry's order: the order linked

    def delete_model_links(self, app_name: str, model_names: list[str]) -> dict[str, Any]:
        _, links = self._registry.app_and_links(app_name)
        unknown = [m for m in model_names if m not in links]
        if unknown:
            raise InvalidInput(
                "model_names", f"models linked to {app_name} ({', '.join(links) or 'none'})", ", ".join(unknown)
            )
        for name in model_names:
            self._registry.unlink(app_name, name)
        return {"app_name": app_name, "linked_models": [m for m in links if m not in model_names]}

    def get_linked_models(self, app_name: str) -> list[str]:
        return self._registry.app_and_links(app_name)[1]

    # -- state ---------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        apps = {n: self.get_application(n) for n in self._registry.app_names()}
        state = {"applications": apps, "models": models_state(self._registry, self._probe)}
        if self._probe is not None and self._feedback_queues:
            state["feedback"] = {name: self._depth(url) for name, url in self._feedback_queues.items()}
        return state

    def _depth(self, queue_url: str) -> dict[str, int] | str:
        """A queue's messages waiting and in flight, or ``unknown (...)`` when it cannot be read now."""
        assert self._probe is not None
        try:
            return self._probe.queue_depth(queue_url)
        except ClipperError as e:
            return f"unknown ({e})"


def _sha256(record: ModelRecord, version: str) -> str:
    """The digest of the file ``version`` was registered from ("" for a version added without one)."""
    return str(record.artifacts.get(version, {}).get("sha256") or "")
