//! The live figures of a running collector: progress, and the handle servers read them
//! through.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::live::Live;

/// Live figures, for progress lines, `/metrics` and `/progress.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Progress {
    /// Hop records received.
    pub records: u64,
    /// Traces written complete.
    pub complete: u64,
    /// Traces written incomplete.
    pub incomplete: u64,
    /// Traces waiting for more hops.
    pub pending: u64,
    /// Probe connections open.
    pub connections: u64,
    /// Last interval's (stage, p50 ns, p99 ns).
    pub stages: Vec<(String, i64, i64)>,
    /// Connections refused or closed, by reason.
    pub closed_connections: BTreeMap<String, u64>,
    /// Times the join filled up and the collector pushed back on probes.
    pub backpressure_episodes: u64,
    /// Bytes this collector appended to the run's write-ahead log (0 without one).
    pub log_bytes: u64,
    /// Checkpoints the run has taken (its log before the last one is deleted).
    pub checkpoints: u64,
}

/// The live figures of a collector ([`Collector::watch`](super::Collector::watch)): read for each request of
/// `/metrics`, `/progress.json` and `/live.json`, also once the collector stopped (then
/// [`Live::running`] is false).
#[derive(Debug, Clone)]
pub struct Watch {
    pub(super) progress: Arc<Mutex<Progress>>,
    pub(super) live: Arc<Mutex<Live>>,
}

impl Watch {
    /// The figures of `/progress.json`.
    #[must_use]
    pub fn progress(&self) -> Progress {
        self.progress.lock().expect("progress poisoned").clone()
    }

    /// The figures of `/live.json`.
    #[must_use]
    pub fn live(&self) -> Live {
        self.live.lock().expect("live poisoned").clone()
    }
}
