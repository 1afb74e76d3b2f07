"""Request media types and text, as both APIs (queries and admin) read them."""

from __future__ import annotations

from typing import Any


def json_content(content_type: str | None) -> bool:
    """JSON (``application/json`` or a ``+json`` type), or no Content-Type at all (taken as JSON)."""
    if not content_type:
        return True
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def has_lone_surrogate(value: Any) -> bool:
    """Whether a parsed JSON value holds a string (or key) with a lone surrogate escape, which orjson refuses and
    Python's json accepts: nothing downstream can write it as UTF-8 (a queue message, a DynamoDB item)."""
    pending = [value]  # an explicit stack: a body nested as deep as json takes it must not overflow this one
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False
