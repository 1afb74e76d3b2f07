"""How long a policy takes to recover from a broken model (``bench/selection.py``'s robustness experiment).

The accuracy over a moving window of the next ``window`` queries is compared with a band: at most ``band``
under the accuracy before the fault. Two figures:

- sustained recovery (``recovery_queries``): the number of queries after the fault from which every later window
  stays within the band, None when the last window is still outside it (not recovered by the end of the stream);
- first entry (``first_within_band_queries``): the first window within the band, which a dip can follow.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def recovery(curve: np.ndarray, fault: int, before: float, window: int, band: float = 0.01) -> dict[str, Any]:
    """``curve``: per-query accuracy (a mean over streams); ``fault``: the first query the broken model answers."""
    ahead = np.convolve(curve[fault:], np.ones(window) / window, mode="valid")  # ahead[t]: queries [t, t + window)
    within = ahead >= before - band
    outside = np.flatnonzero(~within)
    if outside.size == 0:
        sustained: int | None = 0
    elif outside[-1] == ahead.size - 1:
        sustained = None  # the stream ends outside the band
    else:
        sustained = int(outside[-1]) + 1
    first = np.flatnonzero(within)
    return {
        "recovery_queries": sustained,
        "first_within_band_queries": int(first[0]) if first.size else None,
        "windows_outside_band_after_first_entry": int(np.sum(~within[first[0] :])) if first.size else None,
        "worst_window_after": float(ahead.min()),
        "band": [before - band, None],
    }
