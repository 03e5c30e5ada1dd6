//! Human units, one grammar everywhere: counts (`50k`, `1M`, `1.5B`), rates (`0.5`, `200`,
//! `1M` per second), durations (`500us`, `250ms`, `30s`, `5m`, `1h`; signed: `-20ms`) as
//! the command line, gates and specs read them, and the same figures as reports and
//! progress lines print them (`2.1ms`, `±512ns`, `1,659,149,726`, `1.00M`), with UTC dates.

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
    let ns = parse_ns_with(s, Some(1e9))?;
    Ok(std::time::Duration::from_nanos(ns))
}

/// Parses a duration that must carry its unit (`500us`, `1ms`, `2s`; `0` needs none): for
/// settings usually well below a second (a publisher's tick, a batch's linger, a poll
/// interval), where a bare number, read as seconds by [`parse_duration`], would almost
/// always be a mistake (`--tick 1`: one second).
pub fn parse_short_duration(s: &str) -> Result<std::time::Duration, String> {
    if s.trim() == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    parse_ns_with(s, None)
        .map(std::time::Duration::from_nanos)
        .map_err(|e| {
            if s.trim().parse::<f64>().is_ok() {
                format!(
                    "{s:?} needs a unit here (e.g. 500us, 1ms, 10ms): a bare number would be seconds"
                )
            } else {
                e
            }
        })
}

/// Parses a size in bytes: `65536`, `512KiB`, `64MiB`, `1GiB` (powers of 1024), or `64MB`,
/// `1GB` (powers of 1000); `B` alone is bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let units: [(&str, f64); 7] = [
        ("KiB", 1024.0),
        ("MiB", 1024.0 * 1024.0),
        ("GiB", 1024.0 * 1024.0 * 1024.0),
        ("kB", 1e3),
        ("MB", 1e6),
        ("GB", 1e9),
        ("B", 1.0),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((t, 1.0));
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 65536, 512KiB, 64MiB, 1GiB)"))?;
    if !(v >= 0.0 && v.is_finite()) {
        return Err(format!("{s:?} must be a non-negative size"));
    }
    let n = (v * mult).round();
    if n > u64::MAX as f64 {
        return Err(format!("{s:?} is too large"));
    }
    Ok(n as u64)
}

/// Parses a duration that must carry its unit into nanoseconds: `500ns`, `250us` (or
/// `µs`), `1ms`, `1.5s`, `2m`, `1h`.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    parse_ns_with(s, None)
}

/// Parses a signed duration with a unit into nanoseconds: `-20ms`, `+1.5us`, `3s`.
pub fn parse_signed_duration_ns(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'-') => (-1, &t[1..]),
        Some(b'+') => (1, &t[1..]),
        _ => (1, t),
    };
    let ns = parse_ns_with(rest, None)?;
    i64::try_from(ns)
        .map(|n| sign * n)
        .map_err(|_| format!("{s:?} is out of range"))
}

/// `bare`: the scale of a number without a unit, or `None` when a unit is required.
fn parse_ns_with(s: &str, bare: Option<f64>) -> Result<u64, String> {
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

/// A duration in ns: whole ns below 1 µs, else µs, ms or s with one decimal (`63.5µs`,
/// `7.6ms`, `1.2s`).
#[must_use]
pub fn duration_ns(ns: u64) -> String {
    duration_f64(ns as f64)
}

/// As [`duration_ns`], for a fractional or signed value (a mean, a negative delta).
#[must_use]
pub fn duration_f64(ns: f64) -> String {
    let sign = if ns < 0.0 { "-" } else { "" };
    let a = ns.abs();
    // Round first so 999.96µs prints as 1.0ms, not 1000.0µs.
    let (v, unit) = if a < 999.5 {
        return format!("{sign}{a:.0}ns");
    } else if a < 999_950.0 {
        (a / 1e3, "µs")
    } else if a < 999_950_000.0 {
        (a / 1e6, "ms")
    } else {
        (a / 1e9, "s")
    };
    format!("{sign}{v:.1}{unit}")
}

/// A signed duration in ns (a percentile of a stage with negative deltas): `-3.2µs`.
#[must_use]
pub fn signed_ns(ns: i64) -> String {
    duration_f64(ns as f64)
}

/// A precision: `±512ns`, `±1.0µs`.
#[must_use]
pub fn precision_ns(ns: u64) -> String {
    format!("±{}", duration_ns(ns))
}

/// An integer with thousands separators: `1,659,149,726`.
#[must_use]
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate or count with an SI suffix: `1.00M`, `58.2k`, `950`, `0.50`.
#[must_use]
pub fn rate(per_s: f64) -> String {
    if per_s >= 1e6 {
        format!("{:.2}M", per_s / 1e6)
    } else if per_s >= 1e3 {
        format!("{:.1}k", per_s / 1e3)
    } else if per_s > 0.0 && per_s < 10.0 && per_s.fract() != 0.0 {
        format!("{per_s:.2}")
    } else {
        format!("{per_s:.0}")
    }
}

/// A size in bytes, powers of 1024: `512B`, `1.5KiB`, `64.0MiB`, `2.00GiB`.
#[must_use]
pub fn bytes(n: u64) -> String {
    let f = n as f64;
    if f < 1024.0 {
        format!("{n}B")
    } else if f < 1024.0 * 1024.0 {
        format!("{:.1}KiB", f / 1024.0)
    } else if f < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1}MiB", f / (1024.0 * 1024.0))
    } else {
        format!("{:.2}GiB", f / (1024.0 * 1024.0 * 1024.0))
    }
}

