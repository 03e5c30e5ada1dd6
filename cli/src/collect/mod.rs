//! The options of `hoptrace collect`, and the pipeline spec they (and every command that
//! reports a hop) name.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hoptrace_collector::Collector;
use hoptrace_collector::metrics::MetricsServer;
use hoptrace_format::spec::PipelineSpec;
use hoptrace_format::units;

use crate::units::{parse_listen, parse_run_id};

use crate::argv::{Argv, ToArgs};

pub mod text;

/// Where `hoptrace collect` listens when not told.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7400";

/// Options of `hoptrace collect`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct CollectArgs {
    /// Address to listen on for probes [default: 127.0.0.1:7400]. Any non-loopback
    /// address requires --token.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen)]
    pub listen: Option<String>,
    /// Pipeline spec (TOML); `hoptrace generate-config` prints a commented default.
    /// Without it, that default is used.
    #[arg(long)]
    pub pipeline: Option<PathBuf>,
    /// Folder under which the run directory `<run-id>/` is created.
    #[arg(long, alias = "out", value_name = "DIR", default_value = "runs")]
    pub runs: PathBuf,
    /// Run id (default: run-<UTC time>): letters, digits, '.', '_' and '-'.
    #[arg(long, value_parser = parse_run_id)]
    pub run_id: Option<String>,
    /// Add to the run in <runs>/<run-id>/ although it closed cleanly: its files are kept
    /// and the new run.json accounts for what this collector receives. Without it, a
    /// finished run is never written over.
    #[arg(long = "continue", requires = "run_id")]
    pub continue_run: bool,
    /// Continue the unfinished run under --runs (one whose collector was stopped without
    /// closing it, so its log is still there) of this pipeline, the newest when there are
    /// several, as `--run-id` with its id would. Without it, a collector started without
    /// --run-id names the unfinished runs it finds and starts a new run.
    #[arg(long, conflicts_with_all = ["run_id", "no_log"])]
    pub resume: bool,
    #[command(flatten)]
    pub listener: crate::collector::ListenerArgs,
    /// Stop by itself after this long (`90s`, `30m`; a bare number is seconds); default:
    /// run until SIGINT/SIGTERM.
    #[arg(long, alias = "duration-s", value_name = "DURATION", value_parser = crate::units::parse_run_length)]
    pub duration: Option<Duration>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (and the same progress as
    /// JSON at /progress.json).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen)]
    pub metrics: Option<String>,
    /// Serve the live view at http://HOST:PORT/: a self-contained page (nothing loaded
    /// from elsewhere) showing, updated every second, per-stage percentiles over the last
    /// interval and the whole run, throughput against --target-rate, the accounting and
    /// each probe host's clock; its figures are at /live.json. The same server answers
    /// /metrics and /progress.json too: --metrics with the same address is that one
    /// server, with another address a second one. `:0` picks a free port (printed).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen)]
    pub ui: Option<String>,
    /// The rate the run is meant to publish, metrics per second (`100k`), for the live
    /// view's throughput against it; the collector itself does not use it.
    #[arg(long, value_name = "METRICS_PER_S", value_parser = units::parse_rate)]
    pub target_rate: Option<f64>,
    #[command(flatten)]
    pub preflight: crate::preflight::PreflightArgs,
    /// Read probe records from Kafka instead of listening
    /// (kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?rdkafka.NAME=VALUE&...], written by
    /// `hoptrace relay`; the rdkafka. properties are set on this member's consumers): this
    /// collector joins the consumer group --group and writes its own files under
    /// <runs>/<run-id>/members/<member>/; the analysis reads all members as one run.
    #[arg(long, value_name = "KAFKA_URL", requires = "run_id")]
    pub from: Option<String>,
    /// Consumer group of the collectors reading --from.
    #[arg(long, default_value = "hoptrace-collectors", requires = "from")]
    pub group: String,
    /// This collector's name in the group (default: host name and process id).
    #[arg(long, requires = "from")]
    pub member: Option<String>,
    /// Time between checkpoints (files closed, offsets committed) with --from.
    #[arg(long, alias = "commit-interval-s", value_name = "DURATION", default_value = "5s", value_parser = units::parse_duration, requires = "from")]
    pub commit_interval: Duration,
    /// Keep no write-ahead log (<runs>/<run-id>/wal/): probes are not told what is on disk
    /// and keep nothing to send again, and a collector killed loses what it had not
    /// written. With the log (the default), the same command started again after a kill
    /// continues the run with nothing lost.
    #[arg(long)]
    pub no_log: bool,
    /// How often the log is synced to disk (fdatasync) and probes told what it holds; at
    /// most 1s.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_log_sync, conflicts_with = "no_log")]
    pub log_sync: Duration,
    /// Least time between two checkpoints of the run, taken when a part file closes: the
    /// log before a checkpoint is deleted, so the log holds about this long of records
    /// (or one part file's worth, if more) and a restart replays only that.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = units::parse_duration, conflicts_with = "no_log")]
    pub checkpoint_interval: Duration,
    /// Also take OpenTelemetry spans over OTLP/HTTP at http://HOST:PORT/v1/traces
    /// (protobuf or JSON, as exporters send them with `OTEL_EXPORTER_OTLP_ENDPOINT`):
    /// the hops the pipeline defines by a `span` match are stamped by them. --token is
    /// asked of them as a bearer token. `:0` picks a free port (printed).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen)]
    pub otlp: Option<String>,
    /// Largest OTLP request body taken, before and after gzip (`16MiB`); a larger one is
    /// answered 413.
    #[arg(long, value_name = "SIZE", default_value = "16MiB", value_parser = parse_request_size, requires = "otlp")]
    pub otlp_max_request: u64,
    /// When an OTLP request is answered: `durable` (default), once its stamps are in the
    /// run's log, so a collector killed loses nothing an exporter was told was taken, each
    /// request waiting for the log's next sync (--log-sync); or `received`, once the join
    /// took them (a killed collector loses up to one sync interval of them).
    #[arg(long, value_name = "WHEN", default_value = "durable", value_parser = ["durable", "received"], requires = "otlp")]
    pub otlp_ack: String,
}

