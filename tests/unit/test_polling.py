from __future__ import annotations

import pytest

from clipper.core.polling import MAX_GAP_S, poll_gap

pytestmark = pytest.mark.unit


def test_a_wait_polls_at_its_base_first_then_a_tenth_of_the_time_waited_at_most_max_gap():
    assert poll_gap(0.01, 0.0) == poll_gap(0.01, 0.099) == 0.01  # the first ten polls: an early reply seen at once
    assert poll_gap(0.01, 0.2) == pytest.approx(0.02)
    assert poll_gap(0.01, 5.0) == MAX_GAP_S
    assert poll_gap(0.002, 0.03) == pytest.approx(0.003)
    assert poll_gap(0.2, 10.0) == 0.2  # never faster than its base


def test_a_one_second_wait_makes_a_third_of_the_polls():
    def polls(base: float) -> int:
        waited, n = 0.0, 0
        while waited < 1.0:
            waited += poll_gap(base, waited)
            n += 1
        return n

    assert 30 <= polls(0.01) <= 40  # against 100 at a fixed 10 ms
    assert polls(0.002) <= 60  # against 500 at a fixed 2 ms