/// A span of seconds: `30 minutes`, `45 seconds`, `2.5 hours`.
#[must_use]
pub fn span_s(s: f64) -> String {
    if s >= 5400.0 {
        format!("{:.1} hours", s / 3600.0)
    } else if s >= 90.0 {
        let m = s / 60.0;
        if (m - m.round()).abs() < 0.05 {
            format!("{:.0} minutes", m.round())
        } else {
            format!("{m:.1} minutes")
        }
    } else {
        format!("{s:.1} seconds")
    }
}

/// A UTC date and time of Unix epoch nanoseconds: (year, month, day, hour, minute,
/// second, millisecond), by the proleptic Gregorian calendar.
#[must_use]
pub fn utc_parts(unix_ns: i64) -> (i64, i64, i64, i64, i64, i64, i64) {
    let secs = unix_ns.div_euclid(1_000_000_000);
    let millis = unix_ns.rem_euclid(1_000_000_000) / 1_000_000;
    let (days, tod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        tod / 3_600,
        tod % 3_600 / 60,
        tod % 60,
        millis,
    )
}

/// `2026-11-22T08:21:23.123Z` from Unix epoch nanoseconds.
#[must_use]
pub fn utc_iso(unix_ns: i64) -> String {
    let (y, m, d, h, min, sec, ms) = utc_parts(unix_ns);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{sec:02}.{ms:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("512KiB"), Ok(512 * 1024));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("64MB"), Ok(64_000_000));
        assert_eq!(parse_bytes("10 kB"), Ok(10_000));
        assert_eq!(parse_bytes("0B"), Ok(0));
        assert!(parse_bytes("64 megs").is_err());
        assert!(parse_bytes("-1MiB").is_err());
        assert!(parse_bytes("").is_err());
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(1536), "1.5KiB");
        assert_eq!(bytes(64 << 20), "64.0MiB");
        assert_eq!(parse_bytes(&bytes(64 << 20)), Ok(64 << 20));
    }

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
    fn rates_and_signed_durations_print() {
        assert_eq!(rate(950.0), "950");
        assert_eq!(rate(0.5), "0.50");
        assert_eq!(rate(3.0), "3");
        assert_eq!(rate(12_500.0), "12.5k");
        assert_eq!(rate(1e6), "1.00M");
        assert_eq!(signed_ns(-1_500), "-1.5µs");
        assert_eq!(utc_iso(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn durations_read_like_the_reference_report() {
        assert_eq!(duration_ns(512), "512ns");
        assert_eq!(duration_ns(63_500), "63.5µs");
        assert_eq!(duration_ns(384_300), "384.3µs");
        assert_eq!(duration_ns(2_100_000), "2.1ms");
        assert_eq!(duration_ns(999_960), "1.0ms");
        assert_eq!(duration_ns(1_000), "1.0µs");
        assert_eq!(duration_ns(2_500_000_000), "2.5s");
        assert_eq!(precision_ns(1_024), "±1.0µs");
        assert_eq!(duration_f64(-1500.0), "-1.5µs");
    }

    #[test]
    fn counts_have_separators() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(1_659_149_726), "1,659,149,726");
    }

    #[test]
    fn spans_and_rates() {
        assert_eq!(span_s(1800.0), "30 minutes");
        assert_eq!(span_s(30.0), "30.0 seconds");
        assert_eq!(rate(1_000_000.0), "1.00M");
        assert_eq!(rate(58_200.0), "58.2k");
    }
}
