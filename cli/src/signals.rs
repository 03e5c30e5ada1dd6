//! SIGINT/SIGTERM as a flag that long-running commands poll to stop cleanly, and the
//! exit status of a command they stopped.
//!
//! The first signal sets the flag: the command stops what it does, flushes and prints its
//! summary, within a second (a wait it cannot end by itself is left behind, named, with
//! [`crate::interrupt`]). A second signal ends the process at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use anyhow::Context as _;

/// The last of SIGINT and SIGTERM received (0: none), written by the handlers.
static LAST: OnceLock<Arc<AtomicUsize>> = OnceLock::new();

/// A flag set by SIGINT or SIGTERM. Install it first thing, so that a signal arriving
/// while the command starts still leads to a clean stop.
///
/// # Errors
/// When the handlers cannot be installed.
pub fn shutdown_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let last = LAST.get_or_init(|| Arc::new(AtomicUsize::new(0)));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered first, so it sees the flag as the previous signal left it: a second
        // signal exits at once, with that signal's status.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
        signal_hook::flag::register_usize(sig, Arc::clone(last), sig as usize)
            .context("installing signal handlers")?;
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    Ok(stop)
}

/// The exit status of a command a signal stopped: 128 + the signal (130 for SIGINT, 143
/// for SIGTERM), as shells report it.
pub fn exit_status() -> i32 {
    let sig = LAST.get().map_or(0, |l| l.load(Relaxed));
    let sig = if sig == 0 {
        signal_hook::consts::SIGINT
    } else {
        i32::try_from(sig).unwrap_or(signal_hook::consts::SIGINT)
    };
    128 + sig
}

/// The name of the last signal received, for messages.
pub fn name() -> &'static str {
    if exit_status() - 128 == signal_hook::consts::SIGTERM {
        "SIGTERM"
    } else {
        "SIGINT"
    }
}
