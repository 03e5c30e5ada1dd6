//! # hoptrace-runner
//!
//! The orchestration behind the `hoptrace` command: whole measurements and benchmarks
//! that start the other crates' parts (collector, publisher, the reference pipeline), in
//! this process or as child processes of the `hoptrace` program, watch them, stop them
//! in order and turn what they wrote into reports.
//!
//! **Borders.** This crate may depend on every other hoptrace crate; nothing depends on
//! it but the `hoptrace` binary. The probe, the publisher, the store taps, the collector,
//! the analysis, the dataset format and the reference pipeline must never depend on it:
//! they are the parts, this crate only assembles them. It holds no command-line parsing
//! either: each run takes an options struct, which the binary fills from its clap
//! arguments; the command lines of the parts it starts as child processes are written
//! from those parts' own option structs (`hoptrace-cli`, whose `argv` module writes them
//! back as arguments), not spelled here. Those
//! option structs are deliberately exhaustive (no `#[non_exhaustive]`, unlike the
//! embeddable crates' configs): the binary builds each with a struct literal, so an
//! option added here fails to compile until the command sets it, and none is forgotten.
//!
//! **Output.** Results are returned as values and printed by the binary. What a run says
//! while it runs (its live line, its start line, notes) goes to stderr through [`out`],
//! so a reader that went away never stops a run.
//!
//! Runs:
//! - [`demo`] (all in this process) and [`soak`] (every part a process of its own): the
//!   reference pipeline, measured through the one set of steps and drain rule of
//!   [`pipeline`]; [`sweep`]: a matrix of soaks; [`roundtrip`]: the probe path through
//!   hop threads; [`scaleout`]: a collector as a member of a Kafka consumer group;
//!   [`bench`](mod@bench): the collector, publisher and report benchmarks.
//!
//! Their parts:
//! - [`supervisor`]: child processes; [`sampler`] and [`procfs`]: their CPU and memory;
//!   [`broker_process`]: the broker's process and version; [`rundir`]: a run directory
//!   before and after its run; [`query`]: the one query runtime; and, from
//!   `hoptrace-cli`, [`progress`]: the live line; [`interrupt`]: waits that SIGINT and
//!   SIGTERM end; [`out`]: printing that a closed pipe cannot break.
//!
//! The processes of a soak talk through typed contracts: the publisher's end summary is
//! `hoptrace_publisher::report::PublishReport`, the collector's progress is
//! `hoptrace_collector::run::Progress` served as `/progress.json`, and the children's
//! command lines ([`soak::PartCommands`], [`sweep::soak_args`]) are written from the
//! children's own option structs (`hoptrace-cli`) and parsed back by this crate's tests.
//!
//! ```
//! use hoptrace_runner::roundtrip::{self, RoundtripOptions};
//!
//! # fn main() -> anyhow::Result<()> {
//! let runs = std::env::temp_dir().join(format!("hoptrace-doc-{}", std::process::id()));
//! let done = roundtrip::run(&RoundtripOptions {
//!     messages: 100,
//!     rate: 10_000.0, // metrics per second
//!     streams: 4,
//!     metrics_per_message: 1,
//!     hops: vec!["publish".into(), "store_in".into()],
//!     last_hop_skew_ns: 0,
//!     payload_bytes: 16,
//!     runs: runs.clone(),
//! })?;
//! assert_eq!(done.sent, 100);
//! assert!(done.run.accounting.adds_up);
//! # std::fs::remove_dir_all(runs)?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs, unreachable_pub)]

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
pub use hoptrace_cli::{interrupt, out, progress};
pub mod broker_process;
pub mod demo;
pub mod pipeline;
pub mod procfs;
pub mod query;
pub mod roundtrip;
pub mod rundir;
pub mod sampler;
pub mod scaleout;
pub mod soak;
pub mod supervisor;
pub mod sweep;
