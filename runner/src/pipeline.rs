//! One measured run of the reference pipeline (publisher → broker → processor → store,
//! every hop reporting its stamps to the collector), wherever its parts run: all in this
//! process (`hoptrace demo`) or each a process of its own (`hoptrace soak`). Both go
//! through the same steps in [`measure`]: publish with a live line, drain, stop the parts.
//!
//! # The drain rule
//!
//! Once the publisher has finished its schedule (or was stopped), the parts keep running
//! until the collector has written a trace for every message sent (complete or
//! incomplete) and holds none pending: everything that was going to arrive has arrived.
//! When that does not happen, the drain gives up once no hop record has reached the
//! collector for one join window (the pipeline spec's `join.window_ms`): by then the
//! collector would itself expire whatever is still pending as incomplete, so waiting any
//! longer cannot change the run. A stop request (SIGINT, SIGTERM) or a failed part ends
//! the drain at once. The parts are then stopped upstream first, each flushing what it
//! holds; whatever is still pending is written as incomplete, counted, never lost.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use hoptrace_collector::run::Progress;
//! use hoptrace_runner::pipeline::{Drain, DrainEnd};
//!
//! let start = Instant::now();
//! let mut drain = Drain::new(100, Duration::from_secs(10), start);
//! let mut p = Progress { records: 400, complete: 99, pending: 1, ..Progress::default() };
//! assert_eq!(drain.check(start, Some(&p)), None);
//! p.complete = 100;
//! p.pending = 0;
//! assert_eq!(drain.check(start, Some(&p)), Some(DrainEnd::Complete));
//! ```

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use hoptrace_collector::run::Progress;
use hoptrace_publisher::report::PublishReport;

use crate::progress::LiveLine;

/// How often the parts are polled.
const POLL: Duration = Duration::from_millis(100);
/// How often [`Parts::each_second`] is called.
const SECOND: Duration = Duration::from_secs(1);

/// A pipeline's parts, as a run drives them.
pub trait Parts {
    /// What stopping the parts gives back (their summaries, their output).
    type Stopped;

    /// Polls the publisher: its report once it has finished.
    ///
    /// # Errors
    /// The publisher failed.
    fn poll_publisher(&mut self) -> anyhow::Result<Option<PublishReport>>;

    /// Asks the publisher to stop early; it still finishes and reports. Called once,
    /// when a stop is requested while it publishes.
    ///
    /// # Errors
    /// The request cannot be made.
    fn stop_publisher(&mut self) -> anyhow::Result<()>;

    /// The collector's live figures; `None` when they cannot be read just now.
    fn progress(&self) -> Option<Progress>;

    /// Whether a part failed, so that waiting for it is pointless.
    fn failed(&self) -> bool {
        false
    }

    /// Called about once a second while the run lasts (publishing and draining).
    fn each_second(&mut self) {}

    /// The live line while publishing, `elapsed` after the start.
    fn live_line(&mut self, elapsed: Duration) -> String;

    /// Stops the parts, upstream first, each flushing what it holds.
    ///
    /// # Errors
    /// A part does not stop, or fails.
    fn stop(self) -> anyhow::Result<Self::Stopped>;
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainEnd {
    /// Every message sent is written as a trace, and none is pending.
    Complete,
    /// No hop record reached the collector for one join window.
    Quiet,
    /// A stop was requested.
    Stopped,
    /// A part failed.
    Failed,
}

impl DrainEnd {
    /// Whether every message sent reached the collector before the parts stopped.
    #[must_use]
    pub fn drained(self) -> bool {
        self == Self::Complete
    }
}

/// The drain rule (see the module docs), fed with the collector's figures as they come.
#[derive(Debug, Clone)]
pub struct Drain {
    sent: u64,
    window: Duration,
    records: Option<u64>,
    since: Instant,
}

impl Drain {
    /// A drain of `sent` messages with a join window of `window`, starting at `now`.
    #[must_use]
    pub fn new(sent: u64, window: Duration, now: Instant) -> Self {
        Self {
            sent,
            window,
            records: None,
            since: now,
        }
    }

