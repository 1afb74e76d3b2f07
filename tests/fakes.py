"""In-memory fakes of the ports, for unit tests that assert end states rather than calls."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clipper.canary.evidence import VersionEvidence
from clipper.core.domain import Application, Canary, InputType, ModelVersion
from clipper.core.messages import Reply
from clipper.core.validation import Rows
from clipper.errors import EndpointError, NotFound, Unavailable


@dataclass
class FakeClock:
    t: float = 1_700_000_000.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class InMemoryRegistry:
    apps: dict[str, Application] = field(default_factory=dict)
    links: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    versions: dict[tuple[str, str], ModelVersion] = field(default_factory=dict)
    active: dict[str, str] = field(default_factory=dict)
    canaries: dict[str, Canary] = field(default_factory=dict)
    reads: int = 0

    def get_app(self, name: str) -> Application:
        self.reads += 1
        if name not in self.apps:
            raise NotFound("application", name)
        return self.apps[name]

    def linked_models(self, app: str) -> list[str]:
        return list(self.links.get(app, []))

    def active_version(self, model: str) -> ModelVersion:
        if model not in self.active:
            raise NotFound("model", model)
        return self.versions[(model, self.active[model])]

    def get_version(self, model: str, version: str) -> ModelVersion:
        if (model, version) not in self.versions:
            raise NotFound("model version", f"{model}:{version}")
        return self.versions[(model, version)]

    def canary(self, model: str) -> Canary | None:
        return self.canaries.get(model)


@dataclass
class InMemoryReplies:
    lists: dict[str, list[Reply]] = field(default_factory=lambda: defaultdict(list))
    done: set[tuple[str, str]] = field(default_factory=set)
    down: bool = False

    def publish(self, reply_to: str, reply: Reply) -> bool:
        if self.down:
            raise Unavailable("replies down")
        if reply.ok:
            if (reply_to, reply.model) in self.done:
                return False
            self.done.add((reply_to, reply.model))
        self.lists[reply_to].append(reply)
        return True

    def answered(self, reply_to: str, model: str) -> bool:
        return (reply_to, model) in self.done

    def publish_many(self, replies):
        return [self.publish(reply_to, reply) for reply_to, reply in replies]

    def answered_many(self, keys):
        if self.down:
            raise Unavailable("replies down")
        return [self.answered(reply_to, model) for reply_to, model in keys]

    addresses: int = 0

    def new_address(self) -> str:
        self.addresses += 1
        return f"inbox.{self.addresses:032x}"

    def expect(self, reply_to: str) -> None:
        pass

    def forget(self, reply_to: str) -> None:
        self.lists.pop(reply_to, None)

    async def wait_async(self, reply_to: str, models, timeout_s: float) -> list[Reply]:
        return self.wait(reply_to, models, timeout_s)

    def wait(self, reply_to: str, models, timeout_s: float) -> list[Reply]:
        """What was published so far: one reply per model, a success winning over an error."""
        by_model: dict[str, Reply] = {}
        for r in self.lists.pop(reply_to, []):
            if r.model not in by_model or (r.ok and not by_model[r.model].ok):
                by_model[r.model] = r
        return list(by_model.values())


@dataclass
class FakeEndpoint:
    """Predicts the index of the largest value of each row (or the length of a string)."""

    calls: list[int] = field(default_factory=list)
    fail_with: str | None = None
    wrong_count: bool = False

    def predict(self, rows: Rows) -> list[Any]:
        self.calls.append(len(rows))
        if self.fail_with:
            raise EndpointError(self.fail_with)
        if isinstance(rows, np.ndarray):
            out: list[Any] = rows.reshape(len(rows), -1).argmax(axis=1).tolist()
        else:
            out = [len(r) for r in rows]
        return out[:-1] if self.wrong_count else out


@dataclass
class FakeResolver:
    endpoint: FakeEndpoint

    def endpoint_for(self, model: str, version: str) -> FakeEndpoint:
        return self.endpoint


@dataclass
class ListQueue:
    sent: list[tuple[str, str]] = field(default_factory=list)
    down: bool = False

    def send(self, queue_url: str, body: str, timeout: float | None = None) -> None:
        if self.down:
            raise Unavailable("sqs down")
        self.sent.append((queue_url, body))

    def send_many(self, messages, timeout: float | None = None) -> list[Exception | None]:
        out: list[Exception | None] = []
        for url, body in messages:
            try:
                self.send(url, body)
                out.append(None)
            except Unavailable as e:
                out.append(e)
        return out


def digits_app(**overrides: Any) -> Application:
    values: dict[str, Any] = {
        "name": "digits",
        "input_type": InputType.FLOATS,
        "default_output": "-1",
        "latency_slo_micros": 100_000,
        "input_shape": (64,),
    }
    values.update(overrides)
    return Application(**values)


def model_version(name: str = "mlp", version: str = "1", **overrides: Any) -> ModelVersion:
    values: dict[str, Any] = {
        "name": name,
        "version": version,
        "input_type": InputType.FLOATS,
        "queue_url": f"https://sqs.local/q-{name}",
        "endpoint": "http://127.0.0.1:1",
        "input_shape": (64,),
    }
    values.update(overrides)
    return ModelVersion(**values)


@dataclass
class InMemoryCache:
    entries: dict[str, Any] = field(default_factory=dict)
    claims: set[str] = field(default_factory=set)
    clock: FakeClock | None = None
    down: bool = False

    def get_many(self, keys: list[str], timeout: float | None = None) -> dict[str, Any]:
        if self.down:
            raise Unavailable("cache down")
        if self.clock:
            self.clock.advance(0.01)  # polling takes time
        return {k: self.entries[k] for k in keys if k in self.entries}

    def put_many(self, entries: dict[str, Any], timeout: float | None = None) -> None:
        self.entries.update(entries)
        self.claims -= set(entries)
        for k in entries:
            self.owners.pop(k, None)

    def put_new(self, entries: dict[str, Any], timeout: float | None = None) -> None:
        self.put_many({k: v for k, v in entries.items() if k not in self.entries})

    owners: dict[str, str] = field(default_factory=dict)  # claim -> its owner's token (claims added by hand: none)

    def claim(self, keys: list[str], ttl_s: float, timeout: float | None = None, owner: str = "1") -> set[str]:
        self._expire_failures()
        owned = {k for k in keys if k not in self.claims}
        self.claims |= owned
        self.owners.update(dict.fromkeys(owned, owner))
        return owned

    def lookup(self, keys: list[str], claim_ttl_s: float, timeout: float | None = None, owner: str = "1"):
        hits = self.get_many(keys)
        return hits, self.claim([k for k in dict.fromkeys(keys) if k not in hits], claim_ttl_s, owner=owner)

    failed: dict[str, str] = field(default_factory=dict)
    failed_until: dict[str, float] = field(default_factory=dict)  # as the stores': a failure lasts its ttl

    def fail_many(self, failures: dict[str, str], ttl_s: float, timeout: float | None = None, *, owner: str) -> None:
        mine = {k: c for k, c in failures.items() if self.owners.get(k) == owner}
        self.failed.update(mine)
        if self.clock is not None:
            self.failed_until.update(dict.fromkeys(mine, self.clock.t + ttl_s))

    def _expire_failures(self) -> None:
        """A failure whose ttl passed leaves the key free (with a clock; without one, failures stay)."""
        if self.clock is None:
            return
        for k in [k for k, until in self.failed_until.items() if until <= self.clock.t]:
            del self.failed_until[k]
            self.failed.pop(k, None)
            self.claims.discard(k)
            self.owners.pop(k, None)

    def release(self, keys: list[str], owner: str, timeout: float | None = None) -> None:
        """As Redis's: only the claims ``owner`` holds end."""
        for k in keys:
            if self.owners.get(k) == owner:
                self.claims.discard(k)
                del self.owners[k]

    def poll(self, keys: list[str], timeout: float | None = None) -> tuple[dict[str, Any], dict[str, str]]:
        hits = self.get_many(keys)
        self._expire_failures()
        return hits, {k: self.failed[k] for k in keys if k in self.failed and k not in hits}

    def poll_or_claim(self, keys: list[str], claim_ttl_s: float, owner: str, timeout: float | None = None):
        hits, failed = self.poll(keys)
        free = [k for k in dict.fromkeys(keys) if k not in hits and k not in failed]
        return hits, failed, self.claim(free, claim_ttl_s, owner=owner)


