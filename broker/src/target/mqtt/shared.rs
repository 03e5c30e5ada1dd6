//! What a publishing connection's thread and the target share: its counters, and the
//! largest packet.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64};

/// Largest packet accepted and sent (Mosquitto's test configuration allows 2 MiB).
pub(super) const MAX_PACKET_BYTES: usize = 2 * 1024 * 1024;

/// Counters of one publishing connection, shared with its thread.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) written: AtomicU64,
    pub(super) acked: AtomicU64,
    pub(super) reconnects: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) retransmitted: AtomicU64,
    pub(super) requeued: AtomicU64,
    /// Set when the thread ends: publishes written and never acknowledged.
    pub(super) unacked_at_end: AtomicU64,
    /// Set when the thread ends: the connection was down.
    pub(super) down_at_end: AtomicBool,
    pub(super) alive: AtomicBool,
    pub(super) stopping: AtomicBool,
    pub(super) last_error: Mutex<Option<String>>,
}
