"""The management API over HTTP: ``POST /admin/<operation>`` with Clipper's operation names and JSON
bodies. Locally it requires ``Authorization: Bearer <token>`` (``CLIPPER_ADMIN_TOKEN``), or the same token as
the password of HTTP Basic credentials (any user name: what clipper_admin sends when its admin address carries
them, ``clipper.compat.serverless_manager``); on AWS the routes are IAM-authorised by API Gateway
(``CLIPPER_ADMIN_AUTH=iam``)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBasic, HTTPBasicCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from clipper.admin import schemas
from clipper.admin.report import ReportService, add_report_route
from clipper.admin.service import AdminService
from clipper.core.media import json_content
from clipper.errors import ClipperError, Conflict, InvalidInput, NotFound, Unavailable

_STATUS: list[tuple[type[ClipperError], int, str]] = [
    (NotFound, 404, "not found"),
    (Conflict, 409, "conflict"),
    (InvalidInput, 400, "invalid input"),
    (Unavailable, 503, "service unavailable"),
]


# the types a strict field takes, as a 400 names them (pydantic's "Input should be a valid integer" says not what came)
def _error(status: int, error: str, cause: str) -> JSONResponse:
    return JSONResponse({"error": error, "cause": cause}, status_code=status)


def create_admin_app(service: AdminService, auth: str, token: str, report: ReportService | None = None) -> FastAPI:
    """``auth`` is "token" (bearer token ``token``; none configured: every call is refused) or "iam"; ``report``
    serves ``GET /admin/apps/{app}/report`` (``clipper.admin.report``; without it the route is absent)."""
    app = FastAPI(
        title="Clipper management API",
        version="1",
        description="clipper_admin's operations",
        docs_url="/admin/docs",
        openapi_url="/admin/openapi.json",
        redoc_url=None,
        redirect_slashes=False,  # /admin/ping/ is a 404 in the API's shape, not a bare 307 to /admin/ping
    )
    bearer = HTTPBearer(auto_error=False)
    basic = HTTPBasic(auto_error=False)

    def authorise(
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
        user: HTTPBasicCredentials | None = Depends(basic),  # noqa: B008
    ) -> None:
        if auth == "iam":
            return  # API Gateway checked the caller's IAM signature before the request got here
        given = credentials.credentials if credentials is not None else user.password if user is not None else None
        if given is None:
            raise _Refused(401, "missing credentials: send Authorization: Bearer <CLIPPER_ADMIN_TOKEN>")
        if not token or not secrets.compare_digest(given.encode(), token.encode()):
            raise _Refused(
                403,
                "the credentials are not the admin token (a local stack started with FRESH=1 or with a new state "
                "folder made a new one: the export line it printed has it)",
            )

    def json_body(request: Request) -> None:
        """An operation's body is JSON: another Content-Type is a 415, as the query API answers it."""
        kind = request.headers.get("content-type")
        if kind is not None and not kind.strip():  # FastAPI reads no body under an empty one: a 415, not "body: ..."
            raise _Refused(415, "Content-Type: expected application/json, got an empty Content-Type")
        if kind is not None and not json_content(kind):  # application/json or a +json type, as the query API
            raise _Refused(415, f"Content-Type: expected application/json, got {kind}")

    @app.exception_handler(_Refused)
    async def refused(_: Request, e: _Refused) -> JSONResponse:
        return _error(e.status, HTTPStatus(e.status).phrase.lower(), e.cause)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        """No such route (404) or method (405), in Clipper's error body like every other answer."""
        where = f"{request.method} {request.url.path}"
        if e.status_code == 404:
            cause = f"{where}: no such operation (POST /admin/<operation>; GET /admin/openapi.json lists them)"
        elif e.status_code == 405:
            cause = f"{where}: method not allowed (allowed: {(e.headers or {}).get('Allow', '')})"
        else:
            cause = f"{where}: {e.detail}"
        answer = _error(e.status_code, HTTPStatus(e.status_code).phrase.lower(), cause)
        answer.headers.update(e.headers or {})
        return answer

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return _error(400, "invalid input", schemas.error_message(e.errors()))

    @app.exception_handler(ClipperError)
    async def clipper_error(_: Request, e: ClipperError) -> JSONResponse:
        for kind, status, name in _STATUS:
            if isinstance(e, kind):
                return _error(status, name, str(e))
        return _error(500, "internal error", str(e))

    guard = [Depends(authorise)]

    # every operation may answer these, with Clipper's error body
    errors: dict[int | str, dict[str, Any]] = {
        400: {"model": schemas.ErrorBody, "description": "invalid input (the cause names the field)"},
        401: {"model": schemas.ErrorBody, "description": "no credentials"},
        403: {"model": schemas.ErrorBody, "description": "not the admin token"},
        404: {"model": schemas.ErrorBody, "description": "unknown application, model, version or replica"},
        415: {"model": schemas.ErrorBody, "description": "a body that is not JSON (Content-Type)"},
        409: {
            "model": schemas.ErrorBody,
            "description": "conflict (a duplicate, a stack being updated, a canary running or ended meanwhile)",
        },
        503: {"model": schemas.ErrorBody, "description": "a dependency (registry, stacks, bucket) is unavailable"},
    }

    def op(name: str, summary: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        checks = [*guard, Depends(json_body)]
        return app.post(f"/admin/{name}", dependencies=checks, summary=summary, tags=["admin"], responses=errors)

    refusals: dict[int | str, dict[str, Any]] = {k: errors[k] for k in (401, 403)}  # ping: no body, no registry

    @app.get("/admin/ping", dependencies=guard, tags=["admin"], summary="Is the management API up", responses=refusals)
    def ping() -> dict[str, str]:
        return {"status": "pong"}

    @op("add_app", "Register an application")
    def add_app(body: schemas.AddApp) -> dict[str, Any]:
        return service.add_app(body)

    @op("set_app_policy", "Change an application's selection policy (and confidence settings)")
    def set_app_policy(body: schemas.SetPolicy) -> dict[str, Any]:
        return service.set_app_policy(body)

    @op("set_policy_params", "Set an application's policy parameters (eta, gamma, epsilon, Exp4's k, loss_scale)")
    def set_policy_params(body: schemas.SetPolicyParams) -> dict[str, Any]:
        return service.set_policy_params(body)

    @op("delete_app", "Delete an application and its links")
    def delete_app(body: schemas.Name) -> dict[str, Any]:
        return service.delete_app(body.name)

    @op("get_application", "One application")
    def get_application(body: schemas.Name) -> dict[str, Any]:
        return service.get_application(body.name)

    @op("get_all_applications", "All applications (names, or details when verbose)")
    def get_all_applications(body: schemas.Verbose) -> list[Any]:
        return service.get_all_applications(body.verbose)

    @op("add_model", "Register a model version (serving resources default to the active version's)")
    def add_model(body: schemas.AddModel) -> dict[str, Any]:
        return service.add_model(body)

    @op("get_model", "One model version, with its artifact and any rejected upload of it")
    def get_model(body: schemas.ModelRef) -> dict[str, Any]:
        return service.get_model(body.model_name, body.model_version)

    @op("get_all_models", "All model versions")
    def get_all_models(body: schemas.Verbose) -> list[Any]:
        return service.get_all_models(body.verbose)

    @op("set_model_version", "Make a version active (roll forward or back)")
    def set_model_version(body: schemas.ModelRef) -> dict[str, Any]:
        return service.set_model_version(body.model_name, body.model_version)

    @op("rollback_model", "Return to the version that was active before")
    def rollback_model(body: schemas.ModelName) -> dict[str, Any]:
        return service.rollback_model(body.model_name)

    @op("delete_versioned_model", "Delete an inactive version")
    def delete_versioned_model(body: schemas.ModelRef) -> dict[str, Any]:
        return service.delete_versioned_model(body.model_name, body.model_version)

    @op("stop_inactive_model_versions", "Delete every inactive version of a model")
    def stop_inactive_model_versions(body: schemas.ModelName) -> dict[str, Any]:
        return service.stop_inactive_model_versions(body.model_name)

    @op("set_auto_promote", "Whether versions registered from uploads become active at once")
    def set_auto_promote(body: schemas.AutoPromote) -> dict[str, Any]:
        return service.set_auto_promote(body.model_name, body.auto_promote)

    @op("set_num_replicas", "Serving instances of each of a model's versions (applied to their stacks)")
    def set_num_replicas(body: schemas.Replicas) -> dict[str, Any]:
        return service.set_num_replicas(body.model_name, body.num_replicas)

    @op("get_num_replicas", "A model's replica count")
    def get_num_replicas(body: schemas.ModelName) -> dict[str, Any]:
        return service.get_num_replicas(body.model_name)

    @op("get_upload_url", "A presigned URL to PUT models/<name>/<version>/model.onnx (the deployers' upload)")
    def get_upload_url(body: schemas.UploadTarget) -> dict[str, Any]:
        return service.get_upload_url(body.model_name, body.model_version, promote=body.promote)

    @op("add_model_links", "Link models to an application")
    def add_model_links(body: schemas.Links) -> dict[str, Any]:
        return service.add_model_links(body.app_name, body.model_names)

    @op("delete_model_links", "Unlink models from an application")
    def delete_model_links(body: schemas.Links) -> dict[str, Any]:
        return service.delete_model_links(body.app_name, body.model_names)

    @op("get_linked_models", "The models linked to an application")
    def get_linked_models(body: schemas.AppName) -> list[str]:
        return service.get_linked_models(body.app_name)

    @op("get_all_containers", "Clipper's model containers: one per replica of each served version")
    def get_all_containers(body: schemas.Verbose) -> list[Any]:
        return service.get_all_containers(body.verbose)

    @op("get_container", "One model replica (Clipper's container)")
    def get_container(body: schemas.Replica) -> dict[str, Any]:
        return service.get_container(body.model_name, body.model_version, body.replica_id)

    @op("set_model_batching", "How a model's batcher cuts batches (controller, sizes, batch wait)")
    def set_model_batching(body: schemas.ModelBatching) -> dict[str, Any]:
        return service.set_model_batching(body)

    @op("get_model_batching", "A model's batching settings")
    def get_model_batching(body: schemas.ModelName) -> dict[str, Any]:
        return service.get_model_batching(body.model_name)

    @op("start_canary", "Give a registered version a share of a model's queries until evidence decides")
    def start_canary(body: schemas.StartCanary) -> dict[str, Any]:
        return service.start_canary(body)

    @op("get_canary", "A model's canary: its evidence, the decision it would get now, the last events")
    def get_canary(body: schemas.CanaryRef) -> dict[str, Any]:
        return service.get_canary(body.model_name, body.events)

    @op("promote_canary", "Make the running canary the active version now (rollback_model returns)")
    def promote_canary(body: schemas.ModelName) -> dict[str, Any]:
        return service.end_canary(body.model_name, promote=True)

    @op("abort_canary", "End the running canary now; the active version keeps every query")
    def abort_canary(body: schemas.ModelName) -> dict[str, Any]:
        return service.end_canary(body.model_name, promote=False)

    @op("get_state", "Applications, models, versions and links")
    def get_state(body: schemas.Verbose) -> dict[str, Any]:
        return service.get_state()

    if report is not None:
        add_report_route(app, report, guard, errors)
    _without_fastapis_422(app)
    return app


def _without_fastapis_422(app: FastAPI) -> None:
    """FastAPI documents a 422 on every operation with a body; this API answers invalid bodies with a 400 in
    Clipper's error body (``invalid`` above), so the document drops the 422 and its schemas."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = build()
            for path in spec["paths"].values():
                for operation in path.values():
                    operation["responses"].pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                spec.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class _Refused(Exception):
    def __init__(self, status: int, cause: str) -> None:
        super().__init__(cause)
        self.status = status
        self.cause = cause
