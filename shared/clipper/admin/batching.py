"""``set_model_batching``: a model's batching settings, stored for its long-poll batchers (they follow the registry)
and mapped onto each version's Lambda batcher (its SQS event source mapping), saying what the mapping cannot take."""

from __future__ import annotations

from typing import Any, Protocol

from clipper.admin import schemas
from clipper.batching.model_config import FALLBACK_SLO_MS, SLO_FRACTION, RegistryBatcherConfig
from clipper.core.domain import Application, BatchingSettings, ModelRecord
from clipper.errors import InvalidInput, NotFound
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
        "long_poll_batchers": long_poll_batchers(registry, req.model_name),
    }


def get_model_batching(registry: BatchingRegistry, model: str) -> dict[str, Any]:
    return {
        "model_name": model,
        "batching": registry.model_record(model).batching.to_dict(),  # NotFound
        "long_poll_batchers": long_poll_batchers(registry, model),
    }


def long_poll_batchers(registry: BatchingRegistry, model: str) -> dict[str, Any]:
    """What the model's long-poll batchers (the local stack's, a GPU host's ``clipper-batcher``) batch by, with
    their default ``--slo-fraction`` and ``--slo-ms``: read as they read it (``RegistryBatcherConfig``), so the
    answer says when the batch wait they apply is less than the one set."""
    return RegistryBatcherConfig(registry, model, SLO_FRACTION, FALLBACK_SLO_MS / 1000).load().applied()
