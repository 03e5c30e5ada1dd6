"""Clock status sources and their detection: chronyd, else ptp4l, else the kernel (the
Rust probe's order), with stub chronyc and pmc programs on PATH; the parsers against the
output captured from the real programs (probe/testdata/clock/); and one check of the real
host."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hoptrace_probe import clock
from hoptrace_probe.clock import (ChronyClockStatus, KernelClockStatus, KernelReading, PtpClockStatus,
                                  UnknownClockStatus, detect, kernel_status_of, parse_chronyc_tracking,
                                  parse_pmc_reading)

CLOCK_DATA = Path(__file__).resolve().parents[3] / "probe" / "testdata" / "clock"
LINE = ("7F000001,127.0.0.1,9,1795335480.242007074,-0.000002004,0.000000007,0.000000029,"
        "-0.066,0.008,0.511,0.000006488,0.000001670,0.0,Normal\n")
SLAVE = (CLOCK_DATA / "pmc-slave-free-running.txt").read_text()
GRANDMASTER = (CLOCK_DATA / "pmc-grandmaster.txt").read_text()
NO_ANSWER = (CLOCK_DATA / "pmc-no-answer.txt").read_text()


def test_unknown_says_why():
    s = UnknownClockStatus("because")()
    assert (s.source, s.synced, s.leap, s.offset_ns, s.error_bound_ns) == (0, False, 3, 0, 0)
    assert s.detail == "because" and s.at_ns > 0
    assert isinstance(clock.source_named("chrony"), ChronyClockStatus)
    assert isinstance(clock.source_named("ptp"), PtpClockStatus)
    assert isinstance(clock.source_named("kernel"), KernelClockStatus)
    assert isinstance(clock.source_named("unknown"), UnknownClockStatus)
    with pytest.raises(ValueError):
        clock.source_named("ntpd")


# ------------------------------------------------------------------------------- chrony

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


@pytest.mark.parametrize("name", ["chronyc-tracking-synced.csv", "chronyc-tracking-unsynchronised.csv",
                                  "chronyc-tracking-local-stratum8.csv"])
def test_chronyc_output_captured_from_chrony(name):
    s = parse_chronyc_tracking((CLOCK_DATA / name).read_text(), 1)
    assert s.source == clock.SOURCE_CHRONY
    assert s.synced == ("unsynchronised" not in name)


def test_chrony_source_runs_the_command_and_survives_its_failure():
    ok = ChronyClockStatus([sys.executable, "-c", f"print({LINE.strip()!r})"])()
    assert ok.source == clock.SOURCE_CHRONY and ok.offset_ns == 2_004
    bad = ChronyClockStatus(["/nonexistent/chronyc", "-c", "tracking"])()
    assert (bad.source, bad.synced) == (clock.SOURCE_CHRONY, False)
    assert "chronyc" in bad.detail and "not installed" in bad.detail


# ------------------------------------------------------------------------------- ptp4l

def test_pmc_free_running_slave():
    # Captured from a ptp4l slave with free_running 1 following a grandmaster over a veth
    # pair: measured, never locked.
    r = parse_pmc_reading(SLAVE)
    assert (r.master_offset_ns, r.gm_present, r.gm_identity) == (-105, True, "02c9c1.fffe.736ac7")
    assert r.port_states == ["UNCALIBRATED"] and r.path_delay_ns() == 2899
    assert r.error_bound_ns() == 105 + 2899 and not r.synced()
    s = r.to_status(7)
    assert (s.at_ns, s.source, s.synced, s.leap, s.offset_ns, s.error_bound_ns) == \
        (7, clock.SOURCE_PTP, False, clock.LEAP_UNSYNCHRONISED, -105, 3004)
    assert "gm=02c9c1.fffe.736ac7" in s.detail and "port=UNCALIBRATED" in s.detail


def test_pmc_locked_slave_is_synced_and_carries_the_leap():
    locked = SLAVE.replace("UNCALIBRATED", "SLAVE").replace("leap61                0",
                                                            "leap61                1")
    s = parse_pmc_reading(locked).to_status(0)
    assert s.synced and s.leap == clock.LEAP_INSERT


def test_pmc_grandmaster_is_not_synchronised_by_ptp():
    r = parse_pmc_reading(GRANDMASTER)
    assert not r.gm_present and r.port_state() == "MASTER" and not r.synced()
    assert "this host is the grandmaster" in r.to_status(0).detail


def test_pmc_without_ptp4l_answers_nothing():
    with pytest.raises(LookupError):
        parse_pmc_reading(NO_ANSWER)


@pytest.mark.parametrize("broken", [
    SLAVE.replace("gmPresent                  true", "gmPresent                  maybe"),
    SLAVE.replace("UNCALIBRATED", "DAYDREAMING"),
    SLAVE.replace("\t72da0c.fffe.780cea-0 seq 0", "\t72da0c.fffe.780cea-0 sequence 0"),
    "\t\tmaster_offset -105\n",
])
def test_pmc_garbage_is_refused(broken):
    with pytest.raises(ValueError):
        parse_pmc_reading(broken)


# ------------------------------------------------------------------------------- kernel

def test_kernel_reading_to_status():
    ok = kernel_status_of(KernelReading(state=0, status=0x2001, offset=-1500, maxerror_us=250,
                                        esterror_us=10), 5)
    assert (ok.source, ok.synced, ok.leap, ok.offset_ns, ok.error_bound_ns) == \
        (clock.SOURCE_KERNEL, True, clock.LEAP_NONE, -1500, 250_000)  # STA_NANO: ns already
    us = kernel_status_of(KernelReading(1, 0x1, -15, 1, 0), 5)
    assert (us.offset_ns, us.leap) == (-15_000, clock.LEAP_INSERT)
    assert kernel_status_of(KernelReading(2, 0x1, 0, 1, 0), 5).leap == clock.LEAP_DELETE
    unsync = kernel_status_of(KernelReading(5, 0x40, 0, 16_000_000, 16_000_000), 5)
    assert (unsync.synced, unsync.leap, unsync.error_bound_ns) == \
        (False, clock.LEAP_UNSYNCHRONISED, 16_000_000_000)
    assert "maxerror_us=16000000" in unsync.detail


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="adjtimex is Linux's")
def test_kernel_is_read_through_ctypes():
    r = KernelClockStatus().read()
    assert r.state in range(6) and r.maxerror_us >= 0
    s = KernelClockStatus()()
    assert s.source == clock.SOURCE_KERNEL and s.detail.startswith(f"state={r.state} ")


# ------------------------------------------------------------------------------- detection

def stub(directory: Path, name: str, script: str) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def stubs(tmp_path, monkeypatch):
    """A PATH holding only the stub directory (and what /bin/sh needs)."""
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}/usr/bin{os.pathsep}/bin")
    return d


CHRONY_DOWN = 'echo "506 Cannot talk to daemon" >&2; exit 1\n'
PMC_NOBODY = 'for r in "$@"; do case $r in GET*) echo "sending: $r";; esac; done; exit 0\n'


def test_detect_prefers_chronyd(stubs):
    stub(stubs, "chronyc", f"printf '%s\\n' '{LINE.strip()}'\n")
    stub(stubs, "pmc", f"cat <<'EOF'\n{SLAVE}EOF\n")
    d = detect()
    assert d.name == "chrony" and d.passed_over == {}
    s = d.source()
    assert s.source == clock.SOURCE_CHRONY and s.offset_ns == 2_004


def test_detect_falls_back_to_ptp4l_and_asks_it_as_the_rust_probe_does(stubs, tmp_path):
    stub(stubs, "chronyc", CHRONY_DOWN)
    argv = tmp_path / "pmc-argv"
    stub(stubs, "pmc", f'printf "%s\\n" "$@" > {argv}\ncat <<\'EOF\'\n{SLAVE}EOF\n')
    d = detect()
    assert d.name == "ptp"
    assert d.passed_over == {"chrony": "chronyc -c tracking: exit 1: 506 Cannot talk to daemon"}
    s = d.source()
    assert (s.source, s.offset_ns, s.error_bound_ns) == (clock.SOURCE_PTP, -105, 3004)
    assert s.detail.endswith("uds=/var/run/ptp4l domain=0")
    args = argv.read_text().splitlines()
    assert args[:7] == ["-u", "-b", "0", "-d", "0", "-s", "/var/run/ptp4l"]
    assert args[7] == "-i" and "hoptrace-pmc." in args[8]
    assert args[9:] == ["GET TIME_STATUS_NP", "GET PORT_DATA_SET", "GET CURRENT_DATA_SET",
                        "GET TIME_PROPERTIES_DATA_SET"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="adjtimex is Linux's")
def test_detect_falls_back_to_the_kernel(stubs):
    stub(stubs, "chronyc", CHRONY_DOWN)
    stub(stubs, "pmc", PMC_NOBODY)
    d = detect()
    assert d.name == "kernel" and isinstance(d.source, KernelClockStatus)
    assert set(d.passed_over) == {"chrony", "ptp"}
    assert "no TIME_STATUS_NP answer" in d.passed_over["ptp"]
    assert d.source().source == clock.SOURCE_KERNEL


def test_detect_says_unknown_with_every_reason_without_adjtimex(stubs, monkeypatch):
    stub(stubs, "chronyc", CHRONY_DOWN)  # and no pmc at all

    def no_adjtimex(self):
        raise OSError("the C library has no ntp_adjtime or adjtimex")

    monkeypatch.setattr(KernelClockStatus, "__init__", no_adjtimex)
    monkeypatch.setattr(clock, "_EXTRA_DIRS", ())
    d = detect()
    assert d.name == "unknown"
    s = d.source()
    assert (s.source, s.synced, s.error_bound_ns) == (clock.SOURCE_UNKNOWN, False, 0)
    assert "Cannot talk to daemon" in s.detail and "pmc: not installed" in s.detail
    assert "no ntp_adjtime or adjtimex" in s.detail


def test_a_chronyd_that_stops_after_detection_is_reported_unsynchronised(stubs):
    chronyc = stub(stubs, "chronyc", f"printf '%s\\n' '{LINE.strip()}'\n")
    d = detect()
    assert d.name == "chrony"
    chronyc.write_text("#!/bin/sh\n" + CHRONY_DOWN)
    s = d.source()
    assert (s.source, s.synced, s.leap) == (clock.SOURCE_CHRONY, False, clock.LEAP_UNSYNCHRONISED)
    assert "Cannot talk to daemon" in s.detail


def test_this_host_as_documented():
    """The real host: chronyc is installed (infra/setup.sh); whether chronyd answers is
    asked here independently, and the probe must have chosen accordingly: chrony when it
    answers, else ptp4l when pmc gets an answer, else the kernel."""
    chronyc = clock.find_program("chronyc")
    assert os.path.isabs(chronyc), "chronyc is not installed (infra/setup.sh installs chrony)"
    answered = subprocess.run([chronyc, "-n", "-c", "tracking"], capture_output=True, text=True,
                              timeout=5).returncode == 0
    d = detect()
    if answered:
        assert d.name == "chrony", d.passed_over
        return
    assert "chrony" in d.passed_over
    pmc = clock.find_program("pmc")
    ptp_answers = os.path.isabs(pmc) and "TIME_STATUS_NP" in subprocess.run(
        [pmc, "-u", "-b", "0", "GET TIME_STATUS_NP"], capture_output=True, text=True, timeout=5).stdout.replace(
        "sending: GET TIME_STATUS_NP", "")
    if ptp_answers:
        assert d.name == "ptp", d.passed_over
        return
    assert d.name == ("kernel" if sys.platform.startswith("linux") else "unknown"), d.passed_over
    s = d.source()
    assert s.source == (clock.SOURCE_KERNEL if d.name == "kernel" else clock.SOURCE_UNKNOWN)