fn parse_request_size(s: &str) -> Result<u64, String> {
    let n = units::parse_bytes(s)?;
    if !(1024..=1 << 30).contains(&n) {
        return Err(format!("{s:?}: an OTLP request limit is 1KiB to 1GiB"));
    }
    Ok(n)
}

fn parse_log_sync(s: &str) -> Result<Duration, String> {
    let d = units::parse_short_duration(s)?;
    if d.is_zero() || d > Duration::from_secs(1) {
        return Err(format!(
            "{s:?}: the log is synced at least once a second and at most every 1ms (e.g. 100ms)"
        ));
    }
    Ok(d.max(Duration::from_millis(1)))
}

impl CollectArgs {
    /// The OTLP receiver's settings, when `--otlp` is given.
    #[must_use]
    pub fn otlp_config(&self) -> Option<hoptrace_collector::ingest::otlp::OtlpConfig> {
        let mut c = hoptrace_collector::ingest::otlp::OtlpConfig::new(self.otlp.clone()?);
        c.max_request_bytes = usize::try_from(self.otlp_max_request).unwrap_or(usize::MAX);
        c.ack_durable = self.otlp_ack == "durable";
        Some(c)
    }

    /// Starts the HTTP servers of `--metrics` and `--ui`: one when both name the same address
    /// (or only one is given), two otherwise. They read the collector's figures through a
    /// [`hoptrace_collector::run::Watch`], so they can answer until after it stopped.
    ///
    /// # Errors
    /// An address cannot be bound.
    pub fn serve(&self, collector: &Collector) -> anyhow::Result<Vec<MetricsServer>> {
        let mut servers = Vec::new();
        if let Some(addr) = &self.ui {
            let server = start_ui(collector, addr, self.target_rate)?;
            if self.metrics.as_ref() == Some(addr) {
                eprintln!("metrics on http://{}/metrics", server.local_addr());
            }
            servers.push(server);
        }
        if let Some(addr) = self
            .metrics
            .as_ref()
            .filter(|m| self.ui.as_ref() != Some(*m))
        {
            let w = collector.watch();
            let server = MetricsServer::start(addr, std::sync::Arc::new(move || w.progress()))
                .with_context(|| format!("serving metrics on {addr}"))?;
            eprintln!("metrics on http://{}/metrics", server.local_addr());
            servers.push(server);
        }
        Ok(servers)
    }

