"""The query streams, as sent to the live stack and replayed offline: shuffled passes over the held-out digits
rows, each input made distinct by a tag, and (for the personalisation experiment) a user per query whose group
transforms the input as ``bench/selection.py`` does (plain, mirrored, noisy).

The tag: every query of a run has a serial, unique across streams and applications; it is added, in steps of
1e-4, to two corner pixels (0 and 56, blank in the digits images) of the input that is sent. The prediction
cache keys on (model, version, input), and several applications share the models, so without it a repeated
row (a later pass, another application) would be answered from the cache; with it every query reaches the
models. The replay predicts on exactly the tagged inputs, so a tag that changed a model's answer would change
it in both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TAG_STEP = 1e-4
TAG_BASE = 1000  # serials below TAG_BASE ** 2: pixel 0 carries serial % TAG_BASE + 1, pixel 56 serial // TAG_BASE


@dataclass(frozen=True)
class Stream:
    rows: np.ndarray  # the held-out row of each query
    x: np.ndarray  # float32 [n, 64]: the inputs sent, tagged
    y: np.ndarray  # the labels sent as feedback
    users: np.ndarray | None = None  # the user of each query (personalisation), else None
    groups: tuple[str, ...] = ()  # each user's group
    send_uid: bool = True  # queries and feedback carry the user's id (per-user selection); False: app-wide

    def __len__(self) -> int:
        return len(self.y)

    def uid(self, t: int) -> int | None:
        """The ``uid`` query ``t`` and its feedback carry, if any."""
        return None if self.users is None or not self.send_uid else int(self.users[t])


def order(rng: np.random.Generator, rows: int, passes: int) -> np.ndarray:
    return np.concatenate([rng.permutation(rows) for _ in range(passes)])


def tagged(x: np.ndarray, first_serial: int) -> np.ndarray:
    """``x`` as float32 with each row tagged by its serial (``first_serial`` + its index)."""
    out = np.array(x, dtype=np.float32, copy=True)
    serials = first_serial + np.arange(len(out))
    if serials.size and serials[-1] >= TAG_BASE**2:
        raise ValueError(f"serial {serials[-1]} is beyond the tags' range ({TAG_BASE**2})")
    out[:, 0] += ((serials % TAG_BASE) + 1).astype(np.float32) * np.float32(TAG_STEP)
    out[:, 56] += (serials // TAG_BASE).astype(np.float32) * np.float32(TAG_STEP)
    return out


def plain_stream(x: np.ndarray, y: np.ndarray, rows: np.ndarray, first_serial: int) -> Stream:
    return Stream(rows, tagged(x[rows], first_serial), y[rows])


def user_stream(
    views: dict[str, np.ndarray],
    y: np.ndarray,
    rows: np.ndarray,
    users: np.ndarray,
    per_group: int,
    first_serial: int,
    send_uid: bool = True,
) -> Stream:
    """``views``: the held-out inputs as each group sees them; users ``g * per_group + i`` are in group ``g``.
    ``send_uid``: whether queries name their user (per-user selection) or not (the same stream, app-wide)."""
    groups = tuple(g for g in views for _ in range(per_group))
    x = np.stack([views[groups[u]][r] for r, u in zip(rows.tolist(), users.tolist(), strict=True)])
    return Stream(rows, tagged(x, first_serial), y[rows], users, groups, send_uid)


def all_distinct(streams: list[Stream]) -> bool:
    """Whether no input is sent twice in the run (the cache never answers a query of the benchmark)."""
    seen: set[bytes] = set()
    total = 0
    for s in streams:
        for row in np.ascontiguousarray(s.x, dtype=np.float32):
            seen.add(row.tobytes())
        total += len(s)
    return len(seen) == total
