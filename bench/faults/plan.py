"""How long each phase of a scenario lasts and how hard the steady load pushes (``--quick``: a check that it
runs, a few seconds a scenario)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    rate: float  # queries per second of steady load
    before_s: float
    fault_s: float
    after_s: float
    unknown_apps: int  # distinct unknown application names, in each of two rounds
    redelivery_wait_s: float  # at the end, how long to wait for a killed batcher's messages to come back


FULL = Plan(rate=40.0, before_s=4.0, fault_s=5.0, after_s=12.0, unknown_apps=10_000, redelivery_wait_s=240.0)
QUICK = Plan(rate=20.0, before_s=2.0, fault_s=2.0, after_s=6.0, unknown_apps=1_000, redelivery_wait_s=0.0)
