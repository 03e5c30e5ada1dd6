"""The host's clock status, sent to the collector in Clock frames.

By default (:func:`detect`) the exporter reads what keeps this host's clock in the order
the Rust probe does (``hoptrace_clock::this_host``): chronyd if ``chronyc -n -c
tracking`` answers, else ptp4l if ``pmc`` answers on its default socket
(``/var/run/ptp4l``, domain 0), else the kernel's NTP state (``adjtimex``, read through
:mod:`ctypes` from the C library, changing nothing). Detection runs once per process; the
source found is then read for every Clock frame. Where the C library has no ``adjtimex``
(not Linux), the last resort is :class:`UnknownClockStatus`, with the reason in its
detail. Any callable returning a :class:`~hoptrace_probe.protocol.Clock` can be given to
the exporter instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import subprocess
import tempfile
import threading
import time
from decimal import Decimal, InvalidOperation
from itertools import count
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .protocol import Clock

SOURCE_UNKNOWN, SOURCE_KERNEL, SOURCE_CHRONY, SOURCE_PTP, SOURCE_INJECTED = 0, 1, 2, 3, 4
"""Wire codes of the clock source."""
LEAP_NONE, LEAP_INSERT, LEAP_DELETE, LEAP_UNSYNCHRONISED = 0, 1, 2, 3
"""Wire codes of the leap state."""

ClockStatusSource = Callable[[], Clock]
"""Something that tells the host's clock status now; the exporter calls it."""

log = logging.getLogger("hoptrace_probe")

_LOCAL_REF_ID = 0x7F7F0101  # chronyd serving its own clock (`local` directive)
_CHRONY_LEAP = {"Normal": LEAP_NONE, "Insert second": LEAP_INSERT,
                "Delete second": LEAP_DELETE, "Not synchronised": LEAP_UNSYNCHRONISED}
# Searched after PATH, as the Rust probe does: pmc lives in /usr/sbin, which a user's PATH
# often lacks.
_EXTRA_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")


def now_ns() -> int:
    """CLOCK_REALTIME in nanoseconds since the Unix epoch (``time.time_ns()``)."""
    return time.time_ns()


