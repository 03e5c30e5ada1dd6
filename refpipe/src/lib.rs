//! # hoptrace-refpipe
//!
//! The reference pipeline hoptrace is demonstrated and benchmarked against. It is not
//! part of the measuring tool: it is a small but real ingestion pipeline with the
//! hoptrace probe embedded the way a user embeds it in their own code.
//!
//! ```text
//! publisher ──MQTT/Kafka──▶ processor ──TCP (Arrow IPC)──▶ store
//!   publish              flow_in  flow_out           store_in  query_start  queryable
//! ```
//!
//! - [`processor`]: consumes MQTT (rumqttc) or Kafka (rdkafka), decodes JSON metrics,
//!   transforms and batches them, and writes the batches to the store;
//! - [`store`] and [`server`]: an embedded columnar store (Arrow) that takes writes and
//!   answers queries over TCP, and runs a visibility query after every write;
//! - [`broker`]: an in-process MQTT broker (rumqttd) for the demo's default;
//! - [`wire`]: the store's protocol.
//!
//! It depends on the probe (embedded as a user would embed it) and on `hoptrace-broker`'s
//! clients; it must never depend on the load generator (the publisher), the collector,
//! the analysis or the runner,
//! and nothing of the measuring tool depends on it but the runner (which drives it in
//! the demo and the soak) and the command.
//!
//! The stages of the reference report come out of these hops: Broker Time
//! (`flow_in - publish`), Flow Internal (`flow_out - flow_in`), Transmission
//! (`store_in - flow_out`), Total Ingestion (`queryable - publish`) and Query Duration
//! (`queryable - query_start`).
//!
//! ```no_run
//! use hoptrace_broker::url::Endpoint;
//! use hoptrace_probe::ExporterConfig;
//! use hoptrace_refpipe::{Probes, processor, server};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A running `hoptrace collect`; each part announces its own process name.
//! let probes = Probes::new(ExporterConfig::new("127.0.0.1:7400", "refpipe"));
//! let mut store = server::StoreServerConfig::new("127.0.0.1:0");
//! store.probes = Some(probes.clone());
//! let store = server::StoreServer::start(store)?;
//! let mut flow = processor::ProcessorConfig::new(
//!     Endpoint::parse("mqtt://127.0.0.1:1883")?,
//!     store.local_addr().to_string(),
//! );
//! flow.probes = Some(probes);
//! let flow = processor::Processor::start(flow)?;
//! // ... publish with `hoptrace publish --to mqtt://127.0.0.1:1883 --collector 127.0.0.1:7400` ...
//! let flow = flow.stop(std::time::Duration::from_secs(5));
//! let store = store.stop();
//! println!("{} messages, {} rows stored", flow.messages, store.rows);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs, unreachable_pub)]

use hoptrace_probe::clock::ClockSource;
use hoptrace_probe::testing::OffsetClock;
use hoptrace_probe::{
    ClockReporting, ClockStatus, ClockStatusFn, Exporter, ExporterConfig, HopId, Probe, SystemClock,
};

pub mod broker;
pub mod decode;
pub mod processor;
pub mod server;
pub mod store;
pub mod wire;

/// The hops of the reference pipeline, with the ids `hoptrace generate-config` gives them.
pub const DEFAULT_HOPS: [(HopId, &str); 6] = [
    (HopId(0), "publish"),
    (HopId(1), "flow_in"),
    (HopId(2), "flow_out"),
    (HopId(3), "store_in"),
    (HopId(4), "query_start"),
    (HopId(5), "queryable"),
];

