"""What the management API answers about applications, versions and replicas: our names and Clipper's (the
fields clipper_admin's ClipperConnection reads)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from clipper.core.domain import Application, BatchingSettings, ModelRecord, ModelVersion


def app_info(app: Application, links: list[str]) -> dict[str, Any]:
    info = asdict(app)
    info["input_type"] = app.input_type.value
    info["input_shape"] = list(app.input_shape) if app.input_shape else None
    info["linked_models"] = links
    return info


# What Clipper's listings call the image of a version: ours serve from the ONNX Runtime model image; a version
# registered with no serving resources (Clipper's register_model of a first version) has none, as in Clipper.
SERVED_IMAGE = "clipper-serverless/onnx-runtime"
CONTAINERLESS = "NO_CONTAINER"


def version_info(mv: ModelVersion, active: str, batching: BatchingSettings | None = None) -> dict[str, Any]:
    """A version, in our names and in Clipper's (model_name, model_version, is_current_version, container_name,
    batch_size: what clipper_admin's ClipperConnection reads)."""
    info = asdict(mv)
    info["input_type"] = mv.input_type.value
    info["input_shape"] = list(mv.input_shape) if mv.input_shape else None
    info["labels"] = list(mv.labels)
    info["is_current_version"] = mv.version == active
    info["model_name"], info["model_version"] = mv.name, mv.version
    info["container_name"] = SERVED_IMAGE if mv.queue_url else CONTAINERLESS
    b = batching or BatchingSettings()
    info["batch_size"] = b.batch_size if b.controller == "fixed" else -1
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
                    "batch_size": -1 if record.batching.controller != "fixed" else record.batching.batch_size,
                    "queue_url": mv.queue_url,
                    "endpoint": mv.endpoint,
                    "is_current_version": mv.version == record.head.active_version,
                }
            )
    return out


def rejection(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item[k] for k in ("reasons", "rejected_at", "artifact", "sha256", "etag") if k in item}
