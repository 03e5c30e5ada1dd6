//! `hoptrace clock`: this host's clock status, and the preflight before a run (the
//! options, readings and verdict are `hoptrace_cli::clock`'s).

use std::time::Duration;

use anyhow::bail;
pub use hoptrace_cli::clock::ClockArgs as Args;
use hoptrace_cli::clock::{Reader, Reading, conclude};
use hoptrace_clock::hostname;

/// Runs `hoptrace clock`.
///
/// # Errors
/// The source cannot be read (an explicit `--source chrony|ptp`), or the preflight fails
/// without `--force-clock`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let host = hostname();
    let mut reader = Reader::new(args);
    let Some(interval_ns) = args.watch else {
        let reading = Reading::new(&host, &reader.read(true)?, args.max_error);
        if args.json {
            println!("{}", reading.json());
        } else {
            for line in reading.table() {
                println!("{line}");
            }
        }
        return conclude(
            reading.into_check(),
            args.force,
            "--force-clock to only warn",
        );
    };
    let interval = Duration::from_nanos(interval_ns.max(1));
    let mut failed = 0_u64;
    let mut readings = 0_u64;
    loop {
        let reading = Reading::new(&host, &reader.read(readings == 0)?, args.max_error);
        readings += 1;
        if args.json {
            println!("{}", reading.json());
        } else {
            println!("{}", reading.line());
        }
        if let Some(e) = reading.failure() {
            failed += 1;
            if args.force {
                eprintln!("warning: {e} (--force-clock: continuing)");
            }
        }
        if args.count.is_some_and(|n| readings >= n) {
            break;
        }
        std::thread::sleep(interval);
    }
    if failed > 0 && !args.force {
        bail!("{failed} of {readings} readings failed the clock preflight");
    }
    Ok(())
}
