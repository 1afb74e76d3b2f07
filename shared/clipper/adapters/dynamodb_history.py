"""A model's version history on its registry item (``MODEL#<model>`` / ``MODEL``): how it is read, and the one
conditional update that changes it, shared by the registry (``set_model_version``, rollback) and the model updater
(auto-promotion, inside its registration transaction). The history itself: ``clipper.models.history``.

Attributes: active_version (S), history (L of S, oldest first), switches (N), previous_version (S: the last of
history, for readers of the older layout, which had it alone)."""

from __future__ import annotations

from typing import Any

from clipper.models.history import VersionHistory


def history_of(item: dict[str, Any]) -> VersionHistory:
    """The version history on a model item; an item of the older layout has its previous_version only."""
    active = item.get("active_version", {}).get("S")
    if "history" in item:
        earlier = tuple(x["S"] for x in item["history"]["L"])
    else:
        previous = item.get("previous_version", {}).get("S")
        earlier = (previous,) if previous and previous != active else ()
    return VersionHistory(active, earlier, int(item.get("switches", {}).get("N", "0")))


def switch_update(table: str, model: str, before: VersionHistory, after: VersionHistory) -> dict[str, Any]:
    """The UpdateItem (also a transaction's Update) that replaces the history ``before`` with ``after``, on the
    condition that the item still holds ``before`` (the same active version and count of switches)."""
    sets, removes, values = _earlier(after.earlier, ":h", ":p")
    values |= {":a": {"S": after.active or ""}, ":n": {"N": str(after.switches)}}
    update = "SET " + ", ".join(["active_version = :a", *sets, "switches = :n"])
    if removes:
        update += " REMOVE " + ", ".join(removes)
    if before.active is None:
        condition = "attribute_not_exists(active_version)"
    else:
        values[":e"] = {"S": before.active}
        unchanged, counted = _switches_unchanged(before, ":s")
        condition = f"active_version = :e AND {unchanged}"
        values |= counted
    return {
        "TableName": table,
        "Key": {"pk": {"S": f"MODEL#{model}"}, "sk": {"S": "MODEL"}},
        "UpdateExpression": update,
        "ConditionExpression": condition,
        "ExpressionAttributeValues": values,
    }


def forgetting(item: dict[str, Any], version: str) -> tuple[list[str], list[str], dict[str, Any], str] | None:
    """What drops a deleted ``version`` from the history on the model ``item``, for the delete's transaction:
    SET and REMOVE clauses, their values, and the condition that the history is still the one read (the count of
    switches). None when the history does not hold it. A version registered again under a deleted name is another
    model file, never active: a rollback must not return to it (it skipped deleted names only while they were
    gone)."""
    history = history_of(item)
    if version not in history.earlier:
        return None
    sets, removes, values = _earlier(tuple(v for v in history.earlier if v != version), ":fh", ":fp")
    condition, counted = _switches_unchanged(history, ":fs")
    return sets, removes, values | counted, condition


def _earlier(earlier: tuple[str, ...], h: str, p: str) -> tuple[list[str], list[str], dict[str, Any]]:
    """The SET and REMOVE clauses and values that store ``earlier`` as the history (and its last as
    previous_version, for readers of the older layout), with the value names ``h`` and ``p``."""
    values: dict[str, Any] = {h: {"L": [{"S": v} for v in earlier]}}
    if not earlier:
        return [f"history = {h}"], ["previous_version"], values
    values[p] = {"S": earlier[-1]}
    return [f"history = {h}", f"previous_version = {p}"], [], values


def _switches_unchanged(history: VersionHistory, s: str) -> tuple[str, dict[str, Any]]:
    """The condition that the item's count of switches is still ``history``'s (none recorded: no attribute)."""
    if history.switches:
        return f"switches = {s}", {s: {"N": str(history.switches)}}
    return "attribute_not_exists(switches)", {}
