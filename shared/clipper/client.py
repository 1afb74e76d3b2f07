"""A Python client of the management API, with ``clipper_admin.ClipperConnection``'s method names, so a
Clipper user feels at home::

    from clipper.client import ClipperConnection
    conn = ClipperConnection("http://127.0.0.1:8080", token="...")   # or CLIPPER_URL / CLIPPER_ADMIN_TOKEN
    aws = ClipperConnection("https://<api-id>.execute-api.eu-west-1.amazonaws.com")  # SigV4, AWS credentials
    conn.register_application("digits", "floats", "-1", 100000, input_shape=[64])
    conn.link_model_to_app("digits", "mlp")
    conn.set_model_version("mlp", "2")

It speaks plain HTTP (standard library only). On the local stack it sends the admin token; on AWS, where the admin
routes are IAM-authorised, it signs them with SigV4 (botocore's ``SigV4Auth``, the usual credential chain):
``auth="sigv4"`` or ``CLIPPER_AUTH=sigv4``, chosen by itself (``auto``) for an execute-api URL when no token is
given (:mod:`clipper.client_auth`). ``sign`` replaces the signer with any callable that signs a request in place.

The deployers (``deploy_sklearn_model``, ``deploy_onnx_model``, ``deploy_pytorch_model``) convert a model to
ONNX, check it on a sample input, PUT it to the presigned URL ``get_upload_url`` gives (the model bucket's
``models/<name>/<version>/model.onnx``) and wait until the model updater registered it, or raise
``DeployError`` with the reasons it recorded; with ``canary=10`` the new version starts as a canary on 10 % of
the model's queries instead of becoming active. They import numpy, onnxruntime (and skl2onnx or torch) when called.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clipper.client_auth import SigningError, signer_for
from clipper.client_query import ApiError, json_answer, json_value
from clipper.errors import ClipperError

Progress = Callable[[str], None]


class BadUrl(ClipperError):
    """The API's URL (``CLIPPER_URL``, ``--url``) is not an http(s) URL."""


class AdminError(ApiError):
    """The management API refused a call; ``status`` is the HTTP status, ``cause`` names the problem."""


def active_among(infos: list[dict[str, Any]], named: dict[str, list[Any]]) -> list[str]:
    """``model:version`` of each version ``named`` (model -> versions) that is its model's active one, from
    ``get_all_models(verbose=True)``'s answer: the versions a stop must not delete."""
    listed = {(m, str(v)) for m, versions in named.items() for v in versions}
    return sorted(
        f"{info['model_name']}:{info['model_version']}"
        for info in infos
        if info.get("is_current_version") and (info["model_name"], info["model_version"]) in listed
    )


