//! SIGINT/SIGTERM as a flag that long-running commands poll to stop cleanly.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context as _;

/// A flag set by SIGINT or SIGTERM. Install it first thing, so that a signal arriving
/// while the command starts still leads to a clean stop.
///
/// # Errors
/// When the handlers cannot be installed.
pub fn shutdown_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    Ok(stop)
}
