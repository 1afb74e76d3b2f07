"""The pace of a wait that polls a store (DynamoDB replies, the prediction cache while another query computes an
input): at its base interval for its first ten base intervals (100 ms at 10 ms), then a tenth of the time waited
so far, at most ``MAX_GAP_S``. A reply that comes early is seen as soon as before; a wait that goes on (a model
down, a slow computation) reads far less often: a 1 s wait at a 10 ms base made ~70-100 reads, now ~35, each a
billed DynamoDB read or a Redis round trip on a core the queries share. The reply is seen at most a tenth of its
wait late."""

from __future__ import annotations

MAX_GAP_S = 0.05
BASE_POLLS = 10  # base intervals of waiting before the gap grows
GROWTH = 0.1  # the gap, as a share of the time waited


def poll_gap(base_s: float, waited_s: float) -> float:
    """The pause before the next poll of a wait that has lasted ``waited_s`` (a base of 0: none, as tests ask)."""
    if base_s <= 0 or waited_s < BASE_POLLS * base_s:
        return base_s
    return max(base_s, min(MAX_GAP_S, GROWTH * waited_s))
