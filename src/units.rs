//! Human units on the command line and in tables: `1M`, `250ms`, `1.2ms`.

/// Parses a count with an optional suffix: `5000`, `50k`, `1M`, `1.5G` (or `1.5B`, billion).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1e3),
        Some('M') => (&s[..s.len() - 1], 1e6),
        Some('G' | 'B') => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a count (examples: 5000, 50k, 1M, 1B)"))?;
    if !(v >= 0.0 && v.is_finite()) {
        return Err(format!("{s:?} must be a non-negative number"));
    }
    let n = v * mult;
    if (n - n.round()).abs() > 1e-6 * n.max(1.0) {
        return Err(format!("{s:?} is not a whole number ({n})"));
    }
    Ok(n.round() as u64)
}

/// Parses a rate, metrics per second, with an optional suffix: `0.5`, `200`, `50k`,
/// `1.5M`. It must be positive.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('G' | 'B') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    let v: f64 = num.parse().map_err(|_| {
        format!("{s:?} is not a rate in metrics per second (examples: 0.5, 200, 50k, 1M)")
    })?;
    let rate = v * mult;
    if !(rate > 0.0 && rate.is_finite()) {
        return Err(format!("{s:?}: a rate must be greater than 0"));
    }
    Ok(rate)
}

/// Parses a duration with a unit: `250ms`, `30s`, `5m`, `1h`, `1.5s`, `500us`, `100ns`
/// (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let ns = duration_ns(s, Some(1e9))?;
    Ok(std::time::Duration::from_nanos(ns))
}

/// Parses a duration that must carry its unit into nanoseconds: `500ns`, `250us` (or
/// `µs`), `1ms`, `1.5s`, `2m`, `1h`.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    duration_ns(s, None)
}

/// Parses a signed duration with a unit into nanoseconds: `-20ms`, `+1.5us`, `3s`.
pub fn parse_signed_duration_ns(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'-') => (-1, &t[1..]),
        Some(b'+') => (1, &t[1..]),
        _ => (1, t),
    };
    let ns = duration_ns(rest, None)?;
    i64::try_from(ns)
        .map(|n| sign * n)
        .map_err(|_| format!("{s:?} is out of range"))
}

/// `bare`: the scale of a number without a unit, or `None` when a unit is required.
fn duration_ns(s: &str, bare: Option<f64>) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let scale = match (unit.trim(), bare) {
        ("ns", _) => 1.0,
        ("us" | "µs", _) => 1e3,
        ("ms", _) => 1e6,
        ("s", _) => 1e9,
        ("m" | "min", _) => 60e9,
        ("h", _) => 3_600e9,
        ("", Some(scale)) => scale,
        ("", None) => return Err(format!("{s:?} needs a unit (ns, us, ms, s, m, h)")),
        (other, _) => {
            return Err(format!(
                "{other:?} is not a time unit (ns, us, ms, s, m, h)"
            ));
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 500us, 250ms, 30s, 5m)"))?;
    let ns = (v * scale).round();
    if !(ns.is_finite() && (0.0..1.8e19).contains(&ns)) {
        return Err(format!("{s:?} is out of range"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(ns as u64)
}

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

/// Formats a count or rate with an SI suffix: `0.50`, `950`, `12.5k`, `1.00M`.
pub fn fmt_si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if v > 0.0 && v < 10.0 && v.fract() != 0.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.0}")
    }
}

/// Formats nanoseconds with a unit that keeps 4 significant figures: `63.5µs`, `2.1ms`.
pub fn fmt_ns(ns: f64) -> String {
    let a = ns.abs();
    if a < 1e3 {
        format!("{ns:.0}ns")
    } else if a < 1e6 {
        format!("{:.1}µs", ns / 1e3)
    } else if a < 1e9 {
        format!("{:.1}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
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
    use std::time::Duration;

    #[test]
    fn counts() {
        assert_eq!(parse_count("5000"), Ok(5000));
        assert_eq!(parse_count("50k"), Ok(50_000));
        assert_eq!(parse_count("1.5M"), Ok(1_500_000));
        assert_eq!(parse_count("1B"), Ok(1_000_000_000));
        assert_eq!(parse_count("1.8G"), Ok(1_800_000_000));
        assert!(parse_count("fast").is_err());
        assert!(parse_count("-1").is_err());
        assert!(parse_count("0.5").unwrap_err().contains("whole"));
        assert_eq!(parse_count("1.2345k").ok(), None);
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("0.5"), Ok(0.5));
        assert_eq!(parse_rate("50k"), Ok(50_000.0));
        assert_eq!(parse_rate("1.5M"), Ok(1_500_000.0));
        for bad in ["0", "-1", "fast", "1x", ""] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn signed_durations() {
        assert_eq!(parse_signed_duration_ns("-20ms"), Ok(-20_000_000));
        assert_eq!(parse_signed_duration_ns("+1.5us"), Ok(1_500));
        assert_eq!(parse_signed_duration_ns("3s"), Ok(3_000_000_000));
        assert!(parse_signed_duration_ns("-20").is_err());
        assert!(parse_signed_duration_ns("--1ms").is_err());
    }

    #[test]
    fn durations_with_units() {
        assert_eq!(parse_duration_ns("500ns"), Ok(500));
        assert_eq!(parse_duration_ns("100us"), Ok(100_000));
        assert_eq!(parse_duration_ns("100µs"), Ok(100_000));
        assert_eq!(parse_duration_ns("1ms"), Ok(1_000_000));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration_ns("2m"), Ok(120_000_000_000));
        assert_eq!(parse_duration_ns("1h"), Ok(3_600_000_000_000));
        for bad in ["1", "ms", "1 parsec", "-1ms", "1e3ms", ""] {
            assert!(parse_duration_ns(bad).is_err(), "{bad:?}");
        }
    }

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

    #[test]
    fn formatting() {
        assert_eq!(fmt_si(950.0), "950");
        assert_eq!(fmt_si(0.5), "0.50");
        assert_eq!(fmt_si(3.0), "3");
        assert_eq!(fmt_si(12_500.0), "12.5k");
        assert_eq!(fmt_si(1e6), "1.00M");
        assert_eq!(fmt_ns(512.0), "512ns");
        assert_eq!(fmt_ns(63_500.0), "63.5µs");
        assert_eq!(fmt_ns(2_100_000.0), "2.1ms");
        assert_eq!(fmt_ns(-1_500.0), "-1.5µs");
    }
}
