//! Human formatting of figures, as the reports print them: `2.1ms`, `384.3µs`, `±512ns`,
//! `1,659,149,726`.

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

/// A rate with an SI suffix: `1.00M`, `58.2k`, `950`.
#[must_use]
pub fn rate(per_s: f64) -> String {
    if per_s >= 1e6 {
        format!("{:.2}M", per_s / 1e6)
    } else if per_s >= 1e3 {
        format!("{:.1}k", per_s / 1e3)
    } else {
        format!("{per_s:.0}")
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

#[cfg(test)]
mod tests {
    use super::*;

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
