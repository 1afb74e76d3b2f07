"""What the local stack keeps across restarts, under its state folder (``.local-stack/`` by default).

moto keeps everything in memory, so the stack's durable state is copied out of it and back in:

    state/tables/<LogicalId>.json    the items of the registry and selection tables (DynamoDB JSON), sorted
    state/bucket/<key>               the model bucket's objects under models/ (uploaded versions)
    state/bucket.json                {key: ETag} of the objects copied
    ports.json                       {process name: port}: a process gets its port of the last run when free,
                                     so the endpoints the registry names stay valid

``Snapshot.take`` (every few seconds while the stack runs, and once at stop) writes only what changed;
``Snapshot.restore`` puts it back into a freshly created stack (tables by logical id: the local stack names its
resources after their logical ids, see ``cfn.with_physical_names``), before the bucket's events are connected,
so restored objects are not taken for new uploads. Redis keeps its own state (an append-only file in
``redis/``).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from infra.local.supervisor import write_atomically

logger = logging.getLogger("clipper.local")

SNAPSHOT_TABLES = ("RegistryTable", "SelectionTable")
# items kept only while recent, by table: the markers of applied feedback (one per feedback, expiring after 15 days)
# would make every copy grow with all the feedback received. Those of the last hour are kept, at most
# MAX_RECENT_MARKERS of them (the newest): a feedback sent again with its feedback_id (a client's retry) across a
# restart is applied once, as it is while the stack runs; an older one, or a message applied but not deleted when
# the stack stopped longer ago, would be applied once more after the restart
RECENT_ONLY_PREFIXES = {"SelectionTable": "FEEDBACK#"}
RECENT_MARKERS_S = 3600
MAX_RECENT_MARKERS = 5_000
BUCKET_PREFIX = "models/"


def port_is_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:``port`` now (as uvicorn does, with SO_REUSEADDR: connections
    of a server that just stopped, in TIME_WAIT, do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ports:
    """Ports by process name, remembered in a JSON file: the same one as last time when it is free."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        try:
            self._ports: dict[str, int] = {k: int(v) for k, v in json.loads(path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            self._ports = {}
        self._given: set[int] = set()
        self.moved: dict[str, tuple[int, int]] = {}  # name -> (last run's port, this run's)

    def assign(self, name: str) -> int:
        with self._lock:
            old = self._ports.get(name)
            if old is not None and old not in self._given and port_is_free(old):
                port = old
            else:
                port = free_port()
                while port in self._given:
                    port = free_port()
                if old is not None:
                    self.moved[name] = (old, port)
            self._given.add(port)
            self._ports[name] = port
            write_atomically(self._path, json.dumps(self._ports, indent=1, sort_keys=True).encode())
            return port

    def moved_urls(self) -> dict[str, str]:
        return {f"http://127.0.0.1:{a}": f"http://127.0.0.1:{b}" for a, b in self.moved.values()}


class Snapshot:
    def __init__(self, folder: Path, dynamodb: Any, s3: Any, tables: Mapping[str, str], bucket: str) -> None:
        """``tables``: {logical id: table name} of the tables to keep; ``bucket``: the model bucket."""
        self._dir = folder
        self._dynamodb, self._s3 = dynamodb, s3
        self._tables, self._bucket = dict(tables), bucket
        self._written: dict[str, bytes] = {}
        self._lock = threading.Lock()
        (folder / "tables").mkdir(parents=True, exist_ok=True)
        (folder / "bucket").mkdir(parents=True, exist_ok=True)

    @property
    def exists(self) -> bool:
        return any((self._dir / "tables").glob("*.json"))

    # -- out of moto -----------------------------------------------------------------------------------
    def take(self, still_valid: Callable[[], bool] = lambda: True) -> list[str]:
        """Copy what changed since the last copy; returns what was written. ``still_valid`` is asked after
        reading and before writing: False (moto restarted meanwhile, its tables not restored yet) writes
        nothing, so an empty emulator never overwrites the last good copy."""
        with self._lock:
            tables = {
                logical: _dump(self._scan(name, RECENT_ONLY_PREFIXES.get(logical)))
                for logical, name in self._tables.items()
            }
            listing = self._list_objects()
            if not still_valid():
                return []
            written = []
            for logical, body in tables.items():
                path = self._dir / "tables" / f"{logical}.json"
                if self._written.get(logical) != body or not path.is_file():  # changed, or removed under the stack
                    write_atomically(path, body)
                    self._written[logical] = body
                    written.append(logical)
            if self._sync_bucket(listing):
                written.append("bucket")
            return written

    def _scan(self, table: str, recent_only: str | None) -> list[dict[str, Any]]:
        """The table's items; those whose sort key starts with ``recent_only`` only when written within
        RECENT_MARKERS_S (their ``expires_at`` a marker's lifetime after their write), the newest
        MAX_RECENT_MARKERS of them."""
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
        if recent_only:
            from clipper.adapters.dynamodb_selection import MARKER_TTL_S

            recent = int(time.time()) + MARKER_TTL_S - RECENT_MARKERS_S
            kwargs["FilterExpression"] = "NOT begins_with(sk, :prefix) OR expires_at > :recent"
            kwargs["ExpressionAttributeValues"] = {":prefix": {"S": recent_only}, ":recent": {"N": str(recent)}}
        while True:
            page = self._dynamodb.scan(**kwargs)
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        if recent_only:
            marked = [i for i in items if i["sk"]["S"].startswith(recent_only)]
            if len(marked) > MAX_RECENT_MARKERS:
                marked.sort(key=lambda i: -int(i.get("expires_at", {}).get("N", "0")))
                dropped = {id(i) for i in marked[MAX_RECENT_MARKERS:]}
                items = [i for i in items if id(i) not in dropped]
        return items

    def _list_objects(self) -> dict[str, str]:
        objects: dict[str, str] = {}
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=BUCKET_PREFIX):
            for o in page.get("Contents", []):
                objects[o["Key"]] = o["ETag"]
        return objects

    def _sync_bucket(self, listing: dict[str, str]) -> bool:
        index_path = self._dir / "bucket.json"
        index = _read_json(index_path)
        changed = False
        for key, etag in listing.items():
            path = self._object_path(key)
            if index.get(key) == etag and path.is_file():
                continue
            body = self._s3.get_object(Bucket=self._bucket, Key=key)["Body"].read()
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, body)
            index[key], changed = etag, True
        for key in set(index) - set(listing):
            self._object_path(key).unlink(missing_ok=True)
            del index[key]
            changed = True
        if changed:
            write_atomically(index_path, json.dumps(index, indent=1, sort_keys=True).encode())
        return changed

    def _object_path(self, key: str) -> Path:
        path = (self._dir / "bucket" / key).resolve()
        if not path.is_relative_to((self._dir / "bucket").resolve()):
            raise ValueError(f"object key {key!r} leaves the snapshot folder")
        return path

    # -- back into moto --------------------------------------------------------------------------------
    def restore(self) -> dict[str, int]:
        """Put the copied items and objects into the (new, empty) stack; returns counts by table and bucket."""
        counts: dict[str, int] = {}
        with self._lock:
            for logical, name in self._tables.items():
                path = self._dir / "tables" / f"{logical}.json"
                if not path.is_file():
                    continue
                body = path.read_bytes()
                items = json.loads(body)
                for start in range(0, len(items), 25):
                    self._write_batch(name, items[start : start + 25])
                self._written[logical] = body
                counts[logical] = len(items)
            index = _read_json(self._dir / "bucket.json")
            for key in index:
                path = self._object_path(key)
                if path.is_file():
                    self._s3.put_object(Bucket=self._bucket, Key=key, Body=path.read_bytes())
            counts["objects"] = len(index)
            # ETags of the new objects are the same (same bytes, no multipart): the index stays valid
        return counts

    def _write_batch(self, table: str, items: list[dict[str, Any]]) -> None:
        requests: dict[str, Any] = {table: [{"PutRequest": {"Item": item}} for item in items]}
        while requests:
            requests = self._dynamodb.batch_write_item(RequestItems=requests).get("UnprocessedItems") or {}


