//! Options written back as the command-line arguments that parse into them, so that a
//! command that starts another as a child process (`hoptrace soak` starting `collect`,
//! `refpipe store` and `refpipe processor`) fills the child's own option struct and
//! cannot name a flag the child does not have.
//!
//! Each [`ToArgs`] implementation takes its struct apart without `..`: a field added to an
//! option struct does not compile until it is written here too. That parsing the written
//! arguments gives the same struct back is tested for every struct, with every field set.
//!
//! A token is never written: a command line can be read by every user of the host
//! (`ps`), so a child takes its token from the environment (`HOPTRACE_TOKEN`), which it
//! inherits.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

/// Options that can be written back as arguments: parsing them yields the same options
/// (a token excepted: see the module).
pub trait ToArgs {
    /// Appends the options' arguments to `argv`.
    fn write_args(&self, argv: &mut Argv);

    /// The options' arguments, after `words` (the subcommand: `["collect"]`).
    fn to_args(&self, words: &[&str]) -> Vec<OsString> {
        let mut argv = Argv(words.iter().map(OsString::from).collect());
        self.write_args(&mut argv);
        argv.0
    }
}

/// Arguments being written.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Argv(Vec<OsString>);

impl Argv {
    /// `--name value`.
    pub fn value(&mut self, name: &str, value: impl Into<OsString>) {
        self.0.push(name.into());
        self.0.push(value.into());
    }

    /// `--name value` when there is a value.
    pub fn opt(&mut self, name: &str, value: Option<impl Into<OsString>>) {
        if let Some(v) = value {
            self.value(name, v);
        }
    }

    /// `--name path` when there is a path.
    pub fn path(&mut self, name: &str, value: Option<&Path>) {
        self.opt(name, value.map(Path::as_os_str));
    }

    /// `--name` when `on`.
    pub fn flag(&mut self, name: &str, on: bool) {
        if on {
            self.0.push(name.into());
        }
    }

    /// `--name <ns>ns`: exact, and read alike by every duration parser of the command line.
    pub fn duration(&mut self, name: &str, d: Duration) {
        self.value(name, format!("{}ns", d.as_nanos()));
    }

    /// `--name <ns>ns` when there is a duration.
    pub fn opt_duration(&mut self, name: &str, d: Option<Duration>) {
        if let Some(d) = d {
            self.duration(name, d);
        }
    }

    /// `--name v` for each value of a list option.
    pub fn each(&mut self, name: &str, values: &[impl ToString]) {
        for v in values {
            self.value(name, v.to_string());
        }
    }

    /// A group of options flattened into this one.
    pub fn group(&mut self, options: &impl ToArgs) {
        options.write_args(self);
    }
}

/// Parses `args` (without a program name) as the options `T`, with the defaults and
/// checks the command line has.
///
/// # Errors
/// What clap says of the arguments.
pub fn parse<T: clap::Args + clap::FromArgMatches>(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
) -> Result<T, clap::Error> {
    let command = T::augment_args(clap::Command::new("hoptrace").no_binary_name(true));
    T::from_arg_matches(&command.try_get_matches_from(args)?)
}