def find_program(name: str) -> str:
    """The path of ``name`` on ``PATH`` or in the sbin directories; ``name`` itself when
    not found (running it then fails with a clear "not found")."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for d in (*dirs, *_EXTRA_DIRS):
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return name


def _run(command: Sequence[str], timeout_s: float) -> str:
    """Runs a command; its standard output when it exits 0. Raises ``OSError`` (cannot
    start), ``subprocess.TimeoutExpired`` or ``ValueError`` (failed, with what it said)."""
    r = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        said = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise ValueError(f"exit {r.returncode}: {said[0] if said else 'no output'}")
    return r.stdout


def _why(e: BaseException) -> str:
    if isinstance(e, subprocess.TimeoutExpired):
        return f"no answer within {e.timeout} s"
    if isinstance(e, FileNotFoundError):
        return f"not installed ({e.filename or e})"
    return str(e)


class UnknownClockStatus:
    """Nothing is known about the clock (source ``unknown``, not synced, error bound 0
    because none is known); ``detail`` says why."""

    def __init__(self, detail: str = "no clock status source") -> None:
        self.detail = detail

    def __call__(self) -> Clock:
        return Clock(now_ns(), SOURCE_UNKNOWN, False, LEAP_UNSYNCHRONISED, 0, 0, self.detail[:1024])


class StaticClockStatus:
    """A fixed status stamped with the time of each reading (tests, or a host whose
    status is known from elsewhere)."""

    def __init__(self, source: int = SOURCE_INJECTED, synced: bool = True, leap: int = LEAP_NONE,
                 offset_ns: int = 0, error_bound_ns: int = 0, detail: str = "") -> None:
        self.status = Clock(0, source, synced, leap, offset_ns, error_bound_ns, detail)

    def __call__(self) -> Clock:
        s = self.status
        return Clock(now_ns(), s.source, s.synced, s.leap, s.offset_ns, s.error_bound_ns, s.detail)


# ---------------------------------------------------------------------------------------
# chronyd


class ChronyClockStatus:
    """chronyd's view of the system clock, by running ``chronyc -n -c tracking``.

    Offset is positive when the system clock is ahead (the negation of chronyc's "System
    time"); the error bound is ``|system time| + root dispersion + root delay / 2``. When
    chronyc fails, the status is source ``chrony``, not synchronised, with the failure in
    ``detail`` (as the Rust probe's ``ChronyStatus``).
    """

    def __init__(self, command: Optional[Sequence[str]] = None, timeout_s: float = 2.0) -> None:
        self.command = list(command) if command else [find_program("chronyc"), "-n", "-c", "tracking"]
        self.timeout_s = timeout_s

    def query(self) -> Clock:
        """The status now; raises (``OSError``, ``ValueError``, ``TimeoutExpired``) when
        chronyc cannot be run, fails or prints something unreadable."""
        return parse_chronyc_tracking(_run(self.command, self.timeout_s), now_ns())

    def __call__(self) -> Clock:
        try:
            return self.query()
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            return Clock(now_ns(), SOURCE_CHRONY, False, LEAP_UNSYNCHRONISED, 0, 0,
                         f"chronyc -c tracking: {_why(e)}"[:1024])


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


# ---------------------------------------------------------------------------------------
# ptp4l through pmc

_PMC_REQUESTS = ("GET TIME_STATUS_NP", "GET PORT_DATA_SET", "GET CURRENT_DATA_SET",
                 "GET TIME_PROPERTIES_DATA_SET")
_PORT_STATES = ("INITIALIZING", "FAULTY", "DISABLED", "LISTENING", "PRE_MASTER", "MASTER",
                "PASSIVE", "UNCALIBRATED", "SLAVE", "GRAND_MASTER")


class PmcAnswer(NamedTuple):
    """One answer printed by ``pmc``: its header and its ``name value`` fields."""

    port_identity: str
    sequence: int
    action: str
    kind: str
    id: str
    fields: List[Tuple[str, str]]

    def field(self, name: str) -> Optional[str]:
        """The value of field ``name``."""
        return next((v for n, v in self.fields if n == name), None)


def parse_pmc_answers(output: str) -> List[PmcAnswer]:
    """Everything ``pmc`` printed, as its answers in order; ``sending: ...`` lines and
    pmc's own remarks are skipped. Raises ``ValueError`` for a field before any header or
    a malformed header."""
    answers: List[PmcAnswer] = []
    for raw in output.splitlines():
        if not raw.strip():
            continue
        if raw.startswith("\t\t"):
            if not answers:
                raise ValueError(f"pmc: field before any answer: {raw!r}")
            parts = raw.strip().split(None, 1)
            answers[-1].fields.append((parts[0], parts[1].strip() if len(parts) > 1 else ""))
        elif raw.startswith("\t"):
            t = raw.split()
            if len(t) < 5 or t[1] != "seq" or not t[2].isdigit():
                raise ValueError(f"pmc: cannot read line {raw!r}")
            answers.append(PmcAnswer(t[0], int(t[2]), t[3], t[4], t[5] if len(t) > 5 else "", []))
    return answers


class PtpReading(NamedTuple):
    """What ptp4l said in one ``pmc`` run (see the Rust probe's ``PtpReading``)."""

    master_offset_ns: int
    gm_present: bool
    gm_identity: str
    port_states: List[str]
    peer_mean_path_delays_ns: List[int]
    mean_path_delay_ns: Optional[int]
    steps_removed: Optional[int]
    leap61: bool
    leap59: bool
    time_source: Optional[int]
    time_traceable: Optional[bool]

    def path_delay_ns(self) -> Optional[int]:
        """``CURRENT_DATA_SET``'s ``meanPathDelay``, else a slave port's
        ``peerMeanPathDelay``; ``None`` when neither is known (non-zero)."""
        if self.mean_path_delay_ns:
            return self.mean_path_delay_ns
        for state, d in zip(self.port_states, self.peer_mean_path_delays_ns):
            if state == "SLAVE" and d:
                return d
        return None

    def error_bound_ns(self) -> int:
        """``|master_offset| + mean path delay`` (the delay only when known)."""
        return abs(self.master_offset_ns) + abs(self.path_delay_ns() or 0)

    def port_state(self) -> Optional[str]:
        """The first port in ``SLAVE`` or ``UNCALIBRATED``, else the first port's state."""
        for s in self.port_states:
            if s in ("SLAVE", "UNCALIBRATED"):
                return s
        return self.port_states[0] if self.port_states else None

    def synced(self) -> bool:
        """A grandmaster is present and a port is ``SLAVE`` (``gmPresent`` alone when no
        port state was answered)."""
        return self.gm_present and (not self.port_states or "SLAVE" in self.port_states)

    def to_status(self, at_ns: int) -> Clock:
        synced = self.synced()
        if not synced:
            leap = LEAP_UNSYNCHRONISED
        elif self.leap61:
            leap = LEAP_INSERT
        elif self.leap59:
            leap = LEAP_DELETE
        else:
            leap = LEAP_NONE
        delay = self.path_delay_ns()
        detail = (f"gm={self.gm_identity} gm_present={str(self.gm_present).lower()} "
                  f"port={self.port_state() or 'unknown'} master_offset_ns={self.master_offset_ns} "
                  f"mean_path_delay_ns={delay if delay is not None else 'unknown'}")
        if self.steps_removed is not None:
            detail += f" steps_removed={self.steps_removed}"
        if self.time_source is not None:
            detail += f" time_source={self.time_source:#04x} traceable={str(self.time_traceable).lower()}"
        if not self.gm_present and self.port_state() == "MASTER":
            detail += " (this host is the grandmaster)"
        return Clock(at_ns, SOURCE_PTP, synced, leap, self.master_offset_ns, self.error_bound_ns(), detail)


def _int(a: PmcAnswer, name: str) -> int:
    v = a.field(name)
    if v is None:
        raise ValueError(f"pmc: {a.id} has no field {name!r}")
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"pmc: field {name!r} is {v!r}, expected an integer") from None


def _fixed_ns(a: PmcAnswer, name: str) -> int:
    v = a.field(name)
    if v is None:
        raise ValueError(f"pmc: {a.id} has no field {name!r}")
    try:
        return int(Decimal(v))
    except InvalidOperation:
        raise ValueError(f"pmc: field {name!r} is {v!r}, expected nanoseconds") from None


def _flag(a: PmcAnswer, name: str) -> bool:
    v = a.field(name)
    if v not in ("0", "1"):
        raise ValueError(f"pmc: field {name!r} is {v!r}, expected 0 or 1")
    return v == "1"


def parse_pmc_reading(output: str) -> PtpReading:
    """The output of ``pmc`` asked for ``TIME_STATUS_NP`` and, optionally,
    ``PORT_DATA_SET``, ``CURRENT_DATA_SET`` and ``TIME_PROPERTIES_DATA_SET``.

    Raises ``LookupError`` when there is no ``TIME_STATUS_NP`` answer (ptp4l is not
    there, or uses another domain), ``ValueError`` naming a malformed field.
    """
    answers = [a for a in parse_pmc_answers(output) if a.kind == "MANAGEMENT"]
    ts = next((a for a in answers if a.id == "TIME_STATUS_NP"), None)
    if ts is None:
        raise LookupError("pmc printed no TIME_STATUS_NP answer (is ptp4l running on that "
                          "socket and domain?)")
    gm_present = ts.field("gmPresent")
    if gm_present not in ("true", "false"):
        raise ValueError(f"pmc: field 'gmPresent' is {gm_present!r}, expected true or false")
    gm_identity = ts.field("gmIdentity")
    if gm_identity is None:
        raise ValueError("pmc: TIME_STATUS_NP has no field 'gmIdentity'")
    states, peer_delays = [], []
    for a in answers:
        if a.id != "PORT_DATA_SET":
            continue
        state = a.field("portState")
        if state not in _PORT_STATES:
            raise ValueError(f"pmc: field 'portState' is {state!r}, expected a port state such as SLAVE")
        states.append(state)
        peer_delays.append(_int(a, "peerMeanPathDelay"))
    cur = next((a for a in answers if a.id == "CURRENT_DATA_SET"), None)
    tp = next((a for a in answers if a.id == "TIME_PROPERTIES_DATA_SET"), None)
    time_source = None
    if tp is not None:
        src = tp.field("timeSource") or ""
        try:
            time_source = int(src[2:], 16) if src.startswith("0x") else None
        except ValueError:
            time_source = None
        if time_source is None or not 0 <= time_source <= 255:
            raise ValueError(f"pmc: field 'timeSource' is {src!r}, expected a hex byte such as 0xa0")
    return PtpReading(
        master_offset_ns=_int(ts, "master_offset"),
        gm_present=gm_present == "true",
        gm_identity=gm_identity,
        port_states=states,
        peer_mean_path_delays_ns=peer_delays,
        mean_path_delay_ns=_fixed_ns(cur, "meanPathDelay") if cur else None,
        steps_removed=_int(cur, "stepsRemoved") if cur else None,
        leap61=_flag(tp, "leap61") if tp else False,
        leap59=_flag(tp, "leap59") if tp else False,
        time_source=time_source,
        time_traceable=_flag(tp, "timeTraceable") if tp else None,
    )


_pmc_queries = count()


class PtpClockStatus:
    """ptp4l's view of the clock, by running ``pmc -u -b 0 -d DOMAIN -s SOCKET -i CLIENT
    'GET TIME_STATUS_NP' 'GET PORT_DATA_SET' 'GET CURRENT_DATA_SET' 'GET
    TIME_PROPERTIES_DATA_SET'`` (pmc's own socket in the temporary directory, so a user
    allowed on ptp4l's socket needs no other rights).

    Synchronised, offset and error bound as the Rust probe's ``PtpStatus``: a grandmaster
    present and a port ``SLAVE``; bound ``|master_offset| + mean path delay``. When pmc
    fails or ptp4l does not answer, the status is source ``ptp4l``, not synchronised, with
    the reason in ``detail``.
    """

    def __init__(self, socket_path: str = "/var/run/ptp4l", domain: int = 0,
                 pmc: Optional[str] = None, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.domain = domain
        self.pmc = pmc or find_program("pmc")
        self.timeout_s = timeout_s

    def query(self) -> PtpReading:
        """What ptp4l reports now; raises (``OSError``, ``ValueError``, ``LookupError``,
        ``TimeoutExpired``) when it cannot be read."""
        client = os.path.join(tempfile.gettempdir(),
                              f"hoptrace-pmc.{os.getpid()}.{next(_pmc_queries)}")
        try:
            out = _run([self.pmc, "-u", "-b", "0", "-d", str(self.domain), "-s", self.socket_path,
                        "-i", client, *_PMC_REQUESTS], self.timeout_s)
        finally:
            # pmc removes its socket on exit; not when killed on a timeout.
            try:
                os.unlink(client)
            except OSError:
                pass
        return parse_pmc_reading(out)

    def __call__(self) -> Clock:
        where = f"uds={self.socket_path} domain={self.domain}"
        try:
            s = self.query().to_status(now_ns())
            s.detail = f"{s.detail} {where}"[:1024]
            return s
        except (OSError, subprocess.SubprocessError, ValueError, LookupError) as e:
            return Clock(now_ns(), SOURCE_PTP, False, LEAP_UNSYNCHRONISED, 0, 0,
                         f"pmc: {_why(e)} ({where})"[:1024])


# ---------------------------------------------------------------------------------------
# The kernel (adjtimex)

# struct timex of <sys/timex.h> (Linux): what ntp_adjtime/adjtimex fill in.
class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    _fields_ = [
        ("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
        ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
        ("time", _Timeval), ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long), ("shift", ctypes.c_int), ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
        ("_reserved", ctypes.c_int * 11),
    ]


_TIME_INS, _TIME_DEL, _TIME_ERROR = 1, 2, 5
_STA_UNSYNC, _STA_NANO = 0x0040, 0x2000


class KernelReading(NamedTuple):
    """The fields of one ``adjtimex`` read that the status uses."""

    state: int
    status: int
    offset: int
    maxerror_us: int
    esterror_us: int


def kernel_status_of(r: KernelReading, at_ns: int) -> Clock:
    """The status of a kernel reading, as the Rust probe's ``kernel_status``: synchronised
    unless ``STA_UNSYNC`` or ``TIME_ERROR``; error bound ``maxerror`` (µs) in ns; offset
    in ns (µs unless ``STA_NANO``)."""
    unsync = bool(r.status & _STA_UNSYNC) or r.state == _TIME_ERROR
    if unsync:
        leap = LEAP_UNSYNCHRONISED
    elif r.state == _TIME_INS:
        leap = LEAP_INSERT
    elif r.state == _TIME_DEL:
        leap = LEAP_DELETE
    else:
        leap = LEAP_NONE
    offset_ns = r.offset if r.status & _STA_NANO else r.offset * 1000
    return Clock(at_ns, SOURCE_KERNEL, not unsync, leap, offset_ns, max(0, r.maxerror_us) * 1000,
                 f"state={r.state} status={r.status:#x} maxerror_us={r.maxerror_us} "
                 f"esterror_us={r.esterror_us}")


class KernelClockStatus:
    """The kernel's NTP state through the C library's ``ntp_adjtime`` (or ``adjtimex``)
    with ``modes`` 0: read only, changes nothing. The error bound is the kernel's
    ``maxerror``, which a sync daemon keeps current and the kernel grows by 500 ppm while
    nothing does.

    Raises ``OSError`` at construction where the C library has neither function.
    """

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = getattr(libc, "ntp_adjtime", None) or getattr(libc, "adjtimex", None)
        if fn is None:
            raise OSError("the C library has no ntp_adjtime or adjtimex")
        fn.argtypes = [ctypes.POINTER(_Timex)]
        fn.restype = ctypes.c_int
        self._fn = fn

    def read(self) -> KernelReading:
        """One read of the kernel's state; raises ``OSError`` when the call fails."""
        tx = _Timex()  # zeroed: modes 0 asks only to read
        state = self._fn(ctypes.byref(tx))
        if state < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"ntp_adjtime failed: {os.strerror(e)}")
        return KernelReading(state, tx.status, tx.offset, tx.maxerror, tx.esterror)

    def __call__(self) -> Clock:
        try:
            return kernel_status_of(self.read(), now_ns())
        except OSError as e:
            return Clock(now_ns(), SOURCE_KERNEL, False, LEAP_UNSYNCHRONISED, 0, 0, str(e)[:1024])


# ---------------------------------------------------------------------------------------
# Detection


class Detected(NamedTuple):
    """What :func:`detect` chose, and why each earlier candidate was passed over."""

    source: ClockStatusSource
    name: str
    """``chrony``, ``ptp``, ``kernel`` or ``unknown`` (the names of the wire codes)."""
    passed_over: Dict[str, str]
    """Candidate name to the reason it was not used."""


def detect(chrony: Optional[ChronyClockStatus] = None,
           ptp: Optional[PtpClockStatus] = None) -> Detected:
    """Asks each candidate once, in the Rust probe's order: chronyd, ptp4l, the kernel;
    the first that answers is the source. When even the kernel cannot be read (no
    ``adjtimex``), the source is :class:`UnknownClockStatus` naming every reason."""
    chrony = chrony or ChronyClockStatus()
    ptp = ptp or PtpClockStatus()
    why: Dict[str, str] = {}
    try:
        chrony.query()
        return Detected(chrony, "chrony", why)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        why["chrony"] = f"chronyc -c tracking: {_why(e)}"
    try:
        ptp.query()
        return Detected(ptp, "ptp", why)
    except (OSError, subprocess.SubprocessError, ValueError, LookupError) as e:
        why["ptp"] = f"pmc: {_why(e)}"
    try:
        kernel = KernelClockStatus()
        kernel.read()
        return Detected(kernel, "kernel", why)
    except OSError as e:
        why["kernel"] = f"adjtimex: {e}"
    return Detected(UnknownClockStatus("no clock status source: " + "; ".join(why.values())),
                    "unknown", why)


_detected: Optional[Detected] = None
_detect_lock = threading.Lock()


def this_host() -> Detected:
    """:func:`detect` with the default programs and sockets, once per process: every
    exporter of a process reports the same host's clock."""
    global _detected
    with _detect_lock:
        if _detected is None:
            _detected = detect()
            log.info("hoptrace clock status source: %s%s", _detected.name,
                     "".join(f" ({k} not used: {v})" for k, v in _detected.passed_over.items()))
        return _detected


def source_named(name: Optional[str]) -> ClockStatusSource:
    """The clock status source of that name: ``"auto"`` (or ``None``, the default: see
    :func:`this_host`), ``"chrony"``, ``"ptp"`` (ptp4l), ``"kernel"`` or ``"unknown"``."""
    if name in (None, "", "auto"):
        return this_host().source
    if name == "chrony":
        return ChronyClockStatus()
    if name in ("ptp", "ptp4l"):
        return PtpClockStatus()
    if name == "kernel":
        return KernelClockStatus()
    if name == "unknown":
        return UnknownClockStatus("clock status source 'unknown' was chosen")
    raise ValueError(f"clock status source {name!r}: expected 'auto', 'chrony', 'ptp', "
                     f"'kernel' or 'unknown'")
