"""The admin report service over fakes: its time parameters, the range it reads, and the canary decisions."""

from __future__ import annotations

import pytest

from clipper.admin.report import DEFAULT_SINCE_S, RETENTION_S, ReportService, parse_time
from clipper.errors import InvalidInput, NotFound, Unavailable
from clipper.report.entry import FeedbackEntry
from tests.fakes import FakeClock, digits_app

pytestmark = pytest.mark.unit

NOW = 1_750_000_000.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24h", NOW - 86400),
        ("90m", NOW - 5400),
        ("7d", NOW - 7 * 86400),
        ("30s", NOW - 30),
        ("1700000000", 1_700_000_000.0),
        ("1700000000.5", 1_700_000_000.5),
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T22:13:20", 1_700_000_000.0),  # no zone: UTC
        ("2023-11-14T23:13:20+01:00", 1_700_000_000.0),
        (None, 42.0),
        ("", 42.0),
    ],
)
def test_times_are_epoch_seconds_iso_8601_or_ages(text, expected):
    assert parse_time(text, NOW, "since", 42.0) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["last tuesday", "nan", "inf", "-5", "1e400", "99999999999999", "9999999d", "7w"])
def test_a_bad_time_is_refused_naming_the_parameter(text):
    with pytest.raises(InvalidInput) as e:
        parse_time(text, NOW, "until", 0.0)
    assert e.value.field == "until"


class Registry:
    def __init__(self, events=None, fail=False):
        self.events = events or {}
        self.fail = fail

    def app_and_links(self, name):
        if name != "digits":
            raise NotFound("application", name)
        return digits_app(name="digits", policy="exp3"), ["a", "b"]


class EventfulRegistry(Registry):
    def canary_events(self, model, limit):
        if self.fail:
            raise Unavailable("registry down")
        return self.events.get(model, [])[:limit]


class Log:
    def __init__(self):
        self.asked = []

    def entries(self, app, since, until, limit):
        self.asked.append((app, since, until, limit))
        e = FeedbackEntry(NOW - 10, "f", app, None, 1, "exp3", ("a",), {"a": 1.0}, {"a": 1}, {"a": 0.0}, {"a": "1"})
        return [e], False


def test_the_report_reads_the_range_asked_within_the_logs_retention_and_until_now():
    log = Log()
    service = ReportService(Registry(), log, FakeClock(NOW))
    report = service.report("digits")
    assert log.asked[-1] == ("digits", NOW - DEFAULT_SINCE_S, NOW, 50_000)
    assert report["app"] == "digits" and report["feedbacks"] == 1 and report["models"]["a"]["mean_loss"] == 0.0
    service.report("digits", since="90d", until=str(NOW + 3600))
    assert log.asked[-1][1:3] == (NOW - RETENTION_S, NOW)  # the log keeps 30 days; nothing is logged after now
    with pytest.raises(InvalidInput) as e:
        service.report("digits", since="1h", until="2h")
    assert e.value.field == "since"
    for far in ("2099-01-01", "1e12"):  # well-formed, out of range: said so (it read as not ISO 8601)
        with pytest.raises(InvalidInput, match="since: expected a time between 1970 and a year from now"):
            service.report("digits", since=far)
    with pytest.raises(InvalidInput, match="ISO 8601"):
        service.report("digits", since="yesterday")
    with pytest.raises(NotFound):
        service.report("nope")
    with pytest.raises(Unavailable, match="no feedback log"):
        ReportService(Registry(), None, FakeClock(NOW)).report("digits")


def test_canary_decisions_come_from_the_registry_when_it_has_them():
    events = {"b": [{"decision": "rollback", "version": "2"}]}
    report = ReportService(EventfulRegistry(events), Log(), FakeClock(NOW)).report("digits")
    assert report["canary"]["b"]["events"] == events["b"]
    assert ReportService(Registry(events), Log(), FakeClock(NOW)).report("digits")["canary"] == {}
    failing = ReportService(EventfulRegistry(events, fail=True), Log(), FakeClock(NOW)).report("digits")
    assert failing["canary"] == {} and failing["feedbacks"] == 1  # the report goes on without them
    timed = {"b": [{"kind": "decision", "at": NOW - 60}, {"kind": "start", "at": NOW - 30 * 86400}]}
    report = ReportService(EventfulRegistry(timed), Log(), FakeClock(NOW)).report("digits", since="1d")
    assert report["canary"]["b"]["events"] == timed["b"][:1]  # the events of the report's range
