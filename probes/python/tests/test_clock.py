"""Clock status sources: `unknown` by default, chronyd's tracking report on request."""

import sys

import pytest

from hoptrace_probe import clock
from hoptrace_probe.clock import ChronyClockStatus, UnknownClockStatus, parse_chronyc_tracking

LINE = ("7F000001,127.0.0.1,9,1795335480.242007074,-0.000002004,0.000000007,0.000000029,"
        "-0.066,0.008,0.511,0.000006488,0.000001670,0.0,Normal\n")


def test_unknown_is_the_default_and_says_so():
    s = UnknownClockStatus()()
    assert (s.source, s.synced, s.leap, s.offset_ns, s.error_bound_ns) == (0, False, 3, 0, 0)
    assert "chrony" in s.detail.lower() and s.at_ns > 0
    assert isinstance(clock.source_named(None), UnknownClockStatus)
    assert isinstance(clock.source_named("chrony"), ChronyClockStatus)
    with pytest.raises(ValueError):
        clock.source_named("kernel")


def test_chronyc_tracking_line():
    s = parse_chronyc_tracking(LINE, 42)
    assert (s.at_ns, s.source, s.synced, s.leap) == (42, clock.SOURCE_CHRONY, True, 0)
    assert s.offset_ns == 2_004  # "System time" -2004 ns: the clock is 2004 ns fast
    assert s.error_bound_ns == 2_004 + 1_670 + 6_488 // 2
    assert "stratum=9" in s.detail


@pytest.mark.parametrize("line", [
    "", "1,2,3", LINE.replace("Normal", "Sometimes"), LINE.replace("7F000001", "7F0001"),
    LINE.replace("-0.000002004", "soon"),
])
def test_chronyc_garbage_is_refused(line):
    with pytest.raises(ValueError):
        parse_chronyc_tracking(line, 0)


def test_chronyc_not_synchronised():
    s = parse_chronyc_tracking(LINE.replace("Normal", "Not synchronised"), 0)
    assert not s.synced and s.leap == 3
    s = parse_chronyc_tracking("00000000,,0" + LINE[LINE.index(",1795"):], 0)
    assert not s.synced


def test_chrony_source_runs_the_command_and_survives_its_failure():
    ok = ChronyClockStatus([sys.executable, "-c", f"print({LINE.strip()!r})"])()
    assert ok.source == clock.SOURCE_CHRONY and ok.offset_ns == 2_004
    bad = ChronyClockStatus(["/nonexistent/chronyc", "-c", "tracking"])()
    assert bad.source == clock.SOURCE_UNKNOWN and "chronyc" in bad.detail
