"""The local stack's moto server: ``python -m moto.server`` with one change to its DynamoDB emulation.

moto's ``TransactWriteItems`` backs up every table a transaction names with ``copy.deepcopy`` before it writes, so
that it can put them back if the transaction is cancelled. A transaction's cost therefore grows with the size of
the table, not with the transaction. The feedback worker writes each feedback's bandit state and its idempotency
marker in one transaction to the selection table, which also holds every marker and the feedback log, so on a
stack that has taken a few thousand feedback messages each one took tens of milliseconds and rising, and the
copies' garbage took moto's server to tens of GB (the live selection benchmark was killed twice that way).

Here a transaction keeps instead a copy of the items it names (the key of a ``Put`` comes from its item, the other
operations name theirs), lets moto's own code do the checks and the writes with the table backup turned into a
no-op, and on a cancelled transaction puts those items back as they were (deleting the ones that did not exist).
What a caller sees is the same: conditions, cancellation reasons, all or nothing. Real DynamoDB, on AWS, is not
touched by any of this.

If this moto's internals are not the ones this was written against (no ``copy`` module in
``moto.dynamodb.models``, no ``DynamoDBBackend.transact_write_items``), the server runs unpatched and says so.

``--gated`` (the local stack's launcher passes it): the server answers 503 until the launcher has put the stack's
state back in it (``infra.local.gate``).
"""

from __future__ import annotations

import copy
import functools
import logging
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("clipper.local.moto")

_Snapshot = list[tuple[str, dict[str, Any], dict[str, Any] | None]]  # (table, key, item attributes or None)


def install() -> bool:
    """Patch moto's DynamoDB backend in this process; returns whether it was patched (idempotent)."""
    try:
        from moto.dynamodb import models
    except ImportError:  # pragma: no cover - moto is a dependency of the local stack
        return False
    backend = getattr(models, "DynamoDBBackend", None)
    original = getattr(backend, "transact_write_items", None)
    if getattr(original, "_clipper_narrow_backup", False):
        return True
    if backend is None or original is None or getattr(models, "copy", None) is not copy:
        logger.warning("moto's DynamoDB emulation is not the expected one: transactions copy whole tables")
        return False
    inside = threading.local()  # moto's server runs each request on a thread of its own
    models.copy = _copy_module(models.Table, inside)  # type: ignore[assignment,attr-defined]

    @functools.wraps(original)
    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> Any:
        before = _snapshot(self, transact_items)
        inside.transaction = True
        try:
            return original(self, transact_items)
        except Exception:
            _restore(self, before)
            raise
        finally:
            inside.transaction = False

    transact_write_items._clipper_narrow_backup = True  # type: ignore[attr-defined]
    transact_write_items._clipper_original = original  # type: ignore[attr-defined]
    backend.transact_write_items = transact_write_items
    return True


def uninstall() -> None:
    """Undo ``install`` (for tests that patch moto in their own process)."""
    from moto.dynamodb import models

    current = models.DynamoDBBackend.transact_write_items
    original = getattr(current, "_clipper_original", None)
    if original is not None:
        models.DynamoDBBackend.transact_write_items = original  # type: ignore[method-assign]
        models.copy = copy  # type: ignore[attr-defined]


def _item_key(table: Any, op_type: str, op: dict[str, Any]) -> dict[str, Any] | None:
    if op_type != "Put":
        key = op.get("Key")
        return key if isinstance(key, dict) else None
    item = op.get("Item") or {}
    names = [n for n in (table.hash_key_attr, table.range_key_attr) if n is not None]
    if not all(n in item for n in names):
        return None  # moto rejects it itself
    return {n: item[n] for n in names}


def _snapshot(backend: Any, transact_items: list[dict[str, Any]]) -> _Snapshot:
    saved: _Snapshot = []
    for entry in transact_items:
        if not isinstance(entry, dict) or len(entry) != 1:
            continue  # moto rejects it before it writes anything
        op_type, op = next(iter(entry.items()))
        name: str | None = op.get("TableName") if isinstance(op, dict) else None
        table = backend.tables.get(name) if name else None
        key = _item_key(table, op_type, op) if table is not None else None
        if name is None or key is None or op_type == "ConditionCheck":
            continue
        try:
            current = backend.get_item(name, key)
        except Exception:  # a malformed key: moto refuses the transaction before this item is written
            continue
        saved.append((name, copy.deepcopy(key), None if current is None else current.to_json()["Attributes"]))
    return saved


def _restore(backend: Any, saved: _Snapshot) -> None:
    for name, key, attributes in reversed(saved):
        if attributes is None:
            if backend.get_item(name, key) is not None:
                backend.delete_item(name, key)
        else:
            backend.put_item(name, attributes)


def _copy_module(table_class: type, inside: threading.local) -> types.SimpleNamespace:
    """What ``moto.dynamodb.models`` sees as ``copy``: the standard module, except that inside a transaction a deep
    copy of a table is the table itself, so moto's own rollback (putting the "copy" back) changes nothing and
    ``_restore`` does the work. Everything else (items copied for query answers) is copied as before."""

    def deepcopy(value: Any, memo: Any = None) -> Any:
        if isinstance(value, table_class) and getattr(inside, "transaction", False):
            return value
        return copy.deepcopy(value, memo)

    return types.SimpleNamespace(**{n: getattr(copy, n) for n in ("copy", "error", "Error")}, deepcopy=deepcopy)


def main(argv: list[str] | None = None, run: Callable[[list[str]], Any] | None = None) -> Any:
    """Patch, then run moto's server with these arguments (``-H HOST -p PORT`` as ``python -m moto.server``;
    ``--gated``: closed until the launcher opens it, ``infra.local.gate``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if install():
        logger.info("DynamoDB transactions back up the items they name, not whole tables")
    from moto import server

    args = sys.argv[1:] if argv is None else argv
    if "--gated" in args:
        args = [a for a in args if a != "--gated"]
        gate_app(server)
        logger.info("gated: every request but moto's own API answers 503 until the launcher opens the gate")
    return (run or server.main)(args)


def gate_app(server: Any) -> None:
    """Have moto's server wrap its application in the gate (``infra.local.gate.Gate``)."""
    from infra.local.gate import Gate

    application = server.DomainDispatcherApplication
    if getattr(application, "_clipper_gated", False):
        return

    def gated(*args: Any, **kwargs: Any) -> Gate:
        return Gate(application(*args, **kwargs))

    gated._clipper_gated = True  # type: ignore[attr-defined]
    server.DomainDispatcherApplication = gated


if __name__ == "__main__":
    main()
