//! The options of `hoptrace tap`: a broker tap, or a store tap (`--from influxdb://`, ...).

use std::path::PathBuf;
use std::time::Duration;

use hoptrace_broker::url::Carrier;
use hoptrace_format::units::{self, parse_duration};

use crate::argv::{Argv, ToArgs};
use crate::collector::CollectorArgs;
use crate::preflight::PreflightArgs;

mod config;
pub mod text;

/// Parses a carrier of the trace context: `property`, `header` or `envelope`.
pub fn parse_carrier(s: &str) -> Result<Carrier, String> {
    Carrier::parse(s).map_err(|e| e.to_string())
}

/// Which id the reported hop has (shared by publish and tap): from the collector's
/// pipeline spec, or given.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct HopArgs {
    /// The collector's pipeline spec, to look up the hop's id (default: the default
    /// pipeline of `hoptrace generate-config`).
    #[arg(long)]
    pub pipeline: Option<PathBuf>,
    /// The hop's wire id, when the pipeline spec is not at hand.
    #[arg(long)]
    pub hop_id: Option<u8>,
}

/// Options of `hoptrace tap`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct TapArgs {
    /// Broker: `mqtt://host:port?version=5` or `kafka://host:port/topic`; or a store to
    /// poll: `influxdb://`, `postgres://`, `clickhouse://`, `victoriametrics://` (see the
    /// README, "store taps").
    #[arg(long)]
    pub from: String,
    /// MQTT topic filters or Kafka topics, comma-separated (default: `#`, or the
    /// address's Kafka topics).
    #[arg(long, value_delimiter = ',')]
    pub topics: Vec<String>,
    /// The hop the arrival stamps are reported as.
    #[arg(long, default_value = "broker")]
    pub hop: String,
    /// Carrier to read the context from (default: per transport).
    #[arg(long, value_parser = parse_carrier)]
    pub carrier: Option<Carrier>,
    /// Only report these publisher ids (comma-separated); others count as foreign.
    #[arg(long, value_delimiter = ',')]
    pub publishers: Vec<u16>,
    /// Stamp Kafka records at arrival even when the topic uses LogAppendTime.
    #[arg(long)]
    pub no_log_append_time: bool,
    /// Stop after this long (`90s`, `30m`; a bare number is seconds; default: until
    /// SIGINT/SIGTERM).
    #[arg(long, value_parser = crate::units::parse_run_length)]
    pub duration: Option<Duration>,
    /// Stop after this many traced messages.
    #[arg(long, value_parser = units::parse_count)]
    pub messages: Option<u64>,
    #[command(flatten)]
    pub collector: CollectorArgs,
    #[command(flatten)]
    pub hop_spec: HopArgs,
    #[command(flatten)]
    pub preflight: PreflightArgs,
    #[command(flatten)]
    pub store: StoreTapArgs,
}

/// Options that only store taps take (`--from influxdb://`, `postgres://`,
/// `clickhouse://`, `victoriametrics://`).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct StoreTapArgs {
    /// Store taps: the least time from one poll's send to the next one's, at least 1ms (a
    /// unit is needed). A poll leaves only when a poller is free (closed loop), so a store
    /// slower than this is polled as fast as it answers. Shorter finds data sooner (a
    /// narrower bound) and costs the store more CPU.
    #[arg(long, alias = "min-poll-interval", default_value = "10ms", value_parser = parse_poll_interval)]
    pub poll_interval: Duration,
    /// Store taps: connections that poll the store, taking turns, so that polls leave one
    /// --poll-interval apart even when one takes longer: the bound on each row is then
    /// about one interval plus one query time. Each poll costs the store the same.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub pollers: u16,
    /// Store taps: after a second without a new row, polls slow down, doubling up to this
    /// interval, and come back to --poll-interval at the first row found: an idle pipeline
    /// costs the store little, and the first message after a pause has a wider bound.
    #[arg(long, default_value = "100ms", value_parser = parse_poll_interval)]
    pub idle_poll_interval: Duration,
    /// Store taps: while rows are being found, one poll every --catch-up-every looks this
    /// far behind the newest row time, so that rows which became visible later than the
    /// regular polls look back are still found (their bounds as wide as that poll's; `0s`:
    /// none). A row later than this is missed and its trace ends incomplete.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub catch_up: Duration,
    /// Store taps: the least time between two catch-up polls, their pace while they find
    /// keys; while they find none the pause doubles, up to half of --catch-up (rows up to
    /// that far behind are always found).
    #[arg(long, default_value = "1s", value_parser = parse_poll_interval)]
    pub catch_up_every: Duration,
    /// Store taps: report each row's own time as hop store_in: `auto` (InfluxDB and
    /// PostgreSQL, whose row time is normally the store's; not ClickHouse's 1 s DateTime nor
    /// VictoriaMetrics, whose samples usually carry the writer's time), `on` or `off`.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub store_in: String,
    /// Store taps: the store's host name announced with the store_in stamps (default: the
    /// address's host; this host's name when that is a loopback address). Its clock status
    /// is this host's when it names this host, unknown otherwise.
    #[arg(long)]
    pub store_host: Option<String>,
    /// Store taps: the hop of the response stamp.
    #[arg(long, default_value = "queryable")]
    pub queryable_hop: String,
    /// Store taps: the hop of the send stamp (`none`: not reported).
    #[arg(long, default_value = "query_start")]
    pub query_start_hop: String,
    /// Store taps: the hop of the row's own time.
    #[arg(long, default_value = "store_in")]
    pub store_in_hop: String,
    /// Store taps: how long to wait for a store that does not answer at start (down, still
    /// starting) before giving up (`30s`); by default the tap gives up at once. Once
    /// started, a store that goes away is polled again with backoff, its errors counted.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub wait_for_store: Duration,
}

