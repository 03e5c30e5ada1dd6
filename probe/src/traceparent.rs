//! W3C Trace Context `traceparent` parsing, so hoptrace results can be joined with
//! OpenTelemetry traces. Only version `00` is accepted, as `docs/trace-format.md` says.

use crate::context::{OtelTraceId, TRACE_ID_LEN};

/// Header / user-property name of a W3C trace parent.
pub const TRACEPARENT: &str = "traceparent";

/// Why a `traceparent` value was ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceparentError {
    /// Not `00-<32 hex>-<16 hex>-<2 hex>` in lower-case hex.
    #[error("traceparent is not 00-<32 hex>-<16 hex>-<2 hex>")]
    Malformed,
    /// The version field is not `00`.
    #[error("traceparent version is not 00")]
    UnsupportedVersion,
    /// The trace id or the parent id is all zeros, which W3C declares invalid.
    #[error("traceparent has an all-zero trace id or parent id")]
    ZeroId,
}

/// Parses a version-00 `traceparent` and returns its trace id.
///
/// # Errors
/// A [`TraceparentError`] saying what is wrong with the value.
pub fn parse(value: &[u8]) -> Result<OtelTraceId, TraceparentError> {
    if value.len() != 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return Err(TraceparentError::Malformed);
    }
    let mut version = [0u8; 1];
    hex_lower(&value[0..2], &mut version)?;
    let mut id = [0u8; TRACE_ID_LEN];
    hex_lower(&value[3..35], &mut id)?;
    let mut parent = [0u8; 8];
    hex_lower(&value[36..52], &mut parent)?;
    let mut flags = [0u8; 1];
    hex_lower(&value[53..55], &mut flags)?;
    if version[0] != 0 {
        return Err(TraceparentError::UnsupportedVersion);
    }
    if id == [0; TRACE_ID_LEN] || parent == [0; 8] {
        return Err(TraceparentError::ZeroId);
    }
    Ok(OtelTraceId(id))
}

fn hex_lower(src: &[u8], out: &mut [u8]) -> Result<(), TraceparentError> {
    fn nibble(c: u8) -> Result<u8, TraceparentError> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(TraceparentError::Malformed),
        }
    }
    for (o, pair) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_w3c_example() {
        let id = parse(GOOD.as_bytes()).unwrap();
        assert_eq!(id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn rejects_what_w3c_rejects() {
        let upper = GOOD.to_uppercase();
        let cases: &[(&str, TraceparentError)] = &[
            ("", TraceparentError::Malformed),
            (&upper, TraceparentError::Malformed),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceparentError::UnsupportedVersion,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                TraceparentError::ZeroId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                TraceparentError::ZeroId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
                TraceparentError::Malformed,
            ),
        ];
        for (value, err) in cases {
            assert_eq!(parse(value.as_bytes()), Err(*err), "{value}");
        }
    }
}
