"""Clipper's own client, ``clipper_admin.ClipperConnection`` (0.4.1), pointed at this stack: a container manager
that knows the API's address and admin token instead of Docker or Kubernetes.

    from clipper_admin import ClipperConnection
    from clipper.compat.serverless_manager import ServerlessContainerManager

    conn = ClipperConnection(ServerlessContainerManager("http://127.0.0.1:8080", token="..."))
    conn.connect()
    conn.register_application("shapes", "floats", "-1", 100000)
    conn.get_all_models(verbose=True)

ClipperConnection builds its admin URLs as ``http://<admin addr>/admin/<op>`` with ``requests`` and no headers of
ours, so the token travels as the password of HTTP Basic credentials in that address (``clipper:<token>@host``),
which the admin API accepts as it accepts the bearer token. Only plain HTTP (ClipperConnection's scheme): use it
on loopback, or through a tunnel.

What has no counterpart here answers ``ClipperException`` naming the alternative: starting or stopping the cluster
(``make run`` / ``sam deploy``), and deploying model containers (``clipper deploy`` or the client's
``deploy_onnx_model``: models are files, not images). Stopping versions is the admin API's
``delete_versioned_model``, which ClipperConnection calls after the manager's ``stop_models``: that retires the
version's serving stack, so ``stop_models`` itself only checks first that no version listed is active (the active
one is not deleted; Clipper stopped it too).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from clipper_admin.container_manager import ContainerManager
from clipper_admin.exceptions import ClipperException

from clipper.client import active_among


class ServerlessContainerManager(ContainerManager):  # type: ignore[misc]
    def __init__(self, url: str, token: str | None = None, logs_dir: str | Path | None = None) -> None:
        parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parsed.scheme != "http":
            raise ClipperException("ClipperConnection speaks plain HTTP: give an http:// address (a tunnel for https)")
        self._host = parsed.netloc
        self._token = token if token is not None else os.environ.get("CLIPPER_ADMIN_TOKEN", "")
        state = os.environ.get("CLIPPER_LOCAL_STATE_DIR", ".local-stack")
        self._logs = Path(logs_dir) if logs_dir is not None else Path(state) / "logs"
        self.cluster_name = self.cluster_identifier = f"clipper-serverless@{self._host}"  # ClipperConnection logs it

    # -- addresses ---------------------------------------------------------------------------------------
    def get_admin_addr(self) -> str:
        if not self._token:
            return self._host
        return f"clipper:{urllib.parse.quote(self._token, safe='')}@{self._host}"

    def get_query_addr(self) -> str:
        return self._host

    def get_metric_addr(self) -> str:
        return self._host  # GET /metrics: Clipper's metrics, from the frontend

    # -- the API -----------------------------------------------------------------------------------------
    def _admin(self, op: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            f"http://{self._host}/admin/{op}",
            json.dumps(body).encode(),
            {"Content-Type": "application/json", "Authorization": f"Bearer {self._token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise ClipperException(f"{op}: {e.code} {e.read().decode(errors='replace')}") from e
        except urllib.error.URLError as e:
            raise ClipperException(f"{op}: the API at http://{self._host} is unreachable ({e.reason})") from e
        except (OSError, http.client.HTTPException) as e:  # no answer in time, or the connection broke
            raise ClipperException(f"{op}: no answer from http://{self._host} ({type(e).__name__}: {e})") from e
        except ValueError as e:  # not JSON: not this API on that port
            raise ClipperException(f"{op}: http://{self._host} answered with no JSON (is it Clipper's API?)") from e

    def connect(self) -> None:
        request = urllib.request.Request(
            f"http://{self._host}/admin/ping", headers={"Authorization": f"Bearer {self._token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as e:
            raise ClipperException(f"the admin API refused the token ({e.code}): set CLIPPER_ADMIN_TOKEN") from e
        except urllib.error.URLError as e:
            raise ClipperException(f"no Clipper API at http://{self._host} ({e.reason}): is `make run` up?") from e

    def get_num_replicas(self, name: str, version: str) -> int:
        return int(self._admin("get_num_replicas", {"model_name": name})["num_replicas"])

    def set_num_replicas(self, name: str, version: str, input_type: str, image: str, num_replicas: int) -> None:
        # replicas are the model's, applied to each of its versions' serving stacks
        self._admin("set_num_replicas", {"model_name": name, "num_replicas": num_replicas})

    def get_logs(self, logging_dir: str) -> list[str]:
        """The local stack's process logs and its request log (``requests.log`` beside the logs folder, and the
        one it rolled over to ``requests.log.1``), copied into ``logging_dir`` (on AWS: CloudWatch Logs)."""
        if not self._logs.is_dir():
            raise ClipperException(f"no local stack logs in {self._logs} (on AWS the logs are in CloudWatch Logs)")
        out = Path(logging_dir)
        out.mkdir(parents=True, exist_ok=True)
        copied = []
        requests = [p for p in (self._logs.parent / n for n in ("requests.log", "requests.log.1")) if p.is_file()]
        for log in [*sorted(self._logs.glob("*.log")), *requests]:
            shutil.copy2(log, out / log.name)
            copied.append(str(out / log.name))
        return copied

    def stop_models(self, models: dict[str, list[str]]) -> None:
        """ClipperConnection then calls delete_versioned_model for each version, which retires its stack. A
        model's active version is not deleted here (it serves the linked applications' queries): when one is
        listed, nothing is, so a refusal never comes after some of the versions are gone."""
        active = active_among(self._admin("get_all_models", {"verbose": True}), models)
        if active:
            raise ClipperException(
                f"stop: {', '.join(active)} is the active version, which is not deleted (it serves the linked "
                "applications' queries); nothing was stopped. Make another version active with set_model_version, "
                "or stop the inactive ones with stop_inactive_model_versions"
            )

    # -- no counterpart ------------------------------------------------------------------------------------
    def start_clipper(self, *args: Any, **kwargs: Any) -> None:
        raise ClipperException("start Clipper serverless with `make run` (locally) or `sam deploy`, then connect()")

    def deploy_model(self, name: str, version: str, input_type: str, image: str, num_replicas: int = 1) -> None:
        raise ClipperException(
            "models are ONNX files here, not container images: deploy with `clipper deploy` or "
            "clipper.client.ClipperConnection.deploy_onnx_model / deploy_sklearn_model"
        )

    def stop_all_model_containers(self) -> None:
        raise ClipperException("delete versions with delete_versioned_model (the active one cannot be deleted)")

    def stop_all(self, graceful: bool = True) -> None:
        raise ClipperException("stop the local stack with Ctrl-C, or the AWS stack with `sam delete`")
