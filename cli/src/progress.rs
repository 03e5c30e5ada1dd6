//! The live line of a long run (oha's monitor, hyperfine's progress bar): on a terminal
//! it is rewritten in place once a second; on anything else (a log file, a pipe) it is a
//! plain line every so often, or nothing. It is written to stderr through
//! [`crate::out`], so a reader that went away (`2>&1 | head -1`) stops the line, never
//! the run.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::out::{self, Stream};

/// How often the line is rewritten on a terminal.
pub const TERMINAL_EVERY: Duration = Duration::from_secs(1);
/// How often a plain line is printed when stderr is not a terminal, unless a command
/// says otherwise.
pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// A live line on stderr.
#[derive(Debug)]
pub struct LiveLine {
    terminal: bool,
    every: Option<Duration>,
    last: Instant,
    shown: bool,
}

impl LiveLine {
    /// A live line on a terminal; elsewhere a plain line every [`PLAIN_EVERY`].
    #[must_use]
    pub fn new() -> Self {
        Self::with_plain_every(Some(PLAIN_EVERY))
    }

    /// A live line on a terminal; elsewhere a plain line every `plain_every`, or none.
    #[must_use]
    pub fn with_plain_every(plain_every: Option<Duration>) -> Self {
        Self::for_output(std::io::stderr().is_terminal(), plain_every)
    }

    /// As on a terminal (`terminal`) or not, whatever stderr is.
    #[must_use]
    pub fn for_output(terminal: bool, plain_every: Option<Duration>) -> Self {
        Self {
            terminal,
            every: if terminal {
                Some(TERMINAL_EVERY)
            } else {
                plain_every
            },
            last: Instant::now(),
            shown: false,
        }
    }

    /// Whether the line is rewritten in place (stderr is a terminal).
    #[must_use]
    pub fn is_terminal(&self) -> bool {
        self.terminal
    }

    /// Whether a line is due at `now`.
    #[must_use]
    pub fn due_at(&self, now: Instant) -> bool {
        self.every
            .is_some_and(|every| now.saturating_duration_since(self.last) >= every)
    }

    /// Whether a line is due now.
    #[must_use]
    pub fn due(&self) -> bool {
        self.due_at(Instant::now())
    }

    /// When a line is due: `line` is called with the time since the last line (or since
    /// the start) and what it returns is shown. Returns whether a line was shown.
    pub fn tick(&mut self, line: impl FnOnce(Duration) -> String) -> bool {
        let now = Instant::now();
        if !self.due_at(now) {
            return false;
        }
        let text = line(now.saturating_duration_since(self.last));
        self.last = now;
        self.show(&text);
        true
    }

    /// Shows `line` now, whether due or not.
    pub fn show(&mut self, line: &str) {
        self.shown = true;
        let text = render(self.terminal, line);
        out::print(Stream::Err, !self.terminal, format_args!("{text}"));
    }

    /// Polls every `poll` until `done` holds, showing `line` whenever it is due.
    pub fn wait_until(
        &mut self,
        poll: Duration,
        mut done: impl FnMut() -> bool,
        mut line: impl FnMut(Duration) -> String,
    ) {
        while !done() {
            std::thread::sleep(poll);
            self.tick(&mut line);
        }
    }

    /// Polls every `poll` until `stop` is set or `done` holds; see [`Self::wait_until`].
    pub fn wait_while_running(
        &mut self,
        stop: &AtomicBool,
        poll: Duration,
        mut done: impl FnMut() -> bool,
        line: impl FnMut(Duration) -> String,
    ) {
        self.wait_until(poll, || stop.load(Relaxed) || done(), line);
    }

    /// Ends the line: on a terminal, the next output starts on a line of its own.
    pub fn finish(&mut self) {
        if self.terminal && self.shown {
            out::print(Stream::Err, true, format_args!(""));
        }
        self.shown = false;
    }
}

impl Default for LiveLine {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for LiveLine {
    fn drop(&mut self) {
        self.finish();
    }
}

/// What is written for `line`: on a terminal, a carriage return first (the line is
/// rewritten) and spaces after (a shorter line covers a longer one); otherwise the line
/// as it is (the newline is the caller's).
fn render(terminal: bool, line: &str) -> String {
    if terminal {
        format!("\r{line}   ")
    } else {
        line.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_gets_the_line_rewritten_every_second() {
        let l = LiveLine::for_output(true, None);
        let start = l.last;
        assert!(!l.due_at(start + Duration::from_millis(999)));
        assert!(l.due_at(start + TERMINAL_EVERY));
        assert_eq!(render(true, "5s  traces 10"), "\r5s  traces 10   ");
    }

    #[test]
    fn elsewhere_plain_lines_at_their_own_pace_or_none() {
        let l = LiveLine::for_output(false, Some(PLAIN_EVERY));
        let start = l.last;
        assert!(!l.due_at(start + Duration::from_secs(9)));
        assert!(l.due_at(start + PLAIN_EVERY));
        assert_eq!(render(false, "5s  traces 10"), "5s  traces 10");
        let quiet = LiveLine::for_output(false, None);
        assert!(!quiet.due_at(start + Duration::from_secs(3600)));
    }

    #[test]
    fn a_line_is_shown_when_due_and_told_the_time_since_the_last() {
        let mut l = LiveLine::for_output(false, Some(Duration::ZERO));
        let mut since = None;
        assert!(l.tick(|d| {
            since = Some(d);
            String::new()
        }));
        assert!(since.is_some());
        let mut never = LiveLine::for_output(false, None);
        assert!(!never.tick(|_| unreachable!("not due")));
        let stop = AtomicBool::new(true);
        never.wait_while_running(&stop, Duration::ZERO, || false, |_| String::new());
    }
}
