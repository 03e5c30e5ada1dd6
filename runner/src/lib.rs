//! # hoptrace-runner
//!
//! The orchestration behind the `hoptrace` command: whole measurements and benchmarks
//! that start the other crates' parts (collector, publisher, the reference pipeline),
//! in this process or as child processes, watch them, stop them in order and turn what
//! they wrote into reports.
//!
//! **Borders.** This crate may depend on every other hoptrace crate; nothing depends on
//! it but the `hoptrace` binary. The probe, the publisher, the collector, the analysis,
//! the dataset format and the reference pipeline must never depend on it: they are the
//! parts, this crate only assembles them.
//!
//! **Output.** Results are returned as values and printed by the binary. What a run says
//! while it runs (its live line, notes and warnings) goes to stderr through [`out`], so
//! a closed pipe never stops a run.
//!
//! - [`out`]: printing that a closed pipe cannot break; [`progress`]: the live line.
//! - [`query`]: the one query runtime, and a run's summary.
//! - [`bench`]: whole-run benchmarks of the collector, the publisher and the report.
//! - [`procfs`]: CPU time and memory of processes, from `/proc`.
#![deny(missing_docs)]

// Every line printed goes through `out`, which stops printing to a stream whose reader
// went away instead of panicking: these shadow the standard macros in every module below.
#[allow(unused_macros)]
macro_rules! print {
    ($($arg:tt)*) => { $crate::out::print($crate::out::Stream::Out, false, format_args!($($arg)*)) };
}
#[allow(unused_macros)]
macro_rules! println {
    () => { $crate::out::print($crate::out::Stream::Out, true, format_args!("")) };
    ($($arg:tt)*) => { $crate::out::print($crate::out::Stream::Out, true, format_args!($($arg)*)) };
}
#[allow(unused_macros)]
macro_rules! eprint {
    ($($arg:tt)*) => { $crate::out::print($crate::out::Stream::Err, false, format_args!($($arg)*)) };
}
#[allow(unused_macros)]
macro_rules! eprintln {
    () => { $crate::out::print($crate::out::Stream::Err, true, format_args!("")) };
    ($($arg:tt)*) => { $crate::out::print($crate::out::Stream::Err, true, format_args!($($arg)*)) };
}

pub mod bench;
pub mod broker_process;
pub mod demo;
pub mod out;
pub mod pipeline;
pub mod procfs;
pub mod progress;
pub mod query;
pub mod roundtrip;
pub mod rundir;
pub mod sampler;
pub mod scaleout;
pub mod soak;
pub mod supervisor;
pub mod sweep;
