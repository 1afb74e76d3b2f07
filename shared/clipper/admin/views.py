"""What the management API answers about applications, versions and replicas: our names and Clipper's (the
fields clipper_admin's ClipperConnection reads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from clipper.admin.ports import AdminRegistry, ServingProbe
from clipper.core.domain import Application, BatchingSettings, ModelRecord, ModelVersion
from clipper.errors import ClipperError, NotFound
from clipper.selection import policy_for


def app_info(app: Application, links: list[str]) -> dict[str, Any]:
    info = asdict(app)
    info.pop("revision", None)  # the registry's write guard (put_app), not the application's
    info["input_type"] = app.input_type.value
    info["input_shape"] = list(app.input_shape) if app.input_shape else None
    info["linked_models"] = links
    return info


def params_in_use(app: Application, links: list[str]) -> dict[str, Any]:
    """The parameters ``app``'s policy runs with: the set ones and the policy's defaults for the rest, as the
    frontend uses them. Exp4's ``k`` is the number of models each query asks: the ``k`` heaviest linked models, so
    every linked one where ``k`` is unset (the policy's ``None``) or more than are linked."""
    used = dict(vars(policy_for(app.policy, app.policy_params)))
    if app.policy == "exp4":
        k = used.get("k")
        used["k"] = len(links) if k is None else min(k, len(links))
    return used


# What Clipper's listings call the image of a version: ours serve from the ONNX Runtime model image; a version
# registered with no serving resources (Clipper's register_model of a first version) has none, as in Clipper.
SERVED_IMAGE = "clipper-serverless/onnx-runtime"
CONTAINERLESS = "NO_CONTAINER"


def version_info(mv: ModelVersion, active: str, batching: BatchingSettings | None = None) -> dict[str, Any]:
    """A version, in our names and in Clipper's (model_name, model_version, is_current_version, container_name,
    batch_size: what clipper_admin's ClipperConnection reads)."""
    info = asdict(mv)
    if not mv.created_at:  # not read from the registry (the version an add_model answers with): none to say
        del info["created_at"]
    info["input_type"] = mv.input_type.value
    info["input_shape"] = list(mv.input_shape) if mv.input_shape else None
    info["labels"] = list(mv.labels)
    info["is_current_version"] = mv.version == active
    info["model_name"], info["model_version"] = mv.name, mv.version
    info["container_name"] = SERVED_IMAGE if mv.queue_url else CONTAINERLESS
    b = batching or BatchingSettings()
    info["batch_size"] = b.clipper_batch_size
    return info


def replicas(record: ModelRecord) -> list[dict[str, Any]]:
    out = []
    for mv in record.versions.values():
        if not mv.queue_url:
            continue  # registered without serving resources: no replica
        for replica in range(record.replicas):
            out.append(
                {
                    "model_name": mv.name,
                    "model_version": mv.version,
                    "model_replica_id": replica,
                    "model_id": f"{mv.name}:{mv.version}",
                    "input_type": mv.input_type.value,
                    "batch_size": record.batching.clipper_batch_size,
                    "queue_url": mv.queue_url,
                    "endpoint": mv.endpoint,
                    "is_current_version": mv.version == record.head.active_version,
                }
            )
    return out


def rejection(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item[k] for k in ("reasons", "rejected_at", "artifact", "sha256", "etag") if k in item}


def no_version(record: ModelRecord, version: str) -> NotFound:
    """The 404 for a version ``record`` does not hold; one whose upload was rejected says so, and why (``clipper
    model`` lists it as rejected: "does not exist" alone read as if it never was)."""
    name = f"{record.head.name}:{version}"
    rejected = record.rejected.get(version)
    if rejected is None:
        return NotFound("model version", name)
    reasons = "; ".join(str(r) for r in rejected.get("reasons", [])) or "no reason recorded"
    return NotFound("model version", name, f"its upload was rejected: {reasons}; upload a new version")


def models_state(registry: AdminRegistry, probe: ServingProbe | None) -> dict[str, Any]:
    """Each model with its settings, versions (and artifacts), rejections and, when probed, the active version's
    queue depth and endpoint health (``unknown (...)`` when the probe fails)."""
    models: dict[str, Any] = {}
    for name in registry.model_names():
        try:
            record = registry.model_record(name)
        except ClipperError:
            continue
        head, versions = record.head, record.versions
        models[name] = {
            "active_version": head.active_version,
            "auto_promote": record.auto_promote,
            "num_replicas": record.replicas,
            "batching": record.batching.to_dict(),
            "linked_apps": record.linked_apps,
            "versions": {
                v: version_info(mv, head.active_version, record.batching) | record.artifacts.get(v, {})
                for v, mv in versions.items()
            },
            "rejected": {v: rejection(r) for v, r in record.rejected.items()},
            "canary": head.canary.to_dict() if head.canary else None,
            "last_canary_event": next(iter(registry.canary_events(name, 1)), None),
        }
        active = versions.get(head.active_version)
        if probe is not None and active is not None and not active.endpoint:  # registered without resources
            models[name]["queue"] = models[name]["endpoint_health"] = "none (registered without serving resources)"
        elif probe is not None and active is not None:
            models[name]["queue"] = _probe_safely(probe.queue_depth, active.queue_url)
            models[name]["endpoint_health"] = _probe_safely(probe.endpoint_health, active.endpoint)
    return models


def _probe_safely(probe: Callable[[str], Any], target: str) -> Any:
    try:
        return probe(target)
    except ClipperError as e:
        return f"unknown ({e})"
