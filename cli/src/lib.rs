//! # hoptrace-cli
//!
//! The command line of `hoptrace` as a library, beside the thin binary that parses it
//! and calls one function per subcommand:
//!
//! - [`command`]: the program's options and its subcommands; each subcommand's options
//!   live in a module of their own ([`collect`], [`publish`], [`tap`], [`soak`],
//!   [`analyze`], [`clock`], [`bench`](mod@bench), [`demo`], [`roundtrip`], [`relay`], [`refpipe`]),
//!   with what they configure (`PublishArgs::config`, `TapArgs::store_config`, ...) and
//!   the text of what the commands print (live lines, summaries, the accounting);
//! - the argument groups the commands share ([`collector`]: where to report to a
//!   collector, what a listener requires of probes; [`preflight`]: the clock check) and
//!   the parsers of the units they are written in ([`units`]: `90s`, `127.0.0.1:7400`);
//! - [`argv`]: options written back as arguments. The runner (`hoptrace-runner`), which
//!   starts `collect`, `tap`, `publish`, `refpipe` and `soak` as child processes, fills
//!   the same structs the binary parses and writes them out, so both sides agree on
//!   every flag;
//! - what every command shares while it runs: [`out`] (printing a closed pipe cannot
//!   break), [`progress`] (the live line), [`interrupt`] (waits that SIGINT and SIGTERM
//!   end), [`signals`] and [`errors`] (how an error and an exit status reach the user),
//!   the SQL prompt ([`analyze::interactive`]).
//!
//! It may depend on every library crate of the workspace but the runner, which depends
//! on it; nothing but the runner and the binary depend on it.

#![deny(unreachable_pub)]
// The options' doc comments are their `--help` text, written for a terminal: `<runs>/`
// there is a placeholder, not an HTML tag.
#![allow(rustdoc::invalid_html_tags)]

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

pub mod analyze;
pub mod argv;
pub mod bench;
pub mod clock;
pub mod collect;
pub mod collector;
pub mod command;
pub mod demo;
pub mod errors;
pub mod interrupt;
pub mod out;
pub mod preflight;
pub mod progress;
pub mod publish;
pub mod refpipe;
pub mod relay;
pub mod roundtrip;
pub mod signals;
pub mod soak;
pub mod tap;
pub mod units;