class ClipperConnection:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout_s: float = 30.0,
        sign: Callable[[urllib.request.Request], None] | None = None,
        auth: str | None = None,
        region: str | None = None,
    ) -> None:
        """``auth``: "token", "sigv4" or "auto" (default ``CLIPPER_AUTH``, else auto: SigV4 for an execute-api URL
        when no token is given); ``region`` of the signature (default ``CLIPPER_REGION``, else the URL's, else the
        credential chain's). A bad ``auth`` raises ``SigningError``."""
        self.url = (url or os.environ.get("CLIPPER_URL") or "http://127.0.0.1:8080").rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            # '127.0.0.1:8093' was tried and reported as "no Clipper API answers at ... (unknown url type)"
            raise BadUrl(
                f"the API's URL must start with http:// or https:// (e.g. http://127.0.0.1:8080), got {self.url!r}"
            )
        self._token = token if token is not None else os.environ.get("CLIPPER_ADMIN_TOKEN", "")
        self._timeout = timeout_s
        mode = auth or os.environ.get("CLIPPER_AUTH") or "auto"
        self._sign = sign or signer_for(self.url, self._token, mode, region or os.environ.get("CLIPPER_REGION"))
        self._shapes: dict[str, list[int] | None] = {}  # applications' declared input shapes, asked once

    def _call(self, operation: str, body: dict[str, Any] | None = None) -> Any:
        return self._answer(self._request(f"/admin/{operation}", body))

    def _request(self, path: str, body: dict[str, Any] | None = None) -> urllib.request.Request:
        """A request to the admin API, authenticated: the bearer token, or signed last (SigV4)."""
        data = None if body is None else json.dumps(body, default=json_value).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method="GET" if body is None else "POST")
        req.add_header("Content-Type", "application/json")
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        if self._sign is not None:
            try:
                self._sign(req)
            except SigningError as e:
                raise AdminError(0, "not signed", str(e)) from e
        return req

    def _answer(self, req: urllib.request.Request) -> Any:
        """The JSON answer; a refusal raises ``AdminError`` with Clipper's error, no answer one naming the URL."""
        return json_answer(req, self._timeout, AdminError, self.url)

    # -- Clipper's names -------------------------------------------------------------------------------
    def get_query_addr(self) -> str:
        return self.url

    def ping(self) -> Any:
        return self._call("ping")

    def register_application(
        self,
        name: str,
        input_type: str,
        default_output: str,
        slo_micros: int,
        input_shape: list[int] | None = None,
        policy: str = "single",
        confidence_threshold: float = 0.0,
        default_when_unsure: bool = False,
    ) -> Any:
        return self._call(
            "add_app",
            {
                "name": name,
                "input_type": input_type,
                "default_output": default_output,
                "latency_slo_micros": slo_micros,
                "input_shape": input_shape,
                "policy": policy,
                "confidence_threshold": confidence_threshold,
                "default_when_unsure": default_when_unsure,
            },
        )

    def set_app_policy(
        self,
        name: str,
        policy: str,
        confidence_threshold: float | None = None,
        default_when_unsure: bool | None = None,
    ) -> Any:
        body: dict[str, Any] = {"name": name, "policy": policy}
        if confidence_threshold is not None:
            body["confidence_threshold"] = confidence_threshold
        if default_when_unsure is not None:
            body["default_when_unsure"] = default_when_unsure
        return self._call("set_app_policy", body)

    def set_policy_params(self, name: str, **params: float | None) -> Any:
        """The application's policy parameters, by name: ``eta`` (Exp3, Exp4), ``gamma`` (Exp3), ``epsilon``
        (epsilon-greedy), ``k`` (Exp4: how many of the heaviest models answer). A value sets one, None returns it to
        the policy's default, one not named keeps its value; one the app's policy does not take is refused (400).
        Answers the application with ``policy_params_in_use``."""
        return self._call("set_policy_params", {"name": name, **params})

    def unregister_application(self, name: str) -> Any:
        return self._call("delete_app", {"name": name})

    def delete_application(self, name: str) -> Any:
        """clipper_admin's newer name of ``unregister_application``."""
        return self.unregister_application(name)

    def get_all_apps(self, verbose: bool = False) -> Any:
        return self._call("get_all_applications", {"verbose": verbose})

    def get_app_info(self, name: str) -> Any:
        return self._call("get_application", {"name": name})

    def link_model_to_app(self, app_name: str, model_name: str) -> Any:
        return self._call("add_model_links", {"app_name": app_name, "model_names": [model_name]})

    def unlink_model_from_app(self, app_name: str, model_name: str) -> Any:
        return self._call("delete_model_links", {"app_name": app_name, "model_names": [model_name]})

    def get_linked_models(self, app_name: str) -> Any:
        return self._call("get_linked_models", {"app_name": app_name})

    def deploy_model(
        self,
        name: str,
        version: str,
        input_type: str,
        input_shape: list[int] | None = None,
        queue_url: str | None = None,
        endpoint: str | None = None,
        labels: list[str] | None = None,
        activate: bool = True,
    ) -> Any:
        """Register a model version whose serving resources exist (the first version names its queue and
        endpoint; later ones default to the active version's)."""
        if isinstance(input_shape, str):  # clipper_admin's deploy_model(name, version, input_type, image, ...)
            raise TypeError(
                f"deploy_model's 4th argument is input_shape (a list of dimensions), got {input_shape!r}: models "
                "here are ONNX files, not container images (deploy_onnx_model / deploy_sklearn_model)"
            )
        body: dict[str, Any] = {
            "model_name": name,
            "model_version": str(version),  # 1 as Clipper's examples give it (clipper_admin does the same)
            "input_type": input_type,
            "input_shape": input_shape,
            "labels": labels or [],
            "activate": activate,
        }
        if queue_url:
            body["queue_url"] = queue_url
        if endpoint:
            body["endpoint"] = endpoint
        return self._call("add_model", body)

    def register_model(
        self,
        name: str,
        version: str,
        input_type: str,
        labels: list[str] | None = None,
        batch_size: int = -1,
    ) -> Any:
        """clipper_admin's ``register_model``: a version registered and made active, on the active version's
        serving resources (a new model: none, so its queries answer the default until a model file is deployed);
        ``batch_size`` > 0 fixes the model's batch size, -1 leaves its batching as it is."""
        body: dict[str, Any] = {
            "model_name": name,
            "model_version": str(version),
            "input_type": input_type,
            "labels": labels or [],
            "batch_size": batch_size,
        }
        return self._call("add_model", body)

    def get_current_model_version(self, name: str) -> str:
        """The model's active version (clipper_admin's name)."""
        for info in self.get_all_models(verbose=True):
            if info["model_name"] == name and info.get("is_current_version"):
                return str(info["model_version"])
        raise AdminError(404, "not found", f"model {name!r}: no such model")

    def get_all_model_replicas(self, verbose: bool = False) -> Any:
        """Clipper's model containers: one per replica of each served version."""
        return self._call("get_all_containers", {"verbose": verbose})

    def get_model_replica_info(self, name: str, version: str, replica_id: int) -> Any:
        return self._call(
            "get_container", {"model_name": name, "model_version": str(version), "replica_id": replica_id}
        )

    def set_model_version(self, name: str, version: str) -> Any:
        return self._call("set_model_version", {"model_name": name, "model_version": str(version)})

    def rollback_model(self, name: str) -> Any:
        return self._call("rollback_model", {"model_name": name})

    def get_all_models(self, verbose: bool = False) -> Any:
        return self._call("get_all_models", {"verbose": verbose})

    def get_model_info(self, name: str, version: str) -> Any:
        return self._call("get_model", {"model_name": name, "model_version": str(version)})

    def stop_versioned_models(self, model_versions_dict: dict[str, list[str]]) -> list[Any]:
        """Delete the versions listed. The active version of a model is not deleted: when one is listed, none is
        (a refusal never comes after some of them are gone)."""
        active = active_among(self.get_all_models(verbose=True), model_versions_dict)
        if active:
            raise AdminError(
                400,
                "invalid input",
                f"model_version: expected inactive versions (set another version active first), got the active "
                f"{', '.join(active)}; nothing was deleted",
            )
        return [
            self._call("delete_versioned_model", {"model_name": m, "model_version": str(v)})
            for m, versions in model_versions_dict.items()
            for v in versions
        ]

    def stop_inactive_model_versions(self, model_names: list[str]) -> list[Any]:
        return [self._call("stop_inactive_model_versions", {"model_name": m}) for m in model_names]

    def get_metrics(self) -> Any:
        """Clipper's ``GET /metrics`` of the frontend that answers (per process; CloudWatch has the rest)."""
        return self._answer(self._request("/metrics"))  # IAM-authorised on AWS

    def get_local_processes(self) -> list[Any] | None:
        """The local stack's processes (name, pid, status, restarts, last exit, last restart) as its gateway lists
        them in ``/metrics``; None where the API is not the local stack's (on AWS)."""
        listed = self.get_metrics().get("processes")
        return listed if isinstance(listed, list) else None

    def inspect_instance(self) -> Any:
        return self._call("get_state", {})

    # -- model settings --------------------------------------------------------------------------------
    def set_num_replicas(self, name: str, num_replicas: int) -> Any:
        """Serving instances of each version of the model (SageMaker instances, Lambda batcher concurrency,
        locally model-server + batcher process pairs)."""
        return self._call("set_num_replicas", {"model_name": name, "num_replicas": num_replicas})

    def get_num_replicas(self, name: str) -> int:
        return int(self._call("get_num_replicas", {"model_name": name})["num_replicas"])

    def set_auto_promote(self, name: str, auto_promote: bool = True) -> Any:
        """Whether a version registered from an upload becomes the active version at once."""
        return self._call("set_auto_promote", {"model_name": name, "auto_promote": auto_promote})

    def set_model_batching(
        self,
        name: str,
        controller: str | None = None,
        batch_size: int | None = None,
        max_batch_size: int | None = None,
        batch_wait_ms: float | None = None,
    ) -> Any:
        """How the model's batchers cut batches: ``controller`` "aimd" (Clipper's), "quantile" or "fixed" (with
        ``batch_size``), the adaptive size's ``max_batch_size``, the batch wait; unset ones keep their value."""
        current = self.get_model_batching(name)["batching"]
        given: dict[str, Any] = {"controller": controller, "batch_size": batch_size, "max_batch_size": max_batch_size}
        given["batch_wait_ms"] = batch_wait_ms
        body = {**current, **{k: v for k, v in given.items() if v is not None}, "model_name": name}
        if body["controller"] != "fixed" and batch_size is None:
            body["batch_size"] = 0
        if (
            body["controller"] == "fixed"
            and max_batch_size is None
            and body.get("max_batch_size", 0) < body["batch_size"]
        ):
            # the stored bound is the adaptive size's (kept from an earlier aimd/quantile setting), not one asked for
            body["max_batch_size"] = body["batch_size"]
        return self._call("set_model_batching", body)

    def get_model_batching(self, name: str) -> Any:
        return self._call("get_model_batching", {"model_name": name})

    # -- canary ----------------------------------------------------------------------------------------
    def start_canary(self, name: str, version: str, share_percent: float, **params: float) -> Any:
        """Give a registered version (not the active one) ``share_percent`` of the model's queries until live
        evidence promotes or rolls it back; ``params`` tune the decision (alpha, beta, margin, min_feedback,
        max_feedback: ``clipper.canary.CanaryParams``). 409 while another canary runs."""
        body: dict[str, Any] = {"model_name": name, "model_version": str(version), "share_percent": share_percent}
        if params:
            body["params"] = params
        return self._call("start_canary", body)

    def get_canary(self, name: str, events: int = 10) -> Any:
        """The model's canary (null when none runs) with its evidence and the decision it would get now (where
        the API counts evidence), and the model's last ``events`` canary events, newest first."""
        return self._call("get_canary", {"model_name": name, "events": events})

    def promote_canary(self, name: str) -> Any:
        """Make the running canary the active version now (``rollback_model`` returns to the one before)."""
        return self._call("promote_canary", {"model_name": name})

    def abort_canary(self, name: str) -> Any:
        """End the running canary now; the active version keeps every query."""
        return self._call("abort_canary", {"model_name": name})

    # -- queries ---------------------------------------------------------------------------------------
    def get_report(
        self, app: str, since: str | float | None = None, until: str | float | None = None, window: int | None = None
    ) -> Any:
        """The application's live selection quality from its recorded predictions and feedback: per-model loss
        over time, Exp3 regret, Exp4 error by confidence, canary decisions (``GET /admin/apps/{app}/report``).
        ``since`` / ``until``: epoch seconds, ISO 8601, or an age such as ``"24h"`` or ``"7d"``."""
        given = {"since": since, "until": until, "window": window}
        params = urllib.parse.urlencode({k: str(v) for k, v in given.items() if v is not None})
        path = f"/admin/apps/{urllib.parse.quote(app, safe='')}/report" + (f"?{params}" if params else "")
        return self._answer(self._request(path))

    def get_selection_state(self, app: str, uid: int | str | None = None) -> Any:
        """The bandit state the application's next query is drawn with, or a user's (``uid``): each linked model's
        weight, its probability of being drawn (Exp3), how often it was judged and its mean loss, and
        ``learned_from`` (``user``, ``application`` or ``initial``) (``GET /admin/apps/{app}/selection``)."""
        path = f"/admin/apps/{urllib.parse.quote(app, safe='')}/selection"
        if uid is not None:
            path += "?" + urllib.parse.urlencode({"uid": str(uid)})
        return self._answer(self._request(path))

    def predict(self, app: str, input: Any, uid: int | str | None = None, debug: bool = False) -> Any:
        """One query (``input``: a list, a numpy array, a string, or bytes for a bytes app), or a batch of them
        (``batch([...])``). A numpy array of more than one dimension is read by the app's declared shape, asked
        once of the admin API: an array of that shape is one input, one more leading dimension a batch (without
        a token, or a shape, a 2-D array is a batch of rows). Answers the JSON response (``query_id``,
        ``output``, ``default``, ``default_explanation``...); a 4xx raises ``QueryError`` naming the field, no answer
        (a refused or broken connection, the timeout) its subclass ``QueryUnanswered``."""
        from clipper.client_query import predict, shaped

        if getattr(input, "ndim", 0) >= 2:
            input = shaped(input, self._input_shape(app))
        return predict(self.url, app, input, uid, debug, self._timeout)

    def _input_shape(self, app: str) -> list[int] | None:
        if app not in self._shapes:
            try:
                self._shapes[app] = self.get_app_info(app).get("input_shape") or None
            except AdminError:  # no token (a query-only user), or no such app: the query API says so
                return None
        return self._shapes[app]

    def update(
        self, app: str, input: Any, label: Any, uid: int | str | None = None, feedback_id: str | None = None
    ) -> Any:
        """Feedback for the bandit: the true ``label`` of an ``input`` this app (and ``uid``) was queried with.
        ``feedback_id``, a key of the caller's: the same feedback sent again with it (a retry after a timeout)
        is applied once. A numpy array is read by the app's declared shape, as ``predict`` reads it (an 8x8
        array is the one input of an app of shape [8, 8]). Sent twice without an answer (or with a 5xx), it
        raises ``QueryError`` (``QueryUnanswered`` for no answer) whose ``feedback_id`` is the key it was sent with:
        ``update(..., feedback_id=e.feedback_id)`` then applies it once, whether a lost try was taken or not."""
        from clipper.client_query import shaped, update

        if getattr(input, "ndim", 0) >= 2:
            input = shaped(input, self._input_shape(app))
        return update(self.url, app, input, label, uid, self._timeout, feedback_id)

    def get_upload_url(self, name: str, version: str, promote: bool | None = None) -> Any:
        """A presigned PUT of the version's model file; ``promote`` (sent as the object's metadata: the PUT must
        send the answer's ``headers``) wins over the model's auto_promote."""
        body: dict[str, Any] = {"model_name": name, "model_version": str(version)}
        if promote is not None:
            body["promote"] = promote
        return self._call("get_upload_url", body)

    # -- deployers -------------------------------------------------------------------------------------
    def deploy_sklearn_model(
        self,
        name: str,
        version: str,
        model: Any,
        input_type: str,
        sample_input: Any,
        promote: bool = True,
        timeout_s: float = 120.0,
        progress: Progress | None = None,
        canary: float | None = None,
        canary_params: dict[str, float] | None = None,
    ) -> Any:
        """Convert a fitted scikit-learn model with skl2onnx (input rows shaped like ``sample_input``'s) and
        deploy it as :meth:`deploy_onnx_model` does."""
        from clipper.models.convert import as_sample, sklearn_to_onnx

        sample = as_sample(sample_input, input_type)
        _say(progress, f"converting {type(model).__name__} to ONNX")
        data = sklearn_to_onnx(model, sample, name)
        return self._deploy(name, version, data, sample, promote, timeout_s, progress, canary, canary_params)

    def deploy_pytorch_model(
        self,
        name: str,
        version: str,
        model: Any,
        input_type: str,
        sample_input: Any,
        promote: bool = True,
        timeout_s: float = 120.0,
        progress: Progress | None = None,
        canary: float | None = None,
        canary_params: dict[str, float] | None = None,
    ) -> Any:
        """Export a ``torch.nn.Module`` with ``torch.onnx.export`` (batch dimension free) and deploy it; needs
        torch installed (``DeployError`` says so otherwise)."""
        from clipper.models.convert import as_sample, pytorch_to_onnx

        sample = as_sample(sample_input, input_type)
        _say(progress, f"exporting {type(model).__name__} to ONNX")
        data = pytorch_to_onnx(model, sample)
        return self._deploy(name, version, data, sample, promote, timeout_s, progress, canary, canary_params)

    def deploy_onnx_model(
        self,
        name: str,
        version: str,
        model: str | os.PathLike[str] | bytes,
        sample_input: Any = None,
        input_type: str = "floats",
        promote: bool = True,
        timeout_s: float = 120.0,
        progress: Progress | None = None,
        canary: float | None = None,
        canary_params: dict[str, float] | None = None,
    ) -> Any:
        """Deploy an ONNX file (a path, or its bytes): check it on ``sample_input`` (default: two rows of zeros
        when its rows have a fixed shape), upload it, wait for its registration and, with ``promote``, make it
        the active version. Returns the version's ``get_model_info``. With ``canary`` (a percent), the version is
        never made active: once registered it starts as the model's canary on that share of the queries
        (``canary_params`` tune the decision, as ``start_canary``'s); the answer carries it as ``canary``."""
        from clipper.models.convert import as_sample

        data = model if isinstance(model, bytes) else Path(model).read_bytes()
        sample = None if sample_input is None else as_sample(sample_input, input_type)
        return self._deploy(name, version, data, sample, promote, timeout_s, progress, canary, canary_params)

    def _deploy(
        self,
        name: str,
        version: str,
        data: bytes,
        sample: Any,
        promote: bool,
        timeout_s: float,
        progress: Progress | None,
        canary: float | None = None,
        canary_params: dict[str, float] | None = None,
    ) -> Any:
        from clipper.client_deploy import Canary, Uploader

        trial = None if canary is None else Canary(canary, canary_params or {})
        return Uploader(self, max(self._timeout, 120), progress).deploy(
            name,
            str(version),
            data,
            sample,
            promote,
            timeout_s,
            trial,  # 1 as Clipper's examples give it
        )


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)
