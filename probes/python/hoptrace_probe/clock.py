"""The host's clock status, sent to the collector in Clock frames.

Pure Python cannot read the kernel's NTP state (``adjtimex``) without native code, so the
default source, :class:`UnknownClockStatus`, says so: source ``unknown``, not
synchronised. :class:`ChronyClockStatus` (opt in) runs ``chronyc -n -c tracking`` and
reports chronyd's offset and error bound. Any callable returning a
:class:`~hoptrace_probe.protocol.Clock` can be given to the exporter instead.
"""

from __future__ import annotations

import subprocess
import time
from decimal import Decimal, InvalidOperation
from typing import Callable, Optional, Sequence

from .protocol import Clock

SOURCE_UNKNOWN, SOURCE_KERNEL, SOURCE_CHRONY, SOURCE_PTP, SOURCE_INJECTED = 0, 1, 2, 3, 4
"""Wire codes of the clock source."""
LEAP_NONE, LEAP_INSERT, LEAP_DELETE, LEAP_UNSYNCHRONISED = 0, 1, 2, 3
"""Wire codes of the leap state."""

ClockStatusSource = Callable[[], Clock]
"""Something that tells the host's clock status now; the exporter calls it."""

_LOCAL_REF_ID = 0x7F7F0101  # chronyd serving its own clock (`local` directive)
_CHRONY_LEAP = {"Normal": LEAP_NONE, "Insert second": LEAP_INSERT,
                "Delete second": LEAP_DELETE, "Not synchronised": LEAP_UNSYNCHRONISED}


def now_ns() -> int:
    """CLOCK_REALTIME in nanoseconds since the Unix epoch (``time.time_ns()``)."""
    return time.time_ns()


class UnknownClockStatus:
    """The default: nothing is known about the clock (source ``unknown``, not synced,
    error bound 0 because none is known)."""

    def __init__(self, detail: str = "not read: the Python probe reads no clock state "
                                     "unless told to (ChronyClockStatus)") -> None:
        self.detail = detail

    def __call__(self) -> Clock:
        return Clock(now_ns(), SOURCE_UNKNOWN, False, LEAP_UNSYNCHRONISED, 0, 0, self.detail)


class StaticClockStatus:
    """A fixed status stamped with the time of each reading (tests, or a host whose
    status is known from elsewhere)."""

    def __init__(self, source: int = SOURCE_INJECTED, synced: bool = True, leap: int = LEAP_NONE,
                 offset_ns: int = 0, error_bound_ns: int = 0, detail: str = "") -> None:
        self.status = Clock(0, source, synced, leap, offset_ns, error_bound_ns, detail)

    def __call__(self) -> Clock:
        s = self.status
        return Clock(now_ns(), s.source, s.synced, s.leap, s.offset_ns, s.error_bound_ns, s.detail)


class ChronyClockStatus:
    """chronyd's view of the system clock, by running ``chronyc -n -c tracking``.

    Offset is positive when the system clock is ahead (the negation of chronyc's "System
    time"); the error bound is ``|system time| + root dispersion + root delay / 2``. When
    chronyc fails, the status is ``unknown`` with the failure in ``detail``.
    """

    def __init__(self, command: Sequence[str] = ("chronyc", "-n", "-c", "tracking"),
                 timeout_s: float = 2.0) -> None:
        self.command = list(command)
        self.timeout_s = timeout_s

    def __call__(self) -> Clock:
        try:
            out = subprocess.run(self.command, capture_output=True, text=True,
                                 timeout=self.timeout_s, check=True).stdout
            return parse_chronyc_tracking(out, now_ns())
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            return UnknownClockStatus(f"chronyc -c tracking: {e}"[:1024])()


def _seconds_ns(text: str, field: str) -> int:
    try:
        return int(Decimal(text) * 1_000_000_000)
    except InvalidOperation:
        raise ValueError(f"{field}: {text!r} is not seconds") from None


def parse_chronyc_tracking(output: str, at_ns: int) -> Clock:
    """The status of one ``chronyc -c tracking`` line (14 comma-separated fields).

    Raises ``ValueError`` naming the field that is missing or malformed.
    """
    line = next((ln.strip() for ln in output.splitlines() if ln.strip()), None)
    if line is None:
        raise ValueError("chronyc printed nothing")
    f = line.split(",")
    if len(f) != 14:
        raise ValueError(f"expected 14 fields, found {len(f)}: {line!r}")
    if len(f[0]) != 8:
        raise ValueError(f"Reference ID: {f[0]!r} is not 8 hex digits")
    ref_id = int(f[0], 16)
    stratum = int(f[2])
    system_time_ns = _seconds_ns(f[4], "System time")
    root_delay_ns = _seconds_ns(f[10], "Root delay")
    root_dispersion_ns = _seconds_ns(f[11], "Root dispersion")
    if root_delay_ns < 0 or root_dispersion_ns < 0:
        raise ValueError("negative root delay or dispersion")
    if f[13] not in _CHRONY_LEAP:
        raise ValueError(f"Leap status: {f[13]!r}")
    leap = _CHRONY_LEAP[f[13]]
    synced = leap != LEAP_UNSYNCHRONISED and stratum < 16 and ref_id != 0
    name = f[1] or ("local clock" if ref_id == _LOCAL_REF_ID else "-")
    return Clock(
        at_ns=at_ns,
        source=SOURCE_CHRONY,
        synced=synced,
        leap=leap if synced else LEAP_UNSYNCHRONISED,
        offset_ns=-system_time_ns,
        error_bound_ns=abs(system_time_ns) + root_dispersion_ns + root_delay_ns // 2,
        detail=f"ref={ref_id:08X} ({name}) stratum={stratum} root_delay_ns={root_delay_ns} "
               f"root_dispersion_ns={root_dispersion_ns} leap={f[13]}",
    )


def source_named(name: Optional[str]) -> ClockStatusSource:
    """``"unknown"`` (or ``None``) or ``"chrony"``: the clock status source of that name."""
    if name in (None, "", "unknown"):
        return UnknownClockStatus()
    if name == "chrony":
        return ChronyClockStatus()
    raise ValueError(f"clock status source {name!r}: expected 'unknown' or 'chrony'")
