//! Human units on the command line and in tables: `1M`, `250ms`, `1.2ms`.

/// Parses a count with an optional SI suffix: `5000`, `50k`, `1M`, `1.5G`.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1e3),
        Some('M') => (&s[..s.len() - 1], 1e6),
        Some('G') => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a count (examples: 5000, 50k, 1M)"))?;
    if !(v >= 0.0 && v.is_finite()) {
        return Err(format!("{s:?} must be a non-negative number"));
    }
    Ok((v * mult).round() as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(parse_count("5000"), Ok(5000));
        assert_eq!(parse_count("50k"), Ok(50_000));
        assert_eq!(parse_count("1.5M"), Ok(1_500_000));
        assert!(parse_count("fast").is_err());
        assert!(parse_count("-1").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(fmt_ns(512.0), "512ns");
        assert_eq!(fmt_ns(63_500.0), "63.5µs");
        assert_eq!(fmt_ns(2_100_000.0), "2.1ms");
        assert_eq!(fmt_ns(-1_500.0), "-1.5µs");
    }
}
