"""The query path's outage lines: at most one a key an interval, the next naming how many were left out."""

from __future__ import annotations

import logging

import pytest

from clipper.core.log_sampling import SampledLog
from clipper.frontend.query import QueryProcessor
from tests.fakes import FakeClock, InMemoryRegistry, InMemoryReplies, ListQueue, digits_app, model_version

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Records:
    """The records captured in the test's call phase (caplog keeps one list per phase)."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog

    def __getitem__(self, i: int) -> logging.LogRecord:
        return self._caplog.records[i]

    def __len__(self) -> int:
        return len(self._caplog.records)

    def __iter__(self):
        return iter(self._caplog.records)


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.INFO, logger="sampled-test")
    return Records(caplog)


def test_the_first_line_is_written_and_the_rest_of_the_interval_is_counted(records):
    clock = Clock()
    log = SampledLog(logging.getLogger("sampled-test"), every_s=1.0, clock=clock)
    assert log.warning(("cache", "digits"), "cache unavailable: %s", "down")
    for _ in range(41):
        clock.t += 0.02
        assert not log.warning(("cache", "digits"), "cache unavailable: %s", "down")
    assert [r.getMessage() for r in records] == ["cache unavailable: down"]
    clock.t = 101.0  # the interval after the first line has passed
    assert log.warning(("cache", "digits"), "cache unavailable: %s", "still down", extra={"app": "digits"})
    last = records[-1]
    assert last.getMessage() == "cache unavailable: still down (41 more like it since the last such line, not logged)"
    assert last.left_out == 41 and last.app == "digits" and last.levelno == logging.WARNING
    clock.t = 105.0  # a quiet stretch: the next line names none left out
    assert log.warning(("cache", "digits"), "cache unavailable: %s", "again")
    assert records[-1].getMessage() == "cache unavailable: again" and not hasattr(records[-1], "left_out")


def test_keys_are_sampled_apart(records):
    clock = Clock()
    log = SampledLog(logging.getLogger("sampled-test"), every_s=1.0, clock=clock)
    assert log.info(("default", "a"), "default output")
    assert log.info(("default", "b"), "default output")
    assert log.warning(("late", "a"), "late default output")
    assert not log.info(("default", "a"), "default output")
    assert len(records) == 3


def test_a_level_not_logged_is_neither_written_nor_counted(records):
    clock = Clock()
    log = SampledLog(logging.getLogger("sampled-test"), every_s=1.0, clock=clock)
    logging.getLogger("sampled-test").setLevel(logging.WARNING)
    try:
        assert not log.info("k", "default output")
        assert log.warning("k", "late default output")  # the key was not taken by the line not logged
    finally:
        logging.getLogger("sampled-test").setLevel(logging.NOTSET)
    assert [r.getMessage() for r in records] == ["late default output"]


def test_the_keys_are_bounded_the_oldest_forgotten_first(records):
    clock = Clock()
    log = SampledLog(logging.getLogger("sampled-test"), every_s=60.0, clock=clock, max_keys=3)
    for name in ("a", "b", "c"):
        assert log.warning(name, "line %s", name)
    assert log.warning("a", "line %s", "a") is False  # still in its interval (and now counted)
    assert log.warning("d", "line %s", "d")  # a fourth key: "a"'s entry is the oldest and goes
    assert log.warning("a", "line %s", "a")  # forgotten, so written again (its count went with it)
    assert not log.warning("c", "line %s", "c")  # "b" went for "a": "c" is still held
    assert len(log._keys) == 3
    with pytest.raises(ValueError):
        SampledLog(logging.getLogger("sampled-test"), max_keys=0)


def test_a_query_per_default_in_an_outage_writes_one_line_a_second(caplog):
    """No reply ever comes (every query the default): 50 queries in the same second write one 'default output'
    line; the first after the second names the 49 left out."""
    caplog.set_level(logging.INFO, logger="clipper.frontend.query")
    reg = InMemoryRegistry()
    reg.apps["digits"] = digits_app()
    reg.links["digits"] = ["mlp"]
    reg.versions[("mlp", "1")] = model_version()
    reg.active["mlp"] = "1"
    clock = FakeClock()
    ids = iter(range(1, 1_000))
    processor = QueryProcessor(reg, ListQueue(), InMemoryReplies(), clock, lambda: next(ids) << 16)
    for n in range(50):
        result = processor.predict("digits", {"input": [float(n)] * 64})
        assert result.predictions[0].default  # every answer still says it is the default, and why
        assert result.predictions[0].default_explanation
    lines = [r for r in caplog.records if r.getMessage().startswith("default output")]
    assert len(lines) == 1 and lines[0].app == "digits"
    clock.advance(1.0)
    processor.predict("digits", {"input": [99.0] * 64})
    lines = [r for r in caplog.records if r.getMessage().startswith("default output")]
    assert len(lines) == 2 and lines[1].left_out == 49
