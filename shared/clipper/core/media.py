"""Request media types, as both APIs (queries and admin) read them."""

from __future__ import annotations


def json_content(content_type: str | None) -> bool:
    """JSON (``application/json`` or a ``+json`` type), or no Content-Type at all (taken as JSON)."""
    if not content_type:
        return True
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")