@dataclass
class InMemorySelectionStore:
    """Versioned states with the same conditional-write rules as the DynamoDB store."""

    states: dict[str, Any] = field(default_factory=dict)
    applied: set[tuple[str, str]] = field(default_factory=set)

    def load(self, key: str) -> Any:
        return self.states.get(key)

    def save(self, key: str, state: Any, expected_version: int, feedback_id: str | None = None) -> bool:
        from clipper.errors import Conflict

        current = self.states.get(key)
        if (current.version if current else 0) != expected_version:
            raise Conflict(key)
        if feedback_id is not None and (key, feedback_id) in self.applied:
            return False
        self.states[key] = state
        if feedback_id is not None:
            self.applied.add((key, feedback_id))
        return True


@dataclass
class InMemoryServingStacks:
    """``ServingStacks`` that gives each version a queue and endpoint of its own and keeps what it serves."""

    served: dict[tuple[str, str], Any] = field(default_factory=dict)  # (model, version) -> (ModelArtifact, replicas)
    updating: dict[tuple[str, str], str] = field(default_factory=dict)  # (model, version) -> a stack's status

    mappings: dict[tuple[str, str], tuple[int, int] | None] = field(default_factory=dict)  # create's batching

    def create(self, model: str, version: str, artifact: Any, replicas: int, batching: Any = None) -> Any:
        from clipper.models.serving import Serving, StackServesAnotherFile

        have = self.served.get((model, version))
        if have is not None and getattr(have[0], "sha256", "") and have[0].sha256 != getattr(artifact, "sha256", ""):
            raise StackServesAnotherFile(f"the stack of {model}:{version} serves another file", have[0].sha256)
        self.served.setdefault((model, version), (artifact, replicas))
        self.mappings.setdefault((model, version), batching)
        return Serving(f"https://sqs.local/queue-{model}-v{version}", f"http://endpoint.local/{model}/{version}")

    def scale(self, model: str, version: str, replicas: int) -> None:
        if (model, version) not in self.served:
            raise NotFound("model stack", f"{model}:{version}")
        self.served[(model, version)] = (self.served[(model, version)][0], replicas)

    def busy(self, model: str, version: str) -> str | None:
        if (model, version) not in self.served:
            raise NotFound("model stack", f"{model}:{version}")
        return self.updating.get((model, version))

    def set_batching(self, model: str, version: str, batch_size: int, window_s: int) -> bool:
        return False

    def delete(self, model: str, version: str) -> None:
        self.served.pop((model, version), None)


