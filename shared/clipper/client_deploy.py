"""The deployers' last steps (``ClipperConnection.deploy_*_model``): check the ONNX bytes on a sample, PUT them
to the presigned URL the admin API gives (with the promote wish signed in as object metadata), wait until the
model updater registered them or recorded why not, and report the state the API answers. A canary deployment
(:class:`Canary`) uploads with the promote wish false (the updater never makes it active, whatever the model's
auto_promote), then starts the registered version as the model's canary."""

from __future__ import annotations

import hashlib
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Protocol

from clipper.client import AdminError, Progress
from clipper.models.convert import DeployError, check_on_sample


class ModelAdmin(Protocol):
    """The admin operations a deployment uses."""

    def get_upload_url(self, name: str, version: str, promote: bool | None = None) -> Any: ...

    def get_model_info(self, name: str, version: str) -> Any: ...

    def set_model_version(self, name: str, version: str) -> Any: ...

    def get_canary(self, name: str, events: int = 10) -> Any: ...

    def start_canary(self, name: str, version: str, share_percent: float, **params: float) -> Any: ...


@dataclass(frozen=True)
class Canary:
    """Deploy as a canary on ``percent`` of the model's queries, judged with ``params`` (``CanaryParams``)."""

    percent: float
    params: dict[str, float] = field(default_factory=dict)


class Uploader:
    def __init__(self, admin: ModelAdmin, upload_timeout_s: float, progress: Progress | None = None) -> None:
        self._admin = admin
        self._upload_timeout = upload_timeout_s
        self._progress = progress

    def _say(self, message: str) -> None:
        if self._progress is not None:
            self._progress(message)

    def deploy(
        self,
        name: str,
        version: str,
        data: bytes,
        sample: Any,
        promote: bool,
        timeout_s: float,
        canary: Canary | None = None,
    ) -> Any:
        if canary is not None:  # refused after the upload, it left a registered version no deploy could start
            from clipper.admin.schemas import StartCanary, refusal

            body = {"model_name": name, "model_version": version, "share_percent": canary.percent}
            problem = refusal(StartCanary, {**body, **({"params": canary.params} if canary.params else {})})
            if problem is not None:
                raise AdminError(400, "invalid input", problem)
        checked = check_on_sample(data, sample)
        self._say(f"checked on {checked.rows} sample rows: {checked.outputs[:5]}")
        if canary is not None:
            self._can_start_canary(name)
            promote = False
        elif promote:
            self._refuse_while_canary(name)
        target = self._admin.get_upload_url(name, version, promote)
        self._say(f"uploading {len(data)} bytes to s3://{target['bucket']}/{target['key']}")
        etag = self._put(target, data)
        digest = hashlib.sha256(data).hexdigest()
        self._say(f"waiting for the model updater to register {name}:{version}")
        info = self._wait_registered(name, version, digest, etag, timeout_s)
        if promote and not info.get("is_current_version"):
            try:
                self._admin.set_model_version(name, version)
            except AdminError as e:  # a canary started meanwhile: the version is registered all the same
                raise AdminError(e.status, "conflict", f"{name}:{version} is registered, not active: {e.cause}") from e
            info = self._admin.get_model_info(name, version)
        state = "active" if info.get("is_current_version") else "registered, not active"
        self._say(f"{name}:{version} {state} (queue {info.get('queue_url')}, endpoint {info.get('endpoint')})")
        if canary is not None:
            started = self._admin.start_canary(name, version, canary.percent, **canary.params)
            c = started["canary"]
            self._say(
                f"{name}:{version} is the canary on {c['share_percent']:g}% of {name}'s queries beside "
                f"{started['active_version']} (trial {c['trial']}); `clipper canary {name}` follows it"
            )
            info = {**info, "canary": c}
        return info

    def _running_canary(self, name: str) -> tuple[bool, dict[str, Any] | None]:
        """Whether the model exists, and the canary it runs (None: none), asked before anything is uploaded."""
        try:
            return True, self._admin.get_canary(name, 0)["canary"]
        except AdminError as e:
            if e.status != 404:
                raise
            return False, None

    def _refuse_while_canary(self, name: str) -> None:
        """Before uploading a version to make active: no canary runs on the model (the version would be registered
        and then refused activation: a 409 after the upload, and the same deploy again a 409 for the version). A new
        model's first version becomes active."""
        _, running = self._running_canary(name)
        if running is not None:
            raise AdminError(
                409,
                "conflict",
                f"model {name} has a canary running ({name}:{running['version']}, trial {running['trial']}): a new "
                "version cannot become active meanwhile; deploy it with --no-promote, or promote or abort the canary",
            )

    def _can_start_canary(self, name: str) -> None:
        """Before uploading: the model exists (a first version becomes active, it cannot be a canary) and runs no
        canary; else the refusal the API would give after the upload."""
        exists, running = self._running_canary(name)
        if not exists:
            raise AdminError(
                404,
                "not found",
                f"model {name} does not exist: a first version becomes active (deploy it without a canary)",
            )
        if running is not None:
            raise AdminError(
                409,
                "conflict",
                f"model {name} has a canary running already ({name}:{running['version']}, trial "
                f"{running['trial']}): promote or abort it first",
            )

    def _put(self, target: dict[str, Any], data: bytes) -> str:
        req = urllib.request.Request(target["url"], data=data, method="PUT")
        req.add_header("Content-Type", "application/octet-stream")
        for header, value in target.get("headers", {}).items():
            req.add_header(header, value)
        try:
            with urllib.request.urlopen(req, timeout=self._upload_timeout) as resp:
                return str(resp.headers.get("ETag", "")).strip('"')
        except urllib.error.HTTPError as e:
            raise DeployError(f"the upload was refused ({e.code})", [e.read()[:300].decode(errors="replace")]) from e
        except urllib.error.URLError as e:
            raise DeployError(f"the model bucket is unreachable: {e.reason}") from e

    def _wait_registered(self, name: str, version: str, digest: str, etag: str, timeout_s: float) -> Any:
        def ours(record: Any) -> bool:
            return bool(record) and (record.get("sha256") == digest or (bool(etag) and record.get("etag") == etag))

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                info = self._admin.get_model_info(name, version)
            except AdminError as e:
                if e.status != 404:
                    raise
                info = {}
            if info.get("status") == "rejected" and ours(info):
                raise DeployError(f"{name}:{version} was rejected", info.get("reasons", []))
            if info.get("status") == "registered":
                if info.get("sha256") == digest:
                    return info
                if ours(info.get("rejected_upload")):
                    raise DeployError(f"{name}:{version} was rejected", info["rejected_upload"].get("reasons", []))
            if time.monotonic() > deadline:
                raise DeployError(
                    f"{name}:{version} was not registered within {timeout_s:.0f} s (is the model updater running?)"
                )
            time.sleep(0.5)
