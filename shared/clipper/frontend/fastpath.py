"""The hot route without the framework: ``POST /<app>/predict`` answered straight from the ASGI messages.

FastAPI stays for everything else (the OpenAPI document, which still describes this route, the ops routes,
feedback, errors of unknown routes), but a query does not need its routing, its dependency solving, its
Request object, its middleware stack (telemetry, server errors, exceptions) or its send wrappers: they cost a
plain FastAPI server most of its CPU per request, and this route is the one every query takes. The app
(``clipper.frontend.api.ClipperApi``) hands the query here before it enters FastAPI at all. The answers are the
same (``clipper.frontend.handling``); only the path there is shorter. An unexpected failure answers Clipper's
500 error body, logged with its traceback, as the framework's error middleware would have.
"""

from __future__ import annotations

import logging
from typing import Any

from clipper.frontend.handling import HttpAnswer, QueryHandling, debug_requested, error

Scope = dict[str, Any]
logger = logging.getLogger(__name__)


def predicted_app(scope: Scope) -> str | None:
    """The application of a ``POST /<app>/predict`` request; None for any other request."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    parts = scope["path"].split("/")
    if len(parts) != 3 or parts[0] or not parts[1] or parts[2] != "predict":
        return None
    return str(parts[1])


class PredictFastPath:
    def __init__(self, handling: QueryHandling) -> None:
        self._handling = handling

    async def answer(self, app_name: str, scope: Scope, receive: Any, send: Any) -> None:
        content_type: str | None = None
        encoding: str | None = None
        debug_header: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"x-clipper-debug" and debug_header is None:  # the first, as the framework reads it
                debug_header = value
            elif name == b"content-encoding":  # several: one list (HTTP's rule), every coding counts
                encoding = value.decode("latin-1") if encoding is None else f"{encoding}, {value.decode('latin-1')}"
        query = scope.get("query_string", b"")
        debug = debug_requested(query, debug_header) if query or debug_header is not None else False
        try:
            # a bad debug switch or Content-Type is answered before the body is read, as its size would be
            refused = debug if isinstance(debug, HttpAnswer) else self._handling.refused(content_type, encoding)
            body = refused or await self._body(receive)
            if isinstance(body, HttpAnswer):
                answer = body
            else:
                answer = await self._handling.predict(app_name, body, content_type, debug is True)
        except Exception:
            logger.exception("query not answered", extra={"app": app_name})
            answer = error(500, "internal error", "the frontend failed while answering this query (see its log)")
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": [*answer.headers, (b"content-length", str(len(answer.body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": answer.body})

    async def _body(self, receive: Any) -> bytes | HttpAnswer:
        """The request body; stops reading (and answers 413) once it passes the size limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            too_large = self._handling.too_large(size, partial=message.get("more_body", False))
            if too_large is not None:
                return too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