@dataclass
class InMemoryCanaryEvidence:
    """The CanaryEvidenceStore (and the feedback worker's ``add_once``) in memory."""

    counts: dict[tuple[str, str, str], VersionEvidence] = field(default_factory=dict)
    tokens: set[tuple[str, str, str]] = field(default_factory=set)
    fail: bool = False  # every call raises Unavailable (a store that cannot be reached)

    def add(self, model: str, trial: str, version: str, delta: VersionEvidence) -> None:
        if self.fail:
            raise Unavailable("canary evidence store down")
        key = (model, trial, version)
        self.counts[key] = self.counts.get(key, VersionEvidence()) + delta

    def add_once(self, model: str, trial: str, version: str, delta: VersionEvidence, token: str) -> bool:
        if self.fail:
            raise Unavailable("canary evidence store down")
        if (model, trial, token) in self.tokens:
            return False
        self.tokens.add((model, trial, token))
        self.add(model, trial, version, delta)
        return True

    def load(self, model: str, trial: str) -> dict[str, VersionEvidence]:
        if self.fail:
            raise Unavailable("canary evidence store down")
        return {v: e for (m, t, v), e in self.counts.items() if (m, t) == (model, trial)}


@dataclass
class InMemoryCanaryControl:
    """The CanaryControl port over an InMemoryRegistry: ending a trial promotes (or not) and removes the canary."""

    registry: InMemoryRegistry
    events: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    def end_canary(self, model: str, trial: str, promote: bool) -> bool:
        canary = self.registry.canaries.get(model)
        if canary is None or canary.trial != trial:
            return False
        del self.registry.canaries[model]
        if promote:
            self.registry.active[model] = canary.version
        return True

    def add_canary_event(self, model: str, event: dict[str, Any]) -> None:
        self.events[model].append(event)
