//! What a store tap is told, and why it may not start.

use std::time::Duration;

use hoptrace_probe::{ExporterConfig, HopId};

use crate::store::{StoreError, StoreUrl, UrlError};

/// What to poll, how often, and what to report.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreTapConfig {
    /// The store.
    pub url: StoreUrl,
    /// The collector and how to reach it; without it the tap only polls and counts. The
    /// tap connects at start and waits for the Welcome (up to its `welcome_timeout`); the
    /// `store_in` exporter announces the same process name with ` (store clock)` added.
    pub collector: Option<ExporterConfig>,
    /// The hop of the response stamp (default 5 `queryable`).
    pub queryable_hop: (HopId, String),
    /// The hop of the send stamp (default 4 `query_start`); `None`: not reported.
    pub query_start_hop: Option<(HopId, String)>,
    /// The hop of the row's own time (default 3 `store_in`); `None`: not reported.
    pub store_in_hop: Option<(HopId, String)>,
    /// The hop of the earliest instant the data can have become queryable (the spec's
    /// `earliest` of the queryable hop); `None`: not reported.
    pub earliest_hop: Option<(HopId, String)>,
    /// The store's host name for the `store_in` exporter's Hello (default: the address's
    /// host, or this host's name when that is a loopback address).
    pub store_host: Option<String>,
    /// Least time from one poll's send to the next one's. A poll is sent only when a
    /// poller is free (closed loop), so a slow store is polled as fast as it answers.
    pub poll_interval: Duration,
    /// Connections polling the store, taking turns (default 1).
    pub pollers: usize,
    /// The interval polls slow down to, doubling from `poll_interval`, after a second
    /// without a new key; back to `poll_interval` at the first key found. Equal to
    /// `poll_interval`: never slower.
    pub idle_poll_interval: Duration,
    /// How far behind the newest row time a catch-up poll looks (at least as far as the
    /// regular polls); zero: none are sent. While keys are being found, one poll every
    /// `catch_up_interval` looks this far back, so that rows which became visible later
    /// than the regular polls look back are still found (counted as `caught_up_keys`,
    /// their bounds as wide as the catch-up poll's). A row later than this is missed.
    pub catch_up: Duration,
    /// Least time between two catch-up polls: their pace while they find keys. While they
    /// find none, the pause doubles up to half of `catch_up` (a catch-up poll reads the
    /// whole window, the costliest poll the tap sends), so a row up to half of `catch_up`
    /// behind is always found, and one up to `catch_up` behind while late rows are seen.
    pub catch_up_interval: Duration,
    /// Only these publishers' keys are reported; others are counted.
    pub publishers: Option<Vec<u16>>,
    /// Hop id of the publish stamp in the contexts, for the local publish → queryable
    /// figure of the summary.
    pub publish_hop: HopId,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Stop after this many keys found.
    pub max_keys: Option<u64>,
    /// Most keys remembered for de-duplication.
    pub dedup_capacity: usize,
    /// How often the counters go to the collector.
    pub counters_interval: Duration,
    /// How long [`StoreTap::start`](crate::StoreTap::start) waits for a store that cannot be reached (down, still
    /// starting) before it gives up; zero: it gives up at once.
    pub wait_for_store: Duration,
}

impl StoreTapConfig {
    /// A tap of `url` with the default pipeline's hops and a 10 ms poll interval.
    #[must_use]
    pub fn new(url: StoreUrl) -> Self {
        let store_in = url.kind.store_in_by_default();
        Self {
            url,
            collector: None,
            queryable_hop: (HopId(5), "queryable".into()),
            query_start_hop: Some((HopId(4), "query_start".into())),
            store_in_hop: store_in.then(|| (HopId(3), "store_in".into())),
            earliest_hop: None,
            store_host: None,
            poll_interval: Duration::from_millis(10),
            pollers: 1,
            idle_poll_interval: Duration::from_millis(100),
            catch_up: Duration::from_secs(10),
            catch_up_interval: Duration::from_secs(1),
            publishers: None,
            publish_hop: HopId(0),
            duration: None,
            max_keys: None,
            dedup_capacity: 1 << 20,
            counters_interval: Duration::from_secs(1),
            wait_for_store: Duration::ZERO,
        }
    }
}

/// Why a store tap could not start.
#[derive(Debug, thiserror::Error)]
pub enum StoreTapError {
    /// The address is wrong or incomplete.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The store refused at start: a missing table, measurement or column, a failing
    /// query.
    #[error("{0}")]
    Store(StoreError),
    /// The store could not be reached at start, for as long as the tap was told to wait:
    /// start it (or check the address), or wait longer (`--wait-for-store 30s`).
    #[error(
        "the store did not answer{}: {detail} (is it running at that address?{})",
        if *wait_ms > 0 { format!(" within {waited_ms} ms") } else { String::new() },
        if *wait_ms > 0 {
            " It did not come up in the time --wait-for-store gave it"
        } else {
            " `--wait-for-store 30s` waits for a store that is still starting"
        }
    )]
    StoreDown {
        /// How long the tap waited, ms.
        waited_ms: u64,
        /// How long it was told to wait (`--wait-for-store`), ms.
        wait_ms: u64,
        /// The last error.
        detail: String,
    },
    /// An exporter could not start (fix a hop or the TLS setting), or the collector did not
    /// welcome it (is `hoptrace collect` running there, with a pipeline that declares these
    /// hops, and the same token?).
    #[error("exporter: {0}")]
    Exporter(#[from] hoptrace_probe::ExporterError),
}
