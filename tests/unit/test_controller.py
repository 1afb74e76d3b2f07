from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clipper.batching.controller import AimdController, FixedController

pytestmark = pytest.mark.unit

latencies = st.lists(st.floats(min_value=0, max_value=1.0, allow_nan=False), max_size=200)


@given(latencies, st.integers(min_value=1, max_value=512))
def test_size_stays_within_bounds(observations, upper):
    c = AimdController(slo_s=0.02, upper=upper)
    for latency in observations:
        c.observe(c.max_batch_size(), latency)
        assert 1 <= c.max_batch_size() <= upper


@given(st.integers(min_value=1, max_value=100))
def test_grows_by_two_while_under_the_slo(steps):
    c = AimdController(slo_s=0.02, upper=10_000)
    for _ in range(steps):
        c.observe(c.max_batch_size(), 0.001)
    assert c.max_batch_size() == 1 + 2 * steps


@given(st.floats(min_value=2, max_value=500), st.floats(min_value=0.02, max_value=5))
def test_backs_off_after_a_missed_slo(start, latency):
    c = AimdController(slo_s=0.02, size=start, upper=1000)
    before = c.size
    c.observe(c.max_batch_size(), latency)
    assert c.size == pytest.approx(max(1.0, before * 0.9))


def test_holds_between_ninety_percent_and_the_slo():
    c = AimdController(slo_s=0.02, size=10)
    c.observe(10, 0.019)
    assert c.max_batch_size() == 10


def test_small_batches_do_not_grow_the_size():
    c = AimdController(slo_s=0.02, size=10)
    c.observe(3, 0.001)
    assert c.max_batch_size() == 10


def test_fixed_controller_never_adapts():
    c = FixedController(8)
    c.observe(8, 10.0)
    assert c.max_batch_size() == 8
    with pytest.raises(ValueError):
        FixedController(0)


def _latency(size: int) -> float:
    return 0.002 + 0.0005 * size  # 2 ms overhead + 0.5 ms per row


def test_quantile_controller_fits_the_slo_from_samples():
    from clipper.batching.controller import QuantileController

    c = QuantileController(slo_s=0.02, samples_needed=200, refit_every=50)
    for _ in range(400):
        n = c.max_batch_size()
        c.observe(n, _latency(n))
    # (20 ms - 2 ms) / 0.5 ms = 36 rows
    assert c.coefficients is not None and 34 <= c.max_batch_size() <= 36


def test_a_quantile_controller_started_from_a_saved_fit_sizes_for_its_own_slo():
    """A settings change, a linked application's SLO or a restart builds a new controller from the old one's
    state: it kept the old size, which could then only shrink until a new fit 1,000 batches later."""
    from clipper.batching.controller import QuantileController

    old = QuantileController(slo_s=0.02, samples_needed=200, refit_every=50)
    for _ in range(400):
        n = old.max_batch_size()
        old.observe(n, _latency(n))
    assert 34 <= old.max_batch_size() <= 36
    looser = QuantileController(slo_s=0.08)  # (80 ms - 2 ms) / 0.5 ms = 156 rows
    looser.restore(old.state())
    assert 150 <= looser.max_batch_size() <= 156
    for _ in range(50):  # fast batches: the size holds at the fit's, it does not fall back
        looser.observe(looser.max_batch_size(), _latency(looser.max_batch_size()))
    assert 150 <= looser.max_batch_size() <= 156
    tighter = QuantileController(slo_s=0.01, upper=1024)  # (10 - 2) / 0.5 = 16
    tighter.restore(old.state())
    assert 15 <= tighter.max_batch_size() <= 16
    bounded = QuantileController(slo_s=0.08, upper=64)
    bounded.restore(old.state())
    assert bounded.max_batch_size() == 64


