from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clipper.batching.latency import LatencyModel

pytestmark = pytest.mark.unit

observations = st.lists(
    st.tuples(st.integers(min_value=1, max_value=256), st.floats(min_value=0, max_value=2.0, allow_nan=False)),
    min_size=1,
    max_size=300,
)


def test_fits_a_line_and_forgets_old_batches():
    m = LatencyModel(window=4, margin=1.0)
    for n in (1, 2, 3, 4):
        m.observe(n, 0.010 + 0.002 * n)
    a, b = m.line()
    assert a == pytest.approx(0.010) and b == pytest.approx(0.002)
    assert m.predict(10) == pytest.approx(0.030)
    for n in (1, 2, 3, 4):  # the model got twice as slow: the old batches leave the window
        m.observe(n, 0.020 + 0.004 * n)
    assert len(m) == 4 and m.predict(10) == pytest.approx(0.060)


def test_before_two_sizes_it_scales_up_but_never_down():
    m = LatencyModel(margin=1.0)
    assert m.predict(4) is None and m.rows_within(0.001, 7) == 7  # nothing known: no cut
    m.observe(4, 0.040)
    m.observe(4, 0.040)
    assert m.predict(8) == pytest.approx(0.080) and m.predict(1) == pytest.approx(0.040)
    assert not m.fitted
    m.observe(1, 0.013)
    assert m.fitted and m.predict(1) < 0.040


def test_rows_within_the_budget():
    m = LatencyModel(margin=1.1)
    for n in (1, 5, 9):
        m.observe(n, 0.002 + 0.010 * n)
    assert m.rows_within(1.0, 64) == 64
    assert m.rows_within(0.045, 64) == 3  # 1.1 * (2 + 30) = 35.2 ms; 4 rows: 46.2 ms
    assert m.rows_within(0.005, 64) == 0 and m.rows_within(-1, 64) == 0


@given(observations, st.floats(min_value=0, max_value=3), st.floats(min_value=0, max_value=3))
def test_more_time_never_means_fewer_rows(batches, t1, t2):
    m = LatencyModel(window=50)
    for n, t in batches:
        m.observe(n, t)
    lo, hi = sorted((t1, t2))
    assert 0 <= m.rows_within(lo, 256) <= m.rows_within(hi, 256) <= 256
    fits = m.rows_within(hi, 256)
    if fits > 0:
        assert m.predict(fits) <= hi
    if fits < 256 and hi > 0:  # no time left means no rows, whatever the model predicts
        assert m.predict(fits + 1) > hi


@given(observations)
def test_predictions_grow_with_the_rows_and_are_never_negative(batches):
    m = LatencyModel(window=50)
    for n, t in batches:
        m.observe(n, t)
    values = [m.predict(n) for n in (1, 2, 8, 64, 256)]
    assert all(v is not None and v >= 0 for v in values)
    assert values == sorted(values)
