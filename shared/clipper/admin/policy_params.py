"""``set_policy_params``: an application's selection-policy parameters (eta, gamma, epsilon, Exp4's k, loss_scale),
stored with the application; the frontend's selection and the feedback update build its policy with them (the
frontend within its registry cache's TTL)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from clipper.admin import schemas
from clipper.admin.views import app_info, params_in_use
from clipper.core.domain import Application
from clipper.selection import check_params


class PolicyRegistry(Protocol):
    def app_and_links(self, name: str) -> tuple[Application, list[str]]: ...

    def put_app(self, app: Application, overwrite: bool = False) -> None: ...


def set_policy_params(registry: PolicyRegistry, req: schemas.SetPolicyParams) -> dict[str, Any]:
    """Set the given parameters (null: back to the policy's default; omitted: unchanged). A parameter the
    application's policy does not take, or a value it refuses, raises ``InvalidInput`` naming the field before
    anything is written. Answers the application and the parameters its policy now runs with."""
    app, links = registry.app_and_links(req.name)  # NotFound
    changes = {name: getattr(req, name) for name in req.model_fields_set if name != "name"}
    params = app.policy_params.with_values(changes)
    check_params(app.policy, params, changed=sorted(n for n, v in changes.items() if v is not None))
    updated = replace(app, policy_params=params)
    registry.put_app(updated, overwrite=True)
    answer = {**app_info(updated, links), "policy_params_in_use": params_in_use(updated, links)}
    k = params.k if app.policy == "exp4" else None
    if k is not None and k > len(links):  # accepted: the links may change after it
        answer["note"] = f"k {k} is more than the models linked ({len(links)}): each of them answers"
    return answer