/// Why a part of the pipeline could not start or run. Each variant says what to check.
#[derive(Debug, thiserror::Error)]
pub enum RefpipeError {
    /// The address cannot be listened on: is it in use, or not this host's?
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The store cannot be reached: is it running at that address?
    #[error("cannot reach the store at {addr}: {source}")]
    Store {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The broker cannot be used: see the message.
    #[error(transparent)]
    Source(#[from] hoptrace_broker::target::TargetError),
    /// A hop is not in the probe link's list: declare it (name and id as in the pipeline
    /// spec the collector runs).
    #[error("hop {0:?} is not among the probe link's hops")]
    UnknownHop(String),
    /// The probes' exporter could not start, or the collector did not welcome it (is
    /// `hoptrace collect` running there, with this pipeline's hops and the same token?).
    #[error("probe: {0}")]
    Probe(#[from] hoptrace_probe::ExporterError),
    /// The embedded broker could not start.
    #[error("embedded MQTT broker: {0}")]
    Broker(String),
}

/// The clock a pipeline part's probes read: this host's, shifted by
/// [`SimulatedHost::clock_offset_ns`] when the part simulates another host (and by its
/// [`ClockStep`] once that is due).
#[derive(Debug, Clone, Copy)]
pub struct HostClock {
    offset: OffsetClock<SystemClock>,
    step: Option<ClockStep>,
}

impl HostClock {
    /// This host's clock shifted by `offset_ns`, then by `step` once due.
    #[must_use]
    pub const fn new(offset_ns: i64, step: Option<ClockStep>) -> Self {
        Self {
            offset: OffsetClock::new(SystemClock, offset_ns),
            step,
        }
    }

    /// The step added now: `by_ns` once its instant has passed, else 0.
    #[must_use]
    pub fn stepped_ns(&self) -> i64 {
        self.step
            .filter(|s| std::time::Instant::now() >= s.at)
            .map_or(0, |s| s.by_ns)
    }
}

impl hoptrace_probe::Clock for HostClock {
    #[inline]
    fn now_ns(&self) -> i64 {
        // No clock read beyond the offset clock's unless a step is configured.
        self.offset.now_ns() + self.stepped_ns()
    }
}

/// A step of a simulated host's clock: from `at` on, it reads `by_ns` more (as a clock
/// that a time source steps does), and the clock status it reports says so.
#[derive(Debug, Clone, Copy)]
pub struct ClockStep {
    /// When.
    pub at: std::time::Instant,
    /// By how much (negative: back).
    pub by_ns: i64,
}

/// A pipeline part that pretends to run on another host, whose clock is off: its probes
/// read this host's clock plus an offset, it announces another host name, and it reports
/// a clock status with the given error bound. For seeing what clock error does to a
/// report (negative stages, uncertainty) without a second machine.
#[derive(Debug, Clone)]
pub struct SimulatedHost {
    /// Host name announced to the collector.
    pub name: String,
    /// How far its clock is off, ns (negative: behind).
    pub clock_offset_ns: i64,
    /// The error bound its clock status claims, ns.
    pub error_bound_ns: u64,
    /// A step of its clock during the run, if any.
    pub step: Option<ClockStep>,
}

/// Where a part of the pipeline reports its stamps: the collector and how to reach it,
/// the pipeline's hop ids, and whether the part simulates another host.
#[derive(Debug, Clone)]
pub struct Probes {
    /// The collector and how to reach it; each part announces its own process name
    /// (`refpipe-processor`, `refpipe-store`) and waits for the Welcome up to
    /// `welcome_timeout`.
    pub exporter: ExporterConfig,
    /// Every hop of the pipeline, with the ids the collector's spec gives them.
    pub hops: Vec<(HopId, String)>,
    /// Report as another host, with a skewed clock.
    pub simulate: Option<SimulatedHost>,
}

impl Probes {
    /// Probes reporting to the collector `exporter` names, with the hops of
    /// [`DEFAULT_HOPS`].
    #[must_use]
    pub fn new(exporter: ExporterConfig) -> Self {
        Self {
            exporter,
            hops: DEFAULT_HOPS
                .iter()
                .map(|(id, n)| (*id, (*n).to_owned()))
                .collect(),
            simulate: None,
        }
    }

    /// Connects an exporter for the hops `names` as `process` (waiting until the
    /// collector welcomes it), and returns it with a probe per hop, in the order of
    /// `names`.
    ///
    /// # Errors
    /// [`RefpipeError::UnknownHop`], [`RefpipeError::Probe`] (also when the collector did
    /// not welcome the exporter in time).
    pub fn connect(
        &self,
        process: &str,
        names: &[&str],
    ) -> Result<(Exporter, Vec<Probe<HostClock>>), RefpipeError> {
        let mut hops = Vec::with_capacity(names.len());
        for name in names {
            let (id, n) = self
                .hops
                .iter()
                .find(|(_, n)| n == name)
                .ok_or_else(|| RefpipeError::UnknownHop((*name).to_owned()))?;
            hops.push((*id, n.as_str()));
        }
        let mut config = self.exporter.clone();
        process.clone_into(&mut config.process);
        let clock = self.simulate.as_ref().map_or(HostClock::new(0, None), |s| {
            HostClock::new(s.clock_offset_ns, s.step)
        });
        if let Some(sim) = &self.simulate {
            config.host.clone_from(&sim.name);
            let (base, error_bound_ns) = (sim.clock_offset_ns, sim.error_bound_ns);
            config.clock = ClockReporting::Custom(ClockStatusFn(std::sync::Arc::new(move || {
                let offset_ns = base + clock.stepped_ns();
                ClockStatus {
                    at_ns: hoptrace_probe::clock::realtime_ns(),
                    source: ClockSource::Injected,
                    synced: true,
                    offset_ns,
                    error_bound_ns,
                    detail: format!("simulated host, clock off by {offset_ns} ns"),
                    ..ClockStatus::default()
                }
            })));
            if sim.step.is_some() {
                // A step shows in the clock reports within a second.
                config.clock_interval =
                    config.clock_interval.min(std::time::Duration::from_secs(1));
            }
        }
        let exporter = Exporter::connect(config, &hops)?;
        let probes = hops
            .iter()
            .map(|(id, _)| exporter.probe_with_clock(*id, clock))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((exporter, probes))
    }
}

/// The README's examples of attaching the probe, compiled as doc tests here (this crate
/// depends on the probe with both carriers).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeExamples;