    /// The collector's figures at `now` (`None`: they could not be read): whether the
    /// drain is over, and how.
    pub fn check(&mut self, now: Instant, progress: Option<&Progress>) -> Option<DrainEnd> {
        if let Some(p) = progress {
            if p.complete + p.incomplete >= self.sent && p.pending == 0 {
                return Some(DrainEnd::Complete);
            }
            if self.records != Some(p.records) {
                self.records = Some(p.records);
                self.since = now;
            }
        }
        (now.saturating_duration_since(self.since) >= self.window).then_some(DrainEnd::Quiet)
    }
}

/// What a measured run gives back.
#[derive(Debug)]
pub struct Measured<S> {
    /// The publisher's end summary.
    pub published: PublishReport,
    /// How the drain ended.
    pub drain: DrainEnd,
    /// Whether a stop was requested while publishing (the run was cut short).
    pub interrupted: bool,
    /// What the parts gave back when they stopped.
    pub stopped: S,
}

/// Runs the pipeline `parts`, whose publisher has started: publishes to the end of its
/// schedule with a live line, drains by the rule above with the join window `window`,
/// and stops the parts.
///
/// # Errors
/// The publisher or another part fails.
pub fn measure<P: Parts>(
    mut parts: P,
    stop: &AtomicBool,
    window: Duration,
) -> anyhow::Result<Measured<P::Stopped>> {
    let started = Instant::now();
    let mut next = started + SECOND;
    let mut live = LiveLine::new();
    let mut asked = false;
    let published = loop {
        if let Some(report) = parts.poll_publisher()? {
            break report;
        }
        if stop.load(Relaxed) && !asked {
            parts.stop_publisher()?;
            asked = true;
        }
        let now = Instant::now();
        if now >= next {
            next += SECOND;
            parts.each_second();
            live.tick(|_| parts.live_line(started.elapsed()));
        }
        std::thread::sleep(next.saturating_duration_since(now).min(POLL));
    };
    live.finish();
    let interrupted = stop.load(Relaxed);
    let mut rule = Drain::new(published.messages, window, Instant::now());
    let drain = loop {
        if stop.load(Relaxed) {
            break DrainEnd::Stopped;
        }
        if parts.failed() {
            break DrainEnd::Failed;
        }
        let now = Instant::now();
        if let Some(end) = rule.check(now, parts.progress().as_ref()) {
            break end;
        }
        if now >= next {
            next += SECOND;
            parts.each_second();
        }
        std::thread::sleep(POLL);
    };
    let stopped = parts.stop()?;
    Ok(Measured {
        published,
        drain,
        interrupted,
        stopped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(records: u64, complete: u64, incomplete: u64, pending: u64) -> Progress {
        Progress {
            records,
            complete,
            incomplete,
            pending,
            ..Progress::default()
        }
    }

    #[test]
    fn the_drain_ends_when_every_message_is_written_and_none_pending() {
        let t0 = Instant::now();
        let mut d = Drain::new(10, Duration::from_secs(10), t0);
        assert_eq!(d.check(t0, Some(&progress(30, 8, 0, 2))), None);
        // Written, but a trace of an earlier message still waits for a hop.
        assert_eq!(d.check(t0, Some(&progress(40, 10, 0, 1))), None);
        assert_eq!(
            d.check(t0, Some(&progress(41, 9, 1, 0))),
            Some(DrainEnd::Complete)
        );
        // Nothing sent: nothing to wait for.
        let mut none = Drain::new(0, Duration::from_secs(10), t0);
        assert_eq!(
            none.check(t0, Some(&Progress::default())),
            Some(DrainEnd::Complete)
        );
    }

    #[test]
    fn the_drain_gives_up_one_join_window_after_the_last_record() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut d = Drain::new(10, s(10), t0);
        assert_eq!(d.check(t0, Some(&progress(5, 1, 0, 9))), None);
        // Records keep coming: the window starts again each time.
        assert_eq!(d.check(t0 + s(9), Some(&progress(6, 1, 0, 9))), None);
        assert_eq!(d.check(t0 + s(18), Some(&progress(6, 1, 0, 9))), None);
        // Figures that cannot be read do not count as records.
        assert_eq!(d.check(t0 + s(18), None), None);
        assert_eq!(
            d.check(t0 + s(19), Some(&progress(6, 1, 0, 9))),
            Some(DrainEnd::Quiet)
        );
        // A collector that never answers is given one window too.
        let mut silent = Drain::new(10, s(10), t0);
        assert_eq!(silent.check(t0 + s(9), None), None);
        assert_eq!(silent.check(t0 + s(10), None), Some(DrainEnd::Quiet));
        assert!(DrainEnd::Complete.drained() && !DrainEnd::Quiet.drained());
    }

    /// Parts whose collector completes one trace per poll after the publisher sent 5.
    struct Fake {
        polls: u64,
        progress: std::cell::Cell<u64>,
        seconds: u64,
        stop_asked: bool,
        fail: bool,
    }

    impl Parts for Fake {
        type Stopped = (u64, bool);

        fn poll_publisher(&mut self) -> anyhow::Result<Option<PublishReport>> {
            self.polls += 1;
            Ok((self.polls > 3).then(|| PublishReport {
                messages: 5,
                ..PublishReport::default()
            }))
        }

        fn stop_publisher(&mut self) -> anyhow::Result<()> {
            self.stop_asked = true;
            Ok(())
        }

        fn progress(&self) -> Option<Progress> {
            let n = self.progress.get() + 1;
            self.progress.set(n);
            Some(progress(n, n.min(5), 0, 5 - n.min(5)))
        }

        fn failed(&self) -> bool {
            self.fail
        }

        fn each_second(&mut self) {
            self.seconds += 1;
        }

        fn live_line(&mut self, elapsed: Duration) -> String {
            format!("{elapsed:?}")
        }

        fn stop(self) -> anyhow::Result<Self::Stopped> {
            Ok((self.progress.get(), self.stop_asked))
        }
    }

    fn fake(fail: bool) -> Fake {
        Fake {
            polls: 0,
            progress: std::cell::Cell::new(0),
            seconds: 0,
            stop_asked: false,
            fail,
        }
    }

    #[test]
    fn a_run_publishes_drains_and_stops() {
        let stop = AtomicBool::new(false);
        let m = measure(fake(false), &stop, Duration::from_secs(10)).unwrap();
        assert_eq!(m.published.messages, 5);
        assert_eq!(m.drain, DrainEnd::Complete);
        assert!(!m.interrupted);
        assert_eq!(m.stopped, (5, false));
        let m = measure(fake(true), &stop, Duration::from_secs(10)).unwrap();
        assert_eq!(m.drain, DrainEnd::Failed);
    }

    #[test]
    fn a_stop_request_stops_the_publisher_and_the_drain() {
        let stop = AtomicBool::new(true);
        let m = measure(fake(false), &stop, Duration::from_secs(10)).unwrap();
        assert!(m.interrupted);
        assert_eq!(m.drain, DrainEnd::Stopped);
        assert_eq!(m.stopped, (0, true));
    }
}
