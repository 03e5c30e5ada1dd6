//! The exporter's clock status readings, taken on a thread of their own: reading chronyd
//! or ptp4l runs `chronyc` or `pmc` and waits for it, and the thread that drains the
//! probes' queue must never wait for a child process.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hoptrace_clock::{ClockStatusSource, KernelClockStatus, StaticClockStatus};
use hoptrace_protocol::{ClockStatus, MAX_STRING_LEN};

use crate::exporter::{ClockReporting, lock};

/// What the reading thread and the exporter share.
#[derive(Debug, Default)]
struct Slot {
    /// Readings taken so far.
    taken: AtomicU64,
    /// The latest reading.
    latest: Mutex<Option<ClockStatus>>,
    /// Set when the exporter stops: the thread ends after its current reading.
    stop: AtomicBool,
}

/// A [`ClockReporting::Custom`] source.
struct CustomClockStatus(crate::exporter::ClockStatusFn);

impl ClockStatusSource for CustomClockStatus {
    fn read(&mut self) -> ClockStatus {
        (self.0.0)()
    }
}

/// The readings of one exporter's clock status source; none with [`ClockReporting::Off`].
/// Dropping it stops the reading thread without waiting for it.
#[derive(Debug)]
pub(crate) struct ClockFeed {
    slot: Arc<Slot>,
    thread: Option<std::thread::Thread>,
}

impl ClockFeed {
    /// Starts a thread that reads the source `reporting` names at once and then every
    /// `interval`.
    pub(crate) fn start(reporting: &ClockReporting, interval: Duration) -> std::io::Result<Self> {
        let slot = Arc::new(Slot::default());
        let source: Box<dyn FnOnce() -> Box<dyn ClockStatusSource> + Send> = match reporting {
            ClockReporting::Off => return Ok(Self { slot, thread: None }),
            ClockReporting::Kernel => Box::new(|| Box::new(KernelClockStatus)),
            // Detection asks the daemons too (once per process): on this thread as well.
            ClockReporting::Detect => Box::new(hoptrace_clock::this_host),
            ClockReporting::Fixed(status) => {
                let status = status.clone();
                Box::new(move || Box::new(StaticClockStatus(status)))
            }
            ClockReporting::Custom(f) => {
                let f = f.clone();
                Box::new(move || Box::new(CustomClockStatus(f)))
            }
        };
        let shared = Arc::clone(&slot);
        let handle = std::thread::Builder::new()
            .name("hoptrace-clock".into())
            .spawn(move || read_until_stopped(source(), &shared, interval))?;
        Ok(Self {
            slot,
            thread: Some(handle.thread().clone()),
        })
    }

    /// The latest reading when it is newer than reading number `*seen` (0: none seen yet),
    /// which it then becomes. Never waits for the reading thread beyond a lock it holds
    /// only to swap a value in.
    pub(crate) fn newer(&self, seen: &mut u64) -> Option<ClockStatus> {
        let taken = self.slot.taken.load(Acquire);
        if taken <= *seen {
            return None;
        }
        *seen = taken;
        lock(&self.slot.latest).clone()
    }
}

impl Drop for ClockFeed {
    fn drop(&mut self) {
        self.slot.stop.store(true, Relaxed);
        if let Some(t) = &self.thread {
            t.unpark();
        }
    }
}

/// The reading thread's body.
fn read_until_stopped(mut source: Box<dyn ClockStatusSource>, slot: &Slot, interval: Duration) {
    while !slot.stop.load(Relaxed) {
        let mut status = source.read();
        // The frame's string limit, cut at a character boundary.
        let mut end = status.detail.len().min(MAX_STRING_LEN);
        while !status.detail.is_char_boundary(end) {
            end -= 1;
        }
        status.detail.truncate(end);
        *lock(&slot.latest) = Some(status);
        slot.taken.fetch_add(1, Release);
        let next = Instant::now() + interval;
        loop {
            let now = Instant::now();
            if slot.stop.load(Relaxed) || now >= next {
                break;
            }
            std::thread::park_timeout(next - now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoptrace_protocol::ClockSource;

    fn wait_for_reading(feed: &ClockFeed, seen: &mut u64) -> ClockStatus {
        let started = Instant::now();
        loop {
            if let Some(s) = feed.newer(seen) {
                return s;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "no reading");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn each_reading_is_handed_out_once_and_again_after_a_reset() {
        let status = ClockStatus {
            source: ClockSource::Injected,
            detail: "é".repeat(MAX_STRING_LEN),
            ..ClockStatus::default()
        };
        let feed =
            ClockFeed::start(&ClockReporting::Fixed(status), Duration::from_secs(3600)).unwrap();
        let mut seen = 0;
        let first = wait_for_reading(&feed, &mut seen);
        assert_eq!(first.source, ClockSource::Injected);
        assert!(
            first.detail.len() <= MAX_STRING_LEN,
            "cut to the frame's limit"
        );
        assert!(first.at_ns > 0, "stamped when read");
        assert_eq!(feed.newer(&mut seen), None, "one reading per interval");
        let mut again = 0;
        assert_eq!(
            feed.newer(&mut again),
            Some(first),
            "a new connection gets it again"
        );
    }

    #[test]
    fn off_reads_nothing_and_starts_no_thread() {
        let feed = ClockFeed::start(&ClockReporting::Off, Duration::from_millis(1)).unwrap();
        assert!(feed.thread.is_none());
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(feed.newer(&mut 0), None);
    }

    #[test]
    fn the_kernel_is_read_on_the_feed_thread() {
        let feed = ClockFeed::start(&ClockReporting::Kernel, Duration::from_secs(3600)).unwrap();
        let s = wait_for_reading(&feed, &mut 0);
        assert_eq!(s.source, ClockSource::Kernel);
    }
}
