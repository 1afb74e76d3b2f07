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
