//! The pieces of the compact binary forms that aggregate states travel in between query
//! partitions (stage statistics, histograms, trace counts): unsigned LEB128 varints, their
//! zigzag form for signed values, and a reader over the bytes. These forms are not for
//! storing; a version of hoptrace may change them.
//!
//! ```
//! use hoptrace_format::varint::{Reader, put, put_zigzag};
//! let mut out = Vec::new();
//! put(&mut out, 300);
//! put_zigzag(&mut out, -2);
//! let mut r = Reader::new(&out);
//! assert_eq!((r.varint(), r.zigzag()), (Ok(300), Ok(-2)));
//! assert!(r.finish().is_ok());
//! ```

/// Bytes that are not the encoding expected: too short, too long, or out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed aggregate state")]
pub struct DecodeError;

/// Appends `v` as an unsigned LEB128 varint.
pub fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends `v` zigzag-encoded (small magnitudes of either sign stay short).
pub fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    put(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Reads what [`put`], [`put_zigzag`] and plain bytes wrote, front to back.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    #[must_use]
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    /// The next byte.
    ///
    /// # Errors
    /// At the end of the bytes.
    pub fn byte(&mut self) -> Result<u8, DecodeError> {
        let (&b, rest) = self.bytes.split_first().ok_or(DecodeError)?;
        self.bytes = rest;
        Ok(b)
    }

    /// The next `N` bytes.
    ///
    /// # Errors
    /// When fewer are left.
    pub fn fixed<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self.bytes.split_first_chunk::<N>().ok_or(DecodeError)?;
        self.bytes = rest;
        Ok(*head)
    }

    /// The next `n` bytes.
    ///
    /// # Errors
    /// When fewer are left.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.bytes.len() {
            return Err(DecodeError);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// The next unsigned varint.
    ///
    /// # Errors
    /// When the bytes end inside it or it runs past 64 bits.
    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0_u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError)
    }

    /// The next zigzag varint.
    ///
    /// # Errors
    /// As [`Self::varint`].
    pub fn zigzag(&mut self) -> Result<i64, DecodeError> {
        let v = self.varint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    /// Checks that every byte was read.
    ///
    /// # Errors
    /// When bytes are left over.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(DecodeError)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_garbage() {
        let values = [0_u64, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX];
        let mut out = Vec::new();
        for v in values {
            put(&mut out, v);
            put_zigzag(&mut out, v as i64);
        }
        let mut r = Reader::new(&out);
        for v in values {
            assert_eq!(r.varint(), Ok(v));
            assert_eq!(r.zigzag(), Ok(v as i64));
        }
        assert_eq!(r.finish(), Ok(()));
        // Cut short, and eleven continuation bytes.
        let mut r = Reader::new(&out[..out.len() - 1]);
        let all: Result<(), DecodeError> = values.iter().try_for_each(|_| {
            r.varint()?;
            r.zigzag().map(|_| ())
        });
        assert_eq!(all, Err(DecodeError));
        assert_eq!(Reader::new(&[0x80]).varint(), Err(DecodeError));
        assert_eq!(Reader::new(&[0xFF; 11]).varint(), Err(DecodeError));
        assert_eq!(Reader::new(&[1, 2]).finish(), Err(DecodeError));
    }
}
