//! The clock preflight every command that starts a part of a run shares.

use hoptrace_format::units;

use crate::argv::{Argv, ToArgs};

/// The clock preflight of a command that starts a part of a run (collector, publisher,
/// tap, demo): this host's clock must be synchronised, with an error bound of at most
/// `--max-clock-error`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct PreflightArgs {
    /// Refuse to start when this host's clock (chronyd, ptp4l or the kernel) is not
    /// synchronised or its error bound exceeds this (e.g. 100us, 1ms); the collector also
    /// checks every probe host's clock status against it and records what fails.
    #[arg(long, value_name = "DURATION", value_parser = units::parse_duration_ns)]
    pub max_clock_error: Option<u64>,
    /// With --max-clock-error: warn instead of refusing.
    #[arg(long)]
    pub force_clock: bool,
}

impl PreflightArgs {
    /// Checks this host's clock when `--max-clock-error` is given.
    ///
    /// # Errors
    /// The clock fails the check and `--force-clock` is not given.
    pub fn check(&self) -> anyhow::Result<()> {
        let Some(max) = self.max_clock_error else {
            return Ok(());
        };
        let status = hoptrace_clock::this_host().read();
        crate::clock::conclude(
            Some(hoptrace_clock::preflight_host(
                &hoptrace_clock::hostname(),
                &status,
                max,
            )),
            self.force_clock,
            "--force-clock to run anyway (the run still records every host's clock status)",
        )
    }
}

impl ToArgs for PreflightArgs {
    fn write_args(&self, argv: &mut Argv) {
        let Self {
            max_clock_error,
            force_clock,
        } = self;
        argv.opt(
            "--max-clock-error",
            max_clock_error.map(|ns| format!("{ns}ns")),
        );
        argv.flag("--force-clock", *force_clock);
    }
}
