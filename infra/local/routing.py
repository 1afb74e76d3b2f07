"""The local stack's routing, API Gateway's stand-in: ``/admin/...`` to the admin app, everything else to the
frontend's; with a processes file (the supervisor's ``processes.json``), ``GET /metrics`` also lists the stack's
processes under ``processes`` (name, pid, status, restarts, last exit, last restart), which ``clipper inspect``
shows. The apps are given (``infra/local/gateway.py`` composes the real ones), so tests route to their own.

The admin API and the frontend share this one process here, so a change made through the admin API reaches the
frontend's registry copy at once (``invalidating``): a deleted application is a 404 on the next query, not one
config TTL (and a reload) later as between two Lambda functions on AWS. The copy forgets only what the change
named, so other applications' queries go on without a read."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol

Asgi = Any  # an ASGI application: async (scope, receive, send) -> None


def gateway(admin: Asgi, frontend: Asgi, processes_file: Path | None = None) -> Asgi:
    async def route(scope: dict[str, Any], receive: Any, send: Any) -> None:
        http = scope["type"] == "http"
        path = scope["path"] if http else ""
        # the admin API's segment, as API Gateway routes it: an application named administrator is the frontend's
        target = admin if path == "/admin" or path.startswith("/admin/") else frontend
        if processes_file is not None and http and scope["path"] == "/metrics" and scope["method"] == "GET":
            await with_processes(target, processes_file, scope, receive, send)
            return
        await target(scope, receive, send)

    return route


class RegistryCopy(Protocol):
    def forget(self, names: Collection[str]) -> None: ...

    def invalidate(self) -> None: ...


# the fields of the admin API's bodies that name an application or a model (clipper.admin.schemas)
NAME_FIELDS = ("name", "app_name", "model_name")


def named_in(body: bytes) -> set[str] | None:
    """The applications and models an admin request's JSON body names; None when it names none (or is no JSON
    object): then the whole copy is dropped."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    names = {v for k in NAME_FIELDS if isinstance(v := parsed.get(k), str)}
    listed = parsed.get("model_names")
    if isinstance(listed, list):
        names |= {v for v in listed if isinstance(v, str)}
    return names or None


def invalidating(admin: Asgi, copy: RegistryCopy) -> Asgi:
    """``admin`` with the frontend's registry ``copy`` told of each change it makes: after a POST to an operation
    that is not a read (``get_...``) answered with a success, the copy forgets the applications and models the
    request named (the rest of what it holds stays, so other applications' queries read nothing), or everything
    when it named none. The change is written when its answer starts."""

    async def changed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if scope.get("method") != "POST" or not path.startswith("/admin/") or path.startswith("/admin/get_"):
            await admin(scope, receive, send)
            return
        body = bytearray()

        async def read() -> dict[str, Any]:
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        async def watch(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                names = named_in(bytes(body))  # before the answer: a query sent once it is read finds the change
                if names is not None:
                    copy.forget(names)
                else:
                    copy.invalidate()
            await send(message)

        await admin(scope, read, watch)

    return changed


def read_processes(processes_file: Path) -> list[Any] | None:
    """The supervisor's processes; None while the file is not (yet) written or not readable."""
    try:
        listed = json.loads(processes_file.read_text())["processes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return listed if isinstance(listed, list) else None


async def with_processes(target: Asgi, processes_file: Path, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The frontend's /metrics with the supervisor's processes added."""
    start: dict[str, Any] = {}
    body = bytearray()

    async def collect(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            body.extend(message.get("body", b""))

    await target(scope, receive, collect)
    processes = read_processes(processes_file)
    if processes is not None:
        try:
            report = json.loads(body)
            report["processes"] = processes
            body[:] = json.dumps(report).encode()
        except (ValueError, TypeError):
            pass  # not the JSON object expected: the frontend's answer as it is
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": start.get("status", 200), "headers": headers})
    await send({"type": "http.response.body", "body": bytes(body)})