fn parse_poll_interval(s: &str) -> Result<Duration, String> {
    let d = units::parse_short_duration(s)?;
    if d < Duration::from_millis(1) {
        return Err(format!(
            "{s:?}: at least 1ms (a shorter interval polls the store back to back, as fast as it answers)"
        ));
    }
    Ok(d)
}

impl ToArgs for HopArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self { pipeline, hop_id } = self;
        argv.path("--pipeline", pipeline.as_deref());
        argv.opt("--hop-id", hop_id.map(|id| id.to_string()));
    }
}

impl ToArgs for TapArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self {
            from,
            topics,
            hop,
            carrier,
            publishers,
            no_log_append_time,
            duration,
            messages,
            collector,
            hop_spec,
            preflight,
            store,
        } = self;
        argv.value("--from", from);
        argv.each("--topics", topics);
        argv.value("--hop", hop);
        argv.opt("--carrier", carrier.map(Carrier::name));
        argv.each("--publishers", publishers);
        argv.flag("--no-log-append-time", *no_log_append_time);
        argv.opt_duration("--duration", *duration);
        argv.opt("--messages", messages.map(|n| n.to_string()));
        argv.group(collector);
        argv.group(hop_spec);
        argv.group(preflight);
        argv.group(store);
    }
}

impl ToArgs for StoreTapArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self {
            poll_interval,
            pollers,
            idle_poll_interval,
            catch_up,
            catch_up_every,
            store_in,
            store_host,
            queryable_hop,
            query_start_hop,
            store_in_hop,
            wait_for_store,
        } = self;
        argv.duration("--poll-interval", *poll_interval);
        argv.value("--pollers", pollers.to_string());
        argv.duration("--idle-poll-interval", *idle_poll_interval);
        argv.duration("--catch-up", *catch_up);
        argv.duration("--catch-up-every", *catch_up_every);
        argv.value("--store-in", store_in);
        argv.opt("--store-host", store_host.as_deref());
        argv.value("--queryable-hop", queryable_hop);
        argv.value("--query-start-hop", query_start_hop);
        argv.value("--store-in-hop", store_in_hop);
        argv.duration("--wait-for-store", *wait_for_store);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argv::parse;
    use crate::collector::every_collector_option;

    fn every_option() -> TapArgs {
        TapArgs {
            from: "influxdb://127.0.0.1:8086/hoptrace?measurement=metrics".into(),
            topics: vec!["plant/#".into(), "line/3".into()],
            hop: "broker_in".into(),
            carrier: Some(Carrier::Envelope),
            publishers: vec![7, 300],
            no_log_append_time: true,
            duration: Some(Duration::from_secs(95)),
            messages: Some(12_000),
            collector: every_collector_option(),
            hop_spec: HopArgs {
                pipeline: Some(PathBuf::from("pipeline.toml")),
                hop_id: Some(9),
            },
            preflight: PreflightArgs {
                max_clock_error: None,
                force_clock: false,
            },
            store: StoreTapArgs {
                poll_interval: Duration::from_micros(2_500),
                pollers: 3,
                idle_poll_interval: Duration::from_millis(250),
                catch_up: Duration::ZERO,
                catch_up_every: Duration::from_secs(2),
                store_in: "on".into(),
                store_host: Some("influx-1".into()),
                queryable_hop: "visible".into(),
                query_start_hop: "none".into(),
                store_in_hop: "stored".into(),
                wait_for_store: Duration::from_secs(30),
            },
        }
    }

    #[test]
    fn a_tap_s_options_read_back_as_written() {
        let a = every_option();
        assert_eq!(parse::<TapArgs>(a.to_args(&[])).unwrap(), a);
    }

    #[test]
    fn a_tap_s_defaults_read_back_as_written() {
        let a = parse::<TapArgs>(["--from", "mqtt://127.0.0.1:1883"]).unwrap();
        assert_eq!(parse::<TapArgs>(a.to_args(&[])).unwrap(), a);
    }
}
