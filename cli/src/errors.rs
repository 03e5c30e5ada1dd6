//! How an error reaches the user: each cause once, and an exit status that tells kinds of
//! failure apart where scripts need it (`hoptrace compare`).

use std::fmt;

/// An error that ends the program with `code` instead of 1.
#[derive(Debug)]
pub struct Exit {
    /// The exit status.
    pub code: i32,
    /// What went wrong.
    pub error: anyhow::Error,
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&render(&self.error))
    }
}

// No `source`: the rendering above already holds the whole chain.
impl std::error::Error for Exit {}

/// `error` ending the program with exit status `code`.
pub fn exit_with(code: i32, error: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(Exit {
        code,
        error: error.into(),
    })
}

/// The exit status for `error`: its [`Exit`] code; for a wait a signal ended
/// ([`Interrupted`]), 128 + the signal (130 for SIGINT, 143 for SIGTERM); or 1.
pub fn exit_code(error: &anyhow::Error) -> i32 {
    if error.chain().any(|c| c.is::<Interrupted>()) {
        return crate::signals::exit_status();
    }
    error
        .chain()
        .find_map(|c| c.downcast_ref::<Exit>())
        .map_or(1, |e| e.code)
}

use crate::interrupt::Interrupted;

/// The error and its causes on one line, each said once.
///
/// Libraries often put their cause's text into their own message and return the cause
/// as `source` too, so the plain chain (`{:#}`) repeats it ("No such file or directory
/// (os error 2): No such file or directory (os error 2)"). A cause already said is left
/// out; a cause that says more than the one before it replaces it.
pub fn render(error: &anyhow::Error) -> String {
    let mut said: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() || said.iter().any(|s| s.contains(text)) {
            continue;
        }
        match said.last_mut() {
            Some(last) if text.contains(last.as_str()) => *last = text.to_owned(),
            _ => said.push(text.to_owned()),
        }
    }
    said.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "runs/x is not a run directory: {}", self.0)
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let e = anyhow::Error::new(Outer(io)).context("opening the runs");
        assert_eq!(
            render(&e),
            "opening the runs: runs/x is not a run directory: No such file"
        );
    }

    #[test]
    fn a_fuller_cause_replaces_a_shorter_one() {
        let e = anyhow::anyhow!("fetch error: transport failure (connection refused)")
            .context("fetch error: transport failure")
            .context("starting the relay");
        assert_eq!(
            render(&e),
            "starting the relay: fetch error: transport failure (connection refused)"
        );
    }

    #[test]
    fn exit_codes_survive_context() {
        let e = exit_with(3, anyhow::anyhow!("no such run")).context("compare");
        assert_eq!(exit_code(&e), 3);
        assert_eq!(render(&e), "compare: no such run");
        assert_eq!(exit_code(&anyhow::anyhow!("plain")), 1);
        let r: anyhow::Result<()> = Err(anyhow::anyhow!("x"));
        assert_eq!(exit_code(&r.context("y").unwrap_err()), 1);
    }
}
