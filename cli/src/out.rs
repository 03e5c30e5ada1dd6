//! Terminal output that a closed pipe cannot break.
//!
//! `hoptrace collect 2>&1 | head -1` closes the pipe after one line; the standard
//! `println!` would then panic and lose the run. Every line the `hoptrace` command prints
//! goes through [`print`] (in the binary and in this crate, `println!`, `eprintln!`,
//! `print!` and `eprint!` are macros of the crate's own that shadow the standard ones),
//! and the log output goes through [`Sink`]: a stream that fails to take a write (EPIPE,
//! or any other error) is marked closed and never written again, and the command carries
//! on to its end (flushing files, writing `run.json`) as if it had been printed.

use std::fmt;
use std::io::{self, Write as _};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// One of the two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output: results.
    Out,
    /// Standard error: progress, warnings, logs, errors.
    Err,
}

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

impl Stream {
    fn closed_flag(self) -> &'static AtomicBool {
        match self {
            Self::Out => &STDOUT_CLOSED,
            Self::Err => &STDERR_CLOSED,
        }
    }

    /// Whether an earlier write failed (the reader went away).
    pub fn is_closed(self) -> bool {
        self.closed_flag().load(Relaxed)
    }

    /// Writes `bytes` whole, or marks the stream closed.
    fn write_all(self, bytes: &[u8]) {
        if self.is_closed() {
            return;
        }
        let result = match self {
            Self::Out => {
                let mut out = io::stdout().lock();
                out.write_all(bytes).and_then(|()| {
                    // Lines reach a pipe at once, so a reader that stops (`head -1`)
                    // is noticed here and not in a flush at exit.
                    if bytes.ends_with(b"\n") {
                        out.flush()
                    } else {
                        Ok(())
                    }
                })
            }
            Self::Err => io::stderr().lock().write_all(bytes),
        };
        if result.is_err() {
            self.closed_flag().store(true, Relaxed);
        }
    }
}

/// Prints `args` (and a newline with `newline`) to `stream`, or nothing once the stream
/// is closed. Never fails and never panics.
pub fn print(stream: Stream, newline: bool, args: fmt::Arguments<'_>) {
    if stream.is_closed() {
        return;
    }
    let mut text = fmt::format(args);
    if newline {
        text.push('\n');
    }
    stream.write_all(text.as_bytes());
}

/// A writer onto one stream that takes every write, dropping what a closed stream
/// cannot take: for the log output and for query results written to stdout.
#[derive(Debug, Clone, Copy)]
pub struct Sink(pub Stream);

impl io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.0.is_closed() {
            let result = match self.0 {
                Stream::Out => io::stdout().flush(),
                Stream::Err => io::stderr().flush(),
            };
            if result.is_err() {
                self.0.closed_flag().store(true, Relaxed);
            }
        }
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}
