"""``set_model_batching``: a model's batching settings, stored for its long-poll batchers (they follow the registry)
and mapped onto each version's Lambda batcher (its SQS event source mapping), saying what the mapping cannot take."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from clipper.admin import schemas
from clipper.batching.model_config import FALLBACK_SLO_MS, SLO_FRACTION, RegistryBatcherConfig
from clipper.core.domain import Application, BatchingSettings, ModelRecord
from clipper.errors import ClipperError, InvalidInput, NotFound
from clipper.models.serving import ServingStacks, check_idle, lambda_mapping


class BatchingRegistry(Protocol):
    def model_record(self, name: str) -> ModelRecord: ...

    def get_app(self, name: str) -> Application: ...

    def set_model_settings(self, model: str, *, batching: BatchingSettings | None = None) -> None: ...


def set_model_batching(
    registry: BatchingRegistry, stacks: ServingStacks | None, req: schemas.ModelBatching
) -> dict[str, Any]:
    """Store a model's batching settings (its long-poll batchers follow them within their refresh), and map
    what the Lambda batcher can take onto each version's event source mapping."""
    settings = BatchingSettings(req.controller, req.batch_size, req.max_batch_size, req.batch_wait_ms)
    problems = settings.problems()
    if problems:
        field, _, why = problems[0].partition(": ")
        raise InvalidInput(field, why)
    record = registry.model_record(req.model_name)  # NotFound
    if stacks is not None:
        check_idle(stacks, req.model_name, record.versions)  # a 409 changes nothing
    registry.set_model_settings(req.model_name, batching=settings)
    size, window = lambda_mapping(settings)  # SQS: a BatchSize over 10 needs a window of 1 s or more
    applied: list[str] = []
    without: list[str] = []
    for version in record.versions:
        try:
            changed = stacks is not None and stacks.set_batching(req.model_name, version, size, window)
        except NotFound:
            changed = False
        (applied if changed else without).append(version)
    not_applied = []
    if applied:
        if settings.controller != "fixed":
            not_applied.append(
                f"controller {settings.controller}: the mapping delivers what is queued, up to BatchSize"
            )
        if 0 < settings.batch_wait_ms < 1000:
            not_applied.append("batch_wait_ms: the mapping's batching window is whole seconds (0 here)")
    return {
        "model_name": req.model_name,
        "batching": settings.to_dict(),
        "lambda_batcher": {
            "versions": applied,
            "BatchSize": size,
            "MaximumBatchingWindowInSeconds": window,
            "not_applied": not_applied,
        },
        "versions_without_lambda_batcher": without,
        **long_poll_batchers(registry, req.model_name, settings),
    }


def get_model_batching(registry: BatchingRegistry, model: str) -> dict[str, Any]:
    return {
        "model_name": model,
        "batching": registry.model_record(model).batching.to_dict(),  # NotFound
        **long_poll_batchers(registry, model),
    }


def long_poll_batchers(
    registry: BatchingRegistry, model: str, settings: BatchingSettings | None = None
) -> dict[str, Any]:
    """``{"long_poll_batchers": ...}``: what the model's long-poll batchers batch by with ``settings`` (default:
    the stored ones), read as they read their linked applications' SLOs (``RegistryBatcherConfig``), so the answer
    says when the batch wait they apply is less than the one set. With the batchers' default ``--slo-fraction``;
    a model no application is linked to batches by each batcher's own ``--slo-ms``, so the figures are then only
    its default's. Empty when the registry cannot be read now (the settings are stored: the answer stands)."""
    try:
        config = RegistryBatcherConfig(registry, model, SLO_FRACTION, FALLBACK_SLO_MS / 1000).load()
    except ClipperError:
        return {}
    view = (config if settings is None else replace(config, batching=settings)).applied()
    if not config.apps:
        view["note"] = (
            f"no application is linked: each batcher batches by its own --slo-ms (shown: its default, "
            f"{FALLBACK_SLO_MS:g} ms)" + (f"; {view['note']}" if "note" in view else "")
        )
    return {"long_poll_batchers": view}
