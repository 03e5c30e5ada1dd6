//! Human units on the command line and in tables: `1M`, `250ms`, `1.2ms`.

/// Checks a run id: it names a directory under the runs folder, so letters, digits, `.`,
/// `_` and `-`, not starting with `.`.
pub fn parse_run_id(s: &str) -> Result<String, String> {
    let plain = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if s.is_empty() || !plain || s.starts_with('.') {
        return Err(format!(
            "{s:?}: use letters, digits, '.', '_' and '-' (not starting with '.'), e.g. soak-1"
        ));
    }
    Ok(s.to_owned())
}

/// Parses how long a command runs before it stops by itself (`90s`, `30m`; a bare number
/// is seconds): not 0, which would end the run at once (leave the option out to run until
/// SIGINT/SIGTERM).
pub fn parse_run_length(s: &str) -> Result<std::time::Duration, String> {
    let d = hoptrace_format::units::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "{s:?}: a run of 0 s would end at once; give a length (90s, 30m), or leave the option out to run until SIGINT/SIGTERM"
        ));
    }
    Ok(d)
}

/// Checks an address to listen on: `HOST:PORT` (`127.0.0.1:7400`, `[::1]:7400`,
/// `localhost:7400`, port 0 for any free port) that resolves.
pub fn parse_listen(s: &str) -> Result<String, String> {
    use std::net::ToSocketAddrs as _;
    let example = "expected HOST:PORT, e.g. 127.0.0.1:7400 (port 0: any free port)";
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("{s:?} has no port: {example}"));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("{s:?}: {example}"));
    }
    match s.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(_)) => Ok(s.to_owned()),
        Ok(None) => Err(format!("{s:?}: the host resolves to no address")),
        Err(e) => Err(format!("{s:?}: cannot resolve the host ({e})")),
    }
}

/// This process's command line as a shell would take it back: arguments holding spaces
/// or shell characters in single quotes (`--sla 'Total Ingestion.p99 < 5ms'`).
#[must_use]
pub fn command_line() -> String {
    shell_join(std::env::args())
}

fn shell_join(args: impl IntoIterator<Item = String>) -> String {
    args.into_iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c));
            if plain {
                a
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids() {
        assert_eq!(parse_run_id("soak-1.a_b"), Ok("soak-1.a_b".into()));
        for bad in ["", ".", "..", "../x", "a/b", ".hidden", "a b"] {
            assert!(parse_run_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn listen_addresses() {
        assert!(parse_listen("127.0.0.1:0").is_ok());
        assert!(parse_listen("localhost:7400").is_ok());
        assert!(parse_listen("[::1]:7400").is_ok());
        let e = parse_listen("localhost").unwrap_err();
        assert!(e.contains("no port") && e.contains("HOST:PORT"), "{e}");
        assert!(parse_listen("127.0.0.1:http").is_err());
        assert!(parse_listen(":7400").is_err());
    }

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let args = [
            "hoptrace",
            "--sla",
            "Total Ingestion.p99 < 5ms",
            "it's",
            "",
            "a=b,c",
        ];
        assert_eq!(
            shell_join(args.map(str::to_owned)),
            "hoptrace --sla 'Total Ingestion.p99 < 5ms' 'it'\\''s' '' a=b,c"
        );
    }
}
