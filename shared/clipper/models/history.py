"""A model's version history: the active version and the versions active before it, which rollback walks back
(3 -> 2 -> 1), rather than toggling between the last two.

Every change of the active version (``set_model_version``, auto-promotion of an upload, ``rollback_model``) is a
conditional write on the history it read: ``switches`` counts the changes, so a writer that lost a race to another
(a rollback against an auto-promotion) is refused instead of overwriting it, even when the active version came
back to the same name in between.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

MAX_EARLIER = 50  # versions kept for rollback (the model item stays small)


@dataclass(frozen=True)
class VersionHistory:
    active: str | None  # None: the model has no active version yet
    earlier: tuple[str, ...] = ()  # oldest first; the last is the one a rollback returns to
    switches: int = 0  # changes of the active version so far (0: none recorded, as in items written before it)

    def switched_to(self, version: str) -> VersionHistory:
        """After making ``version`` active: the version active now joins the earlier ones."""
        earlier = self.earlier if self.active is None else (*self.earlier, self.active)
        return VersionHistory(version, earlier[-MAX_EARLIER:], self.switches + 1)

    def rolled_back(self, registered: Collection[str]) -> VersionHistory | None:
        """After a rollback: the latest earlier version still registered is active again, and leaves the
        history (so the next rollback goes one further back). Versions deleted since are skipped. None: there
        is no earlier version to return to."""
        earlier = list(self.earlier)
        while earlier:
            version = earlier.pop()
            if version in registered and version != self.active:
                return VersionHistory(version, tuple(earlier), self.switches + 1)
        return None
