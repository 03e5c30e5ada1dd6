//! Counts per key: for each key (a stream, a metric count, a second of the run), a row of
//! counters that rows add to: one for every row, one more for each threshold the row's
//! value reaches. The analysis's aggregate of where a tail concentrates runs every trace
//! through [`Tally::add_rows`], so its loop lives here, built optimised with the rest of
//! the dataset's hot paths.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for integer keys: one multiplication (keys are small ids, not adversarial).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_i64(&mut self, v: i64) {
        self.0 = (v as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }
}

/// Counters per key, `width` of them per key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    width: usize,
    slots: HashMap<i64, usize, BuildHasherDefault<IdHasher>>,
    counts: Vec<u64>,
}

impl Tally {
    /// No keys, `width` counters per key (at least one).
    #[must_use]
    pub fn new(width: usize) -> Self {
        Self {
            width: width.max(1),
            ..Self::default()
        }
    }

    /// Counters per key.
    #[must_use]
    pub fn width(&self) -> usize {
        self.width
    }

    /// Keys seen.
    #[must_use]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// No key seen.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The index of `key`'s first counter, made when new.
    #[inline]
    fn slot(&mut self, key: i64) -> usize {
        let next = self.counts.len();
        let at = *self.slots.entry(key).or_insert(next);
        if at == next {
            self.counts.resize(next + self.width, 0);
        }
        at
    }

    /// Adds `counters` (at most `width` of them) to `key`'s.
    pub fn add(&mut self, key: i64, counters: &[u64]) {
        let at = self.slot(key);
        for (a, b) in self.counts[at..at + self.width].iter_mut().zip(counters) {
            *a += b;
        }
    }

    /// For each row `i` that is valid (bit `offset + i` of `valid`, LSB first; every row
    /// without it): adds 1 to the first counter of `keys[i]`, and 1 to counter `1 + j` for
    /// each `thresholds[j]` that `values[i]` reaches. Thresholds beyond `width - 1` are
    /// not counted.
    ///
    /// # Panics
    /// When `keys` and `values` differ in length or `valid` is too short for them.
    pub fn add_rows(
        &mut self,
        keys: &[i64],
        values: &[i64],
        valid: Option<(&[u8], usize)>,
        thresholds: &[i64],
    ) {
        assert_eq!(keys.len(), values.len(), "one key per value");
        let thresholds = &thresholds[..thresholds.len().min(self.width - 1)];
        // Consecutive rows often share a key (a metric count, a second).
        let mut last: Option<(i64, usize)> = None;
        for (i, (&key, &value)) in keys.iter().zip(values).enumerate() {
            if let Some((bits, offset)) = valid {
                let b = offset + i;
                if bits[b / 8] & (1 << (b % 8)) == 0 {
                    continue;
                }
            }
            let at = match last {
                Some((k, at)) if k == key => at,
                _ => {
                    let at = self.slot(key);
                    last = Some((key, at));
                    at
                }
            };
            let row = &mut self.counts[at..at + 1 + thresholds.len()];
            row[0] += 1;
            for (c, &t) in row[1..].iter_mut().zip(thresholds) {
                *c += u64::from(value >= t);
            }
        }
    }

    /// Adds every key's counters of `other` (of the same width).
    pub fn merge(&mut self, other: &Self) {
        for (k, c) in other.entries() {
            self.add(k, c);
        }
    }

    /// Every key with its counters, keys ascending.
    #[must_use]
    pub fn entries(&self) -> Vec<(i64, &[u64])> {
        let mut out: Vec<(i64, &[u64])> = self
            .slots
            .iter()
            .map(|(&k, &at)| (k, &self.counts[at..at + self.width]))
            .collect();
        out.sort_unstable_by_key(|e| e.0);
        out
    }

    /// Heap bytes held.
    #[must_use]
    pub fn allocated_bytes(&self) -> usize {
        self.counts.capacity() * 8 + self.slots.capacity() * 24
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_add_to_their_keys_counters() {
        let mut t = Tally::new(3);
        let keys = [5, 5, -2, 5, 1 << 40, -2];
        let values = [10, 60, 90, 100, 50, 0];
        // Row 3 is not valid.
        let valid = [0b0011_0111_u8];
        t.add_rows(&keys, &values, Some((&valid, 0)), &[50, 90, 1]);
        assert_eq!(
            t.entries(),
            vec![
                (-2, &[2, 1, 1][..]),
                (5, &[2, 1, 0][..]),
                (1 << 40, &[1, 1, 0][..])
            ]
        );
        let mut u = Tally::new(3);
        u.add_rows(&[5], &[95], None, &[50, 90]);
        u.merge(&t);
        assert_eq!(u.entries()[1], (5, &[3, 2, 1][..]));
        assert_eq!(u.len(), 3);
    }

    #[test]
    fn a_bit_offset_picks_the_rows_bits() {
        let mut t = Tally::new(1);
        // Bits 3.. of 0b1010_1000: rows 0, 2 valid, 1 and 3 not.
        t.add_rows(&[1, 2, 3, 4], &[0; 4], Some((&[0b0010_1000], 3)), &[]);
        let keys: Vec<i64> = t.entries().iter().map(|e| e.0).collect();
        assert_eq!(keys, [1, 3]);
    }
}