    /// `collect --from` reads Kafka and listens for nobody: the options of a listener would be
    /// silently ignored, so they are refused. Values that only come from the environment
    /// (`HOPTRACE_TOKEN`, ...) are not the user's request here and pass.
    ///
    /// # Errors
    /// A listener's option given with `--from`, named.
    pub fn refuse_listener_options(&self) -> anyhow::Result<()> {
        let from_env =
            |var: &str, value: Option<String>| value.is_none() || std::env::var(var).ok() == value;
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let given: Vec<&str> = [
            ("--listen", self.listen.is_some()),
            ("--no-log", self.no_log),
            ("--resume", self.resume),
            ("--otlp", self.otlp.is_some()),
            ("--metrics", self.metrics.is_some()),
            ("--ui", self.ui.is_some()),
            (
                "--token",
                !from_env("HOPTRACE_TOKEN", self.listener.token.clone()),
            ),
            (
                "--tls-cert",
                !from_env("HOPTRACE_TLS_CERT", path(&self.listener.tls_cert)),
            ),
            (
                "--tls-key",
                !from_env("HOPTRACE_TLS_KEY", path(&self.listener.tls_key)),
            ),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if !given.is_empty() {
            bail!(
                "{} cannot be used with --from: a collector reading Kafka takes no probe connections; give {} to `hoptrace relay`, which does",
                given.join(", "),
                if given.len() == 1 { "it" } else { "them" }
            );
        }
        Ok(())
    }
}

impl ToArgs for CollectArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self {
            listen,
            pipeline,
            runs,
            run_id,
            continue_run,
            resume,
            listener,
            duration,
            metrics,
            ui,
            target_rate,
            preflight,
            from,
            group,
            member,
            commit_interval,
            no_log,
            log_sync,
            checkpoint_interval,
            otlp,
            otlp_max_request,
            otlp_ack,
        } = self;
        argv.opt("--listen", listen.as_deref());
        argv.path("--pipeline", pipeline.as_deref());
        argv.path("--runs", Some(runs.as_path()));
        argv.opt("--run-id", run_id.as_deref());
        argv.flag("--continue", *continue_run);
        argv.flag("--resume", *resume);
        argv.group(listener);
        argv.opt_duration("--duration", *duration);
        argv.opt("--metrics", metrics.as_deref());
        argv.opt("--ui", ui.as_deref());
        argv.opt("--target-rate", target_rate.map(|r| r.to_string()));
        argv.group(preflight);
        argv.opt("--from", from.as_deref());
        // These need --from (clap refuses them without it, even at their defaults).
        if from.is_some() {
            argv.value("--group", group);
            argv.opt("--member", member.as_deref());
            argv.duration("--commit-interval", *commit_interval);
        }
        argv.flag("--no-log", *no_log);
        // These conflict with --no-log.
        if !no_log {
            argv.duration("--log-sync", *log_sync);
            argv.duration("--checkpoint-interval", *checkpoint_interval);
        }
        argv.opt("--otlp", otlp.as_deref());
        if otlp.is_some() {
            argv.value("--otlp-max-request", otlp_max_request.to_string());
            argv.value("--otlp-ack", otlp_ack);
        }
    }
}

