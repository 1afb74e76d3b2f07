"""A Python client of the management API, with ``clipper_admin.ClipperConnection``'s method names, so a
Clipper user feels at home::

    from clipper.client import ClipperConnection
    conn = ClipperConnection("http://127.0.0.1:8080", token="...")   # or CLIPPER_URL / CLIPPER_ADMIN_TOKEN
    conn.register_application("digits", "floats", "-1", 100000, input_shape=[64])
    conn.link_model_to_app("digits", "mlp")
    conn.set_model_version("mlp", "2")

It speaks plain HTTP (standard library only); on AWS, where the admin routes are IAM-authorised, give it a
``sign`` callable that adds SigV4 headers (botocore's ``SigV4Auth``).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from clipper.errors import ClipperError


class AdminError(ClipperError):
    """The management API refused a call; ``status`` is the HTTP status, ``cause`` names the problem."""

    def __init__(self, status: int, error: str, cause: str) -> None:
        super().__init__(f"{status} {error}: {cause}")
        self.status = status
        self.cause = cause


class ClipperConnection:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout_s: float = 30.0,
        sign: Callable[[urllib.request.Request], None] | None = None,
    ) -> None:
        self.url = (url or os.environ.get("CLIPPER_URL") or "http://127.0.0.1:8080").rstrip("/")
        self._token = token if token is not None else os.environ.get("CLIPPER_ADMIN_TOKEN", "")
        self._timeout = timeout_s
        self._sign = sign

    def _call(self, operation: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}/admin/{operation}", data=data, method="GET" if body is None else "POST"
        )
        req.add_header("Content-Type", "application/json")
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        if self._sign is not None:
            self._sign(req)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read())
            except ValueError:
                detail = {"error": e.reason, "cause": ""}
            raise AdminError(e.code, detail.get("error", ""), detail.get("cause", "")) from e
        except urllib.error.URLError as e:
            raise AdminError(0, "unreachable", f"{self.url}: {e.reason}") from e

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

    def unregister_application(self, name: str) -> Any:
        return self._call("delete_app", {"name": name})

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
        body: dict[str, Any] = {
            "model_name": name,
            "model_version": version,
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

    def set_model_version(self, name: str, version: str) -> Any:
        return self._call("set_model_version", {"model_name": name, "model_version": version})

    def rollback_model(self, name: str) -> Any:
        return self._call("rollback_model", {"model_name": name})

    def get_all_models(self, verbose: bool = False) -> Any:
        return self._call("get_all_models", {"verbose": verbose})

    def get_model_info(self, name: str, version: str) -> Any:
        return self._call("get_model", {"model_name": name, "model_version": version})

    def stop_versioned_models(self, model_versions_dict: dict[str, list[str]]) -> list[Any]:
        return [
            self._call("delete_versioned_model", {"model_name": m, "model_version": v})
            for m, versions in model_versions_dict.items()
            for v in versions
        ]

    def stop_inactive_model_versions(self, model_names: list[str]) -> list[Any]:
        return [self._call("stop_inactive_model_versions", {"model_name": m}) for m in model_names]

    def get_metrics(self) -> Any:
        """Clipper's ``GET /metrics`` of the frontend that answers (per process; CloudWatch has the rest)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=self._timeout) as resp:
            return json.loads(resp.read())

    def inspect_instance(self) -> Any:
        return self._call("get_state", {})
