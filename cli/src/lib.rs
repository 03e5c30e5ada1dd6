//! # hoptrace-cli
//!
//! The command line of `hoptrace` that more than the binary needs: the options (clap
//! argument structs) of the commands that other commands start as child processes
//! (`collect`, `tap`, `refpipe store`, `refpipe processor`), the argument groups they share
//! (where to report to a collector, what a listener requires of probes, the clock
//! preflight), and the parsers of the units they are written in (`90s`, `127.0.0.1:7400`).
//!
//! The `hoptrace` binary parses its command line into these structs; the runner
//! (`hoptrace-runner`), which starts those commands as child processes during a soak,
//! fills the same structs and turns them into arguments, so both sides agree on every
//! flag.
//!
//! It depends on the dataset format's units, the probe's exporter configuration and the
//! broker addresses' carriers only; it must never depend on the runner, the collector,
//! the analysis or the publisher, which the binary and the runner call with what these
//! structs hold.

#![deny(unreachable_pub)]
// The options' doc comments are their `--help` text, written for a terminal: `<runs>/`
// there is a placeholder, not an HTML tag.
#![allow(rustdoc::invalid_html_tags)]

pub mod argv;
pub mod collect;
pub mod collector;
pub mod preflight;
pub mod refpipe;
pub mod tap;
pub mod units;