@given(st.lists(st.tuples(st.integers(1, 300), st.floats(0, 1, allow_nan=False)), max_size=300))
def test_quantile_controller_stays_within_bounds(observations):
    from clipper.batching.controller import QuantileController

    c = QuantileController(slo_s=0.02, samples_needed=50, refit_every=10, upper=256)
    for size, latency in observations:
        c.observe(size, latency)
        assert 1 <= c.max_batch_size() <= 256


def test_state_round_trips_across_instances():
    from clipper.batching.controller import QuantileController, make_controller

    a = AimdController(slo_s=0.02)
    for _ in range(10):
        a.observe(a.max_batch_size(), 0.001)
    b = AimdController(slo_s=0.02)
    b.restore(a.state())
    assert b.max_batch_size() == a.max_batch_size() == 21
    q = QuantileController(slo_s=0.02, samples_needed=100, refit_every=20)
    for _ in range(200):
        q.observe(q.max_batch_size(), _latency(q.max_batch_size()))
    q2 = make_controller("quantile", 0.02)
    q2.restore(q.state())
    assert q2.max_batch_size() == q.max_batch_size()
    fixed = make_controller("aimd", 0.02, batch_size=8)
    fixed.restore(a.state())
    assert fixed.max_batch_size() == 8  # the user's fixed size wins
    with pytest.raises(ValueError):
        make_controller("clock", 0.02)


def noisy_batches(n: int, seed: int, heteroscedastic: bool = False):
    """Batch latencies with a right-skewed tail, as real batches have: 2 ms + 0.5 ms a row + exponential noise
    (scale 1 ms, or growing with the size)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 65, n).astype(float)
    scale = 0.001 * (1 + sizes / 16) if heteroscedastic else 0.001
    return sizes, 0.002 + 0.0005 * sizes + rng.exponential(scale, n)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_p99_line_is_a_quantile_regression_not_a_mean(seed):
    import numpy as np

    from clipper.batching.quantile import quantile_line

    sizes, latency = noisy_batches(4000, seed)
    intercept, slope = quantile_line(sizes, latency, 0.99)
    # the true p99 line: 2 ms + 0.5 ms a row + the exponential's p99 (ln 100 ms = 4.6 ms); a least-squares (mean)
    # line would sit near 3 ms
    assert intercept == pytest.approx(0.002 + 0.001 * np.log(100), abs=0.0008)
    assert slope == pytest.approx(0.0005, abs=0.00003)
    covered = np.mean(latency <= intercept + slope * sizes)
    assert 0.985 <= covered <= 0.995


def test_with_a_tail_that_grows_with_the_size_the_p99_slope_is_steeper_than_the_mean_slope():
    import numpy as np

    from clipper.batching.quantile import pinball_loss, quantile_line

    sizes, latency = noisy_batches(4000, 7, heteroscedastic=True)
    intercept, slope = quantile_line(sizes, latency, 0.99)
    true_slope = 0.0005 + 0.001 * np.log(100) / 16
    assert slope == pytest.approx(true_slope, rel=0.15)
    mean_intercept, mean_slope = np.polyfit(sizes, latency, 1)[::-1]
    assert mean_slope < 0.8 * slope
    fitted, as_mean = latency - (intercept + slope * sizes), latency - (mean_intercept + mean_slope * sizes)
    assert pinball_loss(fitted, 0.99) < pinball_loss(as_mean, 0.99)


def test_the_quantile_controller_misses_the_slo_about_once_in_a_hundred_batches():
    import numpy as np

    from clipper.batching.controller import QuantileController

    rng = np.random.default_rng(11)
    c = QuantileController(slo_s=0.025, samples_needed=1000, refit_every=100)
    misses = []
    for i in range(6000):
        size = c.max_batch_size()
        latency = 0.002 + 0.0005 * size + rng.exponential(0.001)
        c.observe(size, latency)
        if i >= 3000:
            misses.append(latency >= 0.025)
    # full batches at the fitted size: (25 - 2 - 4.6) / 0.5 = 36 rows; a mean fit would take 44 and miss ~1/3
    assert 33 <= c.max_batch_size() <= 38
    assert np.mean(misses) < 0.03
