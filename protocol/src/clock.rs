//! What a Clock frame says: how well a host's clock is synchronised at one moment.

/// Where a clock status comes from (wire codes of `docs/collector-protocol.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum ClockSource {
    /// Nothing known.
    #[default]
    Unknown = 0,
    /// The kernel's NTP state (`adjtimex`).
    Kernel = 1,
    /// chronyd's tracking report.
    Chrony = 2,
    /// ptp4l / phc2sys, read through `pmc`.
    Ptp = 3,
    /// Set by a test, a simulation or the embedding application.
    Injected = 4,
}

impl ClockSource {
    /// From the wire code; unknown codes read as [`ClockSource::Unknown`].
    #[must_use]
    pub fn from_code(code: u8) -> Self {
        match code {
            1 => Self::Kernel,
            2 => Self::Chrony,
            3 => Self::Ptp,
            4 => Self::Injected,
            _ => Self::Unknown,
        }
    }
    /// Lower-case name, as written to `clock.parquet`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Kernel => "kernel",
            Self::Chrony => "chrony",
            Self::Ptp => "ptp",
            Self::Injected => "injected",
        }
    }
}

/// Leap second state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Leap {
    /// No leap second pending.
    #[default]
    None = 0,
    /// A second will be inserted at the end of the day.
    Insert = 1,
    /// A second will be deleted at the end of the day.
    Delete = 2,
    /// The clock is not synchronised.
    Unsynchronised = 3,
}

impl Leap {
    /// The state's name in `run.json` and `clock.parquet`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Insert => "insert",
            Self::Delete => "delete",
            Self::Unsynchronised => "unsynchronised",
        }
    }

    /// From the wire code; out-of-range codes read as unsynchronised.
    #[must_use]
    pub fn from_code(code: u8) -> Self {
        match code {
            0 => Self::None,
            1 => Self::Insert,
            2 => Self::Delete,
            _ => Self::Unsynchronised,
        }
    }
}

/// How well a host's clock is synchronised at one moment: the body of a Clock frame.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClockStatus {
    /// When this was read (CLOCK_REALTIME ns).
    pub at_ns: i64,
    /// What reported it.
    pub source: ClockSource,
    /// Whether the source considers the clock synchronised.
    pub synced: bool,
    /// Leap second state.
    pub leap: Leap,
    /// Estimated offset of the local clock from the reference, ns.
    pub offset_ns: i64,
    /// Bound on the absolute error of a reading of this clock, ns.
    pub error_bound_ns: u64,
    /// Source-specific detail (reference id, stratum, ...), at most
    /// [`MAX_STRING_LEN`](crate::MAX_STRING_LEN) bytes on the wire.
    pub detail: String,
}
