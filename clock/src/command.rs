//! Running `chronyc` and `pmc`: found on `PATH` or in the sbin directories, with a time
//! limit, their output captured.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::SourceError;

/// Directories searched after `PATH`: `pmc` lives in `/usr/sbin`, which a user's `PATH`
/// often lacks.
const EXTRA_DIRS: [&str; 3] = ["/usr/sbin", "/sbin", "/usr/local/sbin"];

/// The path of `name` on `PATH` or in the sbin directories; `name` itself when not found
/// (running it then fails with a clear "not found").
pub(crate) fn find_program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(EXTRA_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Runs `program args...`, waits at most `timeout` (then kills it) and returns its
/// standard output when it exits with success.
pub(crate) fn run<S: AsRef<OsStr>>(
    program: &Path,
    args: &[S],
    timeout: Duration,
) -> Result<String, SourceError> {
    let name = program.display().to_string();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| SourceError::Spawn {
            program: name.clone(),
            error,
        })?;
    // Read both pipes on threads so that neither can fill up and block the child.
    let out = child.stdout.take().map(read_all);
    let err = child.stderr.take().map(read_all);
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SourceError::Timeout {
                    program: name,
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SourceError::Spawn {
                    program: name,
                    error,
                });
            }
        }
    };
    let stdout = out.map(join).unwrap_or_default();
    let stderr = err.map(join).unwrap_or_default();
    if status.success() {
        Ok(stdout)
    } else {
        let message = if stderr.trim().is_empty() {
            stdout.trim().to_owned()
        } else {
            stderr.trim().to_owned()
        };
        Err(SourceError::Failed {
            program: name,
            status: status.to_string(),
            message,
        })
    }
}

fn read_all<R: Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

fn join(h: std::thread::JoinHandle<String>) -> String {
    h.join().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_failure_and_timeout() {
        let sh = find_program("sh");
        let ok = run(&sh, &["-c", "echo hello"], Duration::from_secs(5)).unwrap();
        assert_eq!(ok, "hello\n");

        let err = run(
            &sh,
            &["-c", "echo nope >&2; exit 3"],
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(
            matches!(&err, SourceError::Failed { message, .. } if message == "nope"),
            "{err}"
        );

        let started = Instant::now();
        let err = run(&sh, &["-c", "exec sleep 5"], Duration::from_millis(100)).unwrap_err();
        assert!(
            matches!(
                err,
                SourceError::Timeout {
                    timeout_ms: 100,
                    ..
                }
            ),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));

        let err = run(
            Path::new("/nonexistent/hoptrace-no-such-program"),
            &["x"],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(err, SourceError::Spawn { .. }), "{err}");
    }
}