/// The pipeline spec at `path`, or the built-in default pipeline without one; its
/// warnings are printed.
///
/// # Errors
/// A file that does not read or is not a valid spec (the error names the file).
pub fn load_spec(path: Option<&std::path::Path>) -> anyhow::Result<PipelineSpec> {
    let Some(p) = path else {
        return Ok(PipelineSpec::default_pipeline());
    };
    let spec = PipelineSpec::load(p).with_context(|| format!("pipeline spec {}", p.display()))?;
    for w in spec.warnings() {
        eprintln!("warning: pipeline spec {}: {w}", p.display());
    }
    Ok(spec)
}

/// Serves the live view of `collector` (and `/metrics`, `/progress.json`) on `addr`,
/// showing `target_rate` (metrics per second) as the target, and says where on stderr.
///
/// # Errors
/// The address cannot be bound.
pub fn start_ui(
    collector: &Collector,
    addr: &str,
    target_rate: Option<f64>,
) -> anyhow::Result<MetricsServer> {
    let server = MetricsServer::start_live(addr, &collector.watch(), target_rate)
        .with_context(|| format!("serving the live view on {addr}"))?;
    eprintln!("live view on http://{}/", server.local_addr());
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argv::parse;
    use crate::collector::ListenerArgs;
    use crate::preflight::PreflightArgs;

    fn every_option() -> CollectArgs {
        CollectArgs {
            listen: Some("127.0.0.1:7411".into()),
            pipeline: Some(PathBuf::from("pipelines/my pipeline.toml")),
            runs: PathBuf::from("/var/tmp/runs"),
            run_id: Some("soak-7".into()),
            continue_run: true,
            resume: false,
            listener: ListenerArgs {
                token: None,
                tls_cert: Some(PathBuf::from("cert.pem")),
                tls_key: Some(PathBuf::from("key.pem")),
            },
            duration: Some(Duration::from_millis(90_500)),
            metrics: Some("127.0.0.1:9100".into()),
            ui: Some("127.0.0.1:0".into()),
            target_rate: Some(1_234_567.5),
            preflight: PreflightArgs {
                max_clock_error: Some(250_000),
                force_clock: true,
            },
            from: None,
            group: "hoptrace-collectors".into(),
            member: None,
            commit_interval: Duration::from_secs(5),
            no_log: false,
            log_sync: Duration::from_millis(20),
            checkpoint_interval: Duration::from_secs(7),
            otlp: Some("127.0.0.1:4318".into()),
            otlp_max_request: 4 << 20,
            otlp_ack: "received".into(),
        }
    }

    #[test]
    fn a_collector_s_options_read_back_as_written() {
        let a = every_option();
        assert_eq!(parse::<CollectArgs>(a.to_args(&[])).unwrap(), a);
    }

    #[test]
    fn a_group_member_s_options_read_back_as_written() {
        let mut a = every_option();
        a.continue_run = false;
        a.listen = None;
        a.from = Some("kafka://127.0.0.1:9092/records".into());
        a.group = "collectors-2".into();
        a.member = Some("m1".into());
        a.commit_interval = Duration::from_millis(2_500);
        a.no_log = true;
        a.otlp = None;
        a.otlp_max_request = 16 << 20;
        a.otlp_ack = "durable".into();
        // Without the log, its settings are not written: they read back as their defaults.
        a.log_sync = Duration::from_millis(100);
        a.checkpoint_interval = Duration::from_secs(5);
        assert_eq!(parse::<CollectArgs>(a.to_args(&[])).unwrap(), a);
    }

    #[test]
    fn a_token_is_never_written() {
        let mut a = every_option();
        a.listener.token = Some("s3cret".into());
        let args = a.to_args(&["collect"]);
        assert!(!args.iter().any(|w| w.to_string_lossy().contains("s3cret")));
        assert!(!args.iter().any(|w| w == "--token"));
    }

    #[test]
    fn the_defaults_read_back_as_written() {
        let a = parse::<CollectArgs>(std::iter::empty::<&str>()).unwrap();
        assert_eq!(parse::<CollectArgs>(a.to_args(&[])).unwrap(), a);
    }
}
