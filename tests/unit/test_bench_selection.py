"""The selection benchmark's recovery figure: sustained (the query after which the windowed accuracy stays within
the band), not the first time it enters the band."""

from __future__ import annotations

import numpy as np
import pytest

from bench.selection_recovery import recovery

pytestmark = pytest.mark.unit


def test_recovery_is_sustained_not_the_first_entry_into_the_band() -> None:
    # before the fault: all right; after it: 20 wrong, 10 right, 20 wrong again (a dip), then right to the end
    curve = np.array([1.0] * 100 + [0.0] * 20 + [1.0] * 10 + [0.0] * 20 + [1.0] * 100)
    r = recovery(curve, fault=100, before=1.0, window=10, band=0.01)
    assert r["first_within_band_queries"] == 20  # the window [20, 30) after the fault is all right
    assert r["recovery_queries"] == 50  # but only from [50, 60) on do all windows stay in the band
    assert r["windows_outside_band_after_first_entry"] == 29  # windows starting at 21..49 hold a wrong answer
    assert r["worst_window_after"] == 0.0


def test_a_stream_that_ends_outside_the_band_has_not_recovered() -> None:
    curve = np.array([1.0] * 50 + [0.0] * 10 + [1.0] * 30 + [0.0] * 10)
    r = recovery(curve, fault=50, before=1.0, window=5)
    assert r["first_within_band_queries"] == 10 and r["recovery_queries"] is None


def test_no_drop_means_no_wait() -> None:
    r = recovery(np.full(200, 0.9), fault=100, before=0.9, window=10)
    assert r["recovery_queries"] == 0 and r["first_within_band_queries"] == 0
