//! Waits that SIGINT and SIGTERM can end: a command that waits for something that may
//! never answer (a silent store, a broker that accepts and never speaks, a collector
//! that is gone) runs that wait on a thread of its own and watches the stop flag beside
//! it. A stop asked for ends the wait within [`GRACE`]: the work sees the flag and ends
//! by itself (a publisher flushes, a tap prints its summary), or, blocked in a call that
//! cannot see it, is left behind and the command says what it was waiting for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::progress::LiveLine;

/// How long a stopped command waits for its work to end by itself.
pub const GRACE: Duration = Duration::from_millis(700);

/// How often a wait looks at the flag.
const POLL: Duration = Duration::from_millis(20);

/// A stop was asked for (SIGINT or SIGTERM) while the command waited.
#[derive(Debug, thiserror::Error)]
#[error("interrupted while {what}")]
pub struct Interrupted {
    /// What the command was waiting for ("connecting to PostgreSQL 127.0.0.1:5432").
    pub what: String,
}

/// Runs `f` on a thread of its own and returns what it returns, unless `stop` is set
/// first: then [`Interrupted`] naming `what`, and `f`'s thread is left to end by itself
/// (or with the process).
///
/// # Errors
/// [`Interrupted`] when `stop` was set before `f` returned.
pub fn interruptible<T: Send + 'static>(
    stop: &AtomicBool,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Interrupted> {
    let handle = std::thread::Builder::new()
        .name("interruptible".into())
        .spawn(f)
        .map_err(|e| Interrupted {
            what: format!("{what} (no thread to wait on: {e})"),
        })?;
    loop {
        if handle.is_finished() {
            return handle.join().map_err(|_| Interrupted {
                what: format!("{what} (its thread panicked)"),
            });
        }
        if stop.load(Relaxed) {
            return Err(Interrupted {
                what: what.to_owned(),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Runs `work` (given the stop flag) on a thread named `name` while `line` is shown on
/// the live line whenever due; returns its result. Once `stop` is set, the work has
/// [`GRACE`] to end by itself; a work still running then is left behind and
/// [`Interrupted`] names `what`.
///
/// # Errors
/// [`Interrupted`] as above, or when the work panicked or its thread could not start.
pub fn run_with_line<T: Send + 'static>(
    name: &str,
    stop: &Arc<AtomicBool>,
    what: &str,
    work: impl FnOnce(&AtomicBool) -> T + Send + 'static,
    line: impl FnMut(Duration) -> String,
) -> Result<T, Interrupted> {
    run_watching(name, stop, what, work, || {}, line)
}

/// [`run_with_line`], calling `watch` at every look at the work (every 20 ms), for what
/// the command says once when it happens (a tap that has taken its baseline).
///
/// # Errors
/// As [`run_with_line`].
pub fn run_watching<T: Send + 'static>(
    name: &str,
    stop: &Arc<AtomicBool>,
    what: &str,
    work: impl FnOnce(&AtomicBool) -> T + Send + 'static,
    mut watch: impl FnMut(),
    mut line: impl FnMut(Duration) -> String,
) -> Result<T, Interrupted> {
    let flag = Arc::clone(stop);
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || work(&flag))
        .map_err(|e| Interrupted {
            what: format!("{what} (no thread for it: {e})"),
        })?;
    let mut live = LiveLine::with_plain_every(None);
    let mut stopped_at: Option<Instant> = None;
    while !handle.is_finished() {
        if stop.load(Relaxed) {
            let at = *stopped_at.get_or_insert_with(Instant::now);
            if at.elapsed() >= GRACE {
                live.finish();
                return Err(Interrupted {
                    what: what.to_owned(),
                });
            }
        }
        std::thread::sleep(POLL);
        watch();
        live.tick(&mut line);
    }
    live.finish();
    handle.join().map_err(|_| Interrupted {
        what: format!("{what} (its thread panicked)"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_ends_a_wait_that_never_returns() {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            flag.store(true, Relaxed);
        });
        let started = Instant::now();
        let e = interruptible(&stop, "waiting for nothing", || {
            std::thread::park();
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "interrupted while waiting for nothing");
        assert!(started.elapsed() < Duration::from_secs(1));
        // A work that returns gives its result.
        let ok = interruptible(&AtomicBool::new(false), "adding", || 2 + 2).unwrap();
        assert_eq!(ok, 4);
    }

    #[test]
    fn a_worker_that_sees_the_flag_ends_with_its_result_and_one_that_does_not_is_left() {
        let stop = Arc::new(AtomicBool::new(true));
        let r = run_with_line(
            "t",
            &stop,
            "tapping",
            |s| {
                while !s.load(Relaxed) {
                    std::thread::park_timeout(Duration::from_millis(1));
                }
                7
            },
            |_| String::new(),
        );
        assert_eq!(r.unwrap(), 7);
        let started = Instant::now();
        let r = run_with_line(
            "t",
            &stop,
            "polling a silent store",
            |_| std::thread::park(),
            |_| String::new(),
        );
        assert_eq!(
            r.unwrap_err().to_string(),
            "interrupted while polling a silent store"
        );
        let took = started.elapsed();
        assert!(
            took >= GRACE && took < GRACE + Duration::from_secs(1),
            "{took:?}"
        );
    }
}
