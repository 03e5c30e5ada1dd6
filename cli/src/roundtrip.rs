//! The options of `hoptrace roundtrip`.

use std::path::PathBuf;

use hoptrace_format::units;

/// Options of `hoptrace roundtrip`.
#[derive(Debug, clap::Args)]
pub struct RoundtripArgs {
    /// Messages to send.
    #[arg(long, default_value = "200k", value_parser = units::parse_count)]
    pub messages: u64,
    /// Target rate, metrics per second (open loop), as in every command: messages go out
    /// at --rate / --metrics-per-message per second.
    #[arg(long, allow_negative_numbers = true, default_value = "50k", value_parser = units::parse_rate)]
    pub rate: f64,
    /// Streams the messages are spread over.
    #[arg(long, allow_negative_numbers = true, default_value_t = 100)]
    pub streams: u32,
    /// Metrics carried per message.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1)]
    pub metrics_per_message: u32,
    /// Hops in order; a stage is measured between each pair of neighbours, and in total.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "publish,broker,flow_in,flow_out,store_in"
    )]
    pub hops: Vec<String>,
    /// Simulate a skewed clock on the last hop's host (`-2ms`: behind, `+500us`: ahead).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = units::parse_signed_duration_ns, conflicts_with = "last_hop_skew_ns")]
    pub last_hop_skew: Option<i64>,
    /// The same in plain nanoseconds (the older spelling).
    #[arg(long, hide = true, allow_hyphen_values = true)]
    pub last_hop_skew_ns: Option<i64>,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// Folder under which the run directory is written.
    #[arg(long, alias = "out", value_name = "DIR", default_value = "runs")]
    pub runs: PathBuf,
}

impl RoundtripArgs {
    /// The skew of the last hop's clock, ns.
    #[must_use]
    pub fn skew_ns(&self) -> i64 {
        self.last_hop_skew.or(self.last_hop_skew_ns).unwrap_or(0)
    }

    /// Messages per second.
    #[must_use]
    pub fn message_rate(&self) -> f64 {
        self.rate / f64::from(self.metrics_per_message.max(1))
    }
}
