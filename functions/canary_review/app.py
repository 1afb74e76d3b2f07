"""Canary review Lambda: every minute (an EventBridge schedule), reviews each model with a running canary
(``clipper.canary.review``): promotes it or rolls it back once its evidence says so, keeps the decision as an
event on the model and counts ``CanaryDecisions`` (EMF; template.yaml's CanaryRollbackAlarm fires on a rollback).
The feedback function also reviews the models whose evidence its batches grow, so most decisions come sooner;
this schedule decides the canaries no feedback reaches (the error and SLO guards need none)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

from clipper.adapters.canary_metrics import EmfCanaryMetrics
from clipper.settings import CommonSettings
from clipper.wiring import aws_client, build_canary_reviewer

logger = Logger(service="clipper-canary-review")
copy_config_to_registered_loggers(source_logger=logger, include={"clipper"})
settings = CommonSettings()  # type: ignore[call-arg]
reviewer = build_canary_reviewer(settings, aws_client("dynamodb"), EmfCanaryMetrics())


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    decisions = reviewer.review_all()
    verdicts = {model: d.kind for model, d in decisions.items()}
    logger.info("canaries reviewed", decisions=verdicts)
    return {"decisions": verdicts}