def _dump(items: list[dict[str, Any]]) -> bytes:
    items.sort(key=lambda i: json.dumps({k: i[k] for k in ("pk", "sk") if k in i}, sort_keys=True))
    return json.dumps(items, sort_keys=True, separators=(",", ":")).encode()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def repoint_endpoints(dynamodb: Any, table: str, moved: Mapping[str, str]) -> int:
    """Rewrite the endpoint of every registered version that names a server of the last run which now listens
    elsewhere (``moved``: old URL -> new URL); returns how many versions changed."""
    if not moved:
        return 0
    changed = 0
    kwargs: dict[str, Any] = {
        "TableName": table,
        "FilterExpression": "begins_with(sk, :v)",
        "ExpressionAttributeValues": {":v": {"S": "VERSION#"}},
    }
    while True:
        page = dynamodb.scan(**kwargs)
        for item in page.get("Items", []):
            new = moved.get(item.get("endpoint", {}).get("S", ""))
            if new is None:
                continue
            dynamodb.update_item(
                TableName=table,
                Key={"pk": item["pk"], "sk": item["sk"]},
                UpdateExpression="SET endpoint = :e",
                ExpressionAttributeValues={":e": {"S": new}},
            )
            changed += 1
        if "LastEvaluatedKey" not in page:
            return changed
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
