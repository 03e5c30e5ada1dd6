//! `trace_counts(stream, publisher, complete, flags, missing_mask, sequence)`
//! ([`trace_counts_udaf`]): rows, complete rows, the rows with each bit of `flags` and of
//! `missing_mask` set, the distinct streams and publishers, and the distinct trace keys
//! (publisher, stream, sequence) with the rows that repeat one, as a [`TraceCounts`] in
//! its compact binary encoding ([`TraceCounts::decode`] reads it; the encoding is this
//! module's own and may change between versions: it is not for storing).

mod sets;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use datafusion::arrow::datatypes::{
    ArrowNativeType, ArrowPrimitiveType, DataType, Int64Type, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::AggregateUDF;
use hoptrace_format::varint::{DecodeError, Reader, put};

use crate::binary_agg::{self, BinaryState, corrupt};
use sets::{BITMAP_IDS, IdSet, KeySet};

/// First byte of an encoded [`TraceCounts`].
const COUNTS_TAG: u8 = 0x54;

/// Figures of a run's small columns, from `trace_counts`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceCounts {
    /// Rows.
    pub rows: u64,
    /// Rows whose `complete` argument is true.
    pub complete: u64,
    /// Rows with each bit of `flags` set.
    pub flag_bits: Vec<u64>,
    /// Rows with each bit of `missing_mask` set.
    pub missing_bits: Vec<u64>,
    streams: IdSet,
    publishers: IdSet,
    keys: KeySet,
}

/// An id, flag or mask of any integer type as a u64 (negative ones wrap around: they
/// stay distinct, and their bits are their two's complement).
#[inline(always)]
fn to_u64<N: ArrowNativeType>(v: N) -> u64 {
    v.as_usize() as u64
}

/// Adds the rows with each bit set to `bits[bit]`, over the valid values.
fn count_bits<T: ArrowPrimitiveType>(bits: &mut Vec<u64>, values: &PrimitiveArray<T>) {
    let raw = values.values();
    let nulls = values.nulls().filter(|n| n.null_count() > 0);
    let any = match nulls {
        None => raw.iter().fold(0, |a, &v| a | to_u64(v)),
        Some(n) => n.valid_indices().fold(0, |a, i| a | to_u64(raw[i])),
    };
    // Flags and masks are mostly zero: only the bits seen at all are counted.
    let mut rest = any;
    while rest != 0 {
        let b = rest.trailing_zeros() as usize;
        rest &= rest - 1;
        let set = |v: T::Native| (to_u64(v) >> b) & 1 != 0;
        let n = match nulls {
            None => raw.iter().filter(|&&v| set(v)).count(),
            Some(n) => n.valid_indices().filter(|&i| set(raw[i])).count(),
        };
        if bits.len() <= b {
            bits.resize(b + 1, 0);
        }
        bits[b] += n as u64;
    }
}

fn insert_ids<T: ArrowPrimitiveType>(set: &mut IdSet, values: &PrimitiveArray<T>) {
    if values.null_count() > 0 {
        for (i, &v) in values.values().iter().enumerate() {
            if values.is_valid(i) {
                set.insert(to_u64(v));
            }
        }
        return;
    }
    let raw = values.values();
    let (min, max) = raw.iter().fold((u64::MAX, 0), |(lo, hi), &v| {
        let v = to_u64(v);
        (lo.min(v), hi.max(v))
    });
    if min == max {
        // One id throughout (a single publisher).
        set.insert(min);
    } else if let IdSet::Bits(words) = set
        && max < BITMAP_IDS
    {
        let need = (max >> 6) as usize + 1;
        if words.len() < need {
            words.resize(need, 0);
        }
        // Ids in one word (streams in turn) gather in a register first.
        let (mut word, mut gathered) = (usize::MAX, 0_u64);
        for &v in raw.iter() {
            let v = to_u64(v);
            let w = (v >> 6) as usize;
            if w != word {
                if let Some(old) = words.get_mut(word) {
                    *old |= gathered;
                }
                (word, gathered) = (w, 0);
            }
            gathered |= 1 << (v & 63);
        }
        if let Some(old) = words.get_mut(word) {
            *old |= gathered;
        }
    } else {
        raw.iter().for_each(|&v| set.insert(to_u64(v)));
    }
}

/// Calls `$f` with `$array` as the primitive array of its integer type.
macro_rules! with_integers {
    ($array:expr, $f:ident, $($arg:expr),*) => {
        match $array.data_type() {
            DataType::UInt8 => $f($($arg,)* $array.as_primitive::<UInt8Type>()),
            DataType::UInt16 => $f($($arg,)* $array.as_primitive::<UInt16Type>()),
            DataType::UInt32 => $f($($arg,)* $array.as_primitive::<UInt32Type>()),
            DataType::UInt64 => $f($($arg,)* $array.as_primitive::<UInt64Type>()),
            DataType::Int64 => $f($($arg,)* $array.as_primitive::<Int64Type>()),
            other => return exec_err!("trace_counts: unexpected argument type {other}"),
        }
    };
}

impl TraceCounts {
    /// Distinct streams.
    #[must_use]
    pub fn streams(&self) -> u64 {
        self.streams.len()
    }

    /// Distinct publishers.
    #[must_use]
    pub fn publishers(&self) -> u64 {
        self.publishers.len()
    }

    /// Distinct trace keys (publisher, stream, sequence).
    #[must_use]
    pub fn distinct_keys(&self) -> u64 {
        self.keys.keys
    }

    /// Rows whose trace key an earlier row already had: `rows - distinct_keys`.
    #[must_use]
    pub fn repeated_keys(&self) -> u64 {
        self.keys.repeated
    }

    /// Rows with bit `bit` of `flags` set.
    #[must_use]
    pub fn flag(&self, bit: usize) -> u64 {
        self.flag_bits.get(bit).copied().unwrap_or(0)
    }

    /// Rows with bit `bit` of `missing_mask` set.
    #[must_use]
    pub fn missing(&self, bit: usize) -> u64 {
        self.missing_bits.get(bit).copied().unwrap_or(0)
    }

    fn add_batch(&mut self, cols: &[ArrayRef]) -> Result<()> {
        let [stream, publisher, complete, flags, missing, sequence] = cols else {
            return plan_err!("trace_counts takes six arguments");
        };
        self.rows += stream.len() as u64;
        let complete = complete.as_boolean();
        self.complete += match complete.nulls() {
            Some(n) => (complete.values() & n.inner()).count_set_bits(),
            None => complete.values().count_set_bits(),
        } as u64;
        with_integers!(stream, insert_ids, &mut self.streams);
        with_integers!(publisher, insert_ids, &mut self.publishers);
        with_integers!(flags, count_bits, &mut self.flag_bits);
        with_integers!(missing, count_bits, &mut self.missing_bits);
        let [p, st, q] = [publisher, stream, sequence]
            .map(|c| datafusion::arrow::compute::cast(c, &DataType::UInt64));
        let (p, st, q) = (p?, st?, q?);
        let (p, st, q) = (
            p.as_primitive::<UInt64Type>(),
            st.as_primitive::<UInt64Type>(),
            q.as_primitive::<UInt64Type>(),
        );
        self.keys.insert_rows(p, st, q);
        Ok(())
    }

    fn add_counts(&mut self, other: &Self) {
        self.rows += other.rows;
        self.complete += other.complete;
        for (mine, theirs) in [
            (&mut self.flag_bits, &other.flag_bits),
            (&mut self.missing_bits, &other.missing_bits),
        ] {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0);
            }
            for (a, b) in mine.iter_mut().zip(theirs) {
                *a += b;
            }
        }
        self.streams.merge(&other.streams);
        self.publishers.merge(&other.publishers);
        self.keys.merge(&other.keys);
    }

    /// The binary form `trace_counts` returns.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![COUNTS_TAG];
        put(&mut out, self.rows);
        put(&mut out, self.complete);
        for bits in [&self.flag_bits, &self.missing_bits] {
            put(&mut out, bits.len() as u64);
            bits.iter().for_each(|&b| put(&mut out, b));
        }
        self.streams.encode(&mut out);
        self.publishers.encode(&mut out);
        self.keys.encode(&mut out);
        out
    }

    /// Reads [`TraceCounts::encode`]'s bytes.
    ///
    /// # Errors
    /// When `bytes` are not such an encoding.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        Self::read(bytes).map_err(|_| corrupt("trace_counts"))
    }

    fn read(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.byte()? != COUNTS_TAG {
            return Err(DecodeError);
        }
        let rows = r.varint()?;
        let complete = r.varint()?;
        let mut bits = || -> Result<Vec<u64>, DecodeError> {
            let n = r.varint()?;
            if n > 64 {
                return Err(DecodeError);
            }
            (0..n).map(|_| r.varint()).collect()
        };
        let flag_bits = bits()?;
        let missing_bits = bits()?;
        let streams = IdSet::decode(&mut r)?;
        let publishers = IdSet::decode(&mut r)?;
        let keys = KeySet::decode(&mut r)?;
        r.finish()?;
        Ok(Self {
            rows,
            complete,
            flag_bits,
            missing_bits,
            streams,
            publishers,
            keys,
        })
    }
}

/// The `trace_counts` aggregate (not registered in sessions: its result is this module's
/// own encoding, read with [`TraceCounts::decode`]).
#[must_use]
pub fn trace_counts_udaf() -> AggregateUDF {
    binary_agg::udaf::<TraceCounts>()
}

impl BinaryState for TraceCounts {
    const NAME: &'static str = "trace_counts";
    const STATE: &'static str = "counts";
    // One group (the whole run): no groups accumulator.
    const GROUPED: bool = false;

    fn coerce(arg_types: &[DataType]) -> Result<Vec<DataType>> {
        // Unsigned integers are read as they are; signed ones as Int64.
        let int = |t: &DataType| match t {
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
                Ok(t.clone())
            }
            DataType::Null => Ok(DataType::UInt64),
            t if t.is_integer() => Ok(DataType::Int64),
            t => plan_err!("trace_counts: ids, flags and masks are integers, not {t}"),
        };
        match arg_types {
            [stream, publisher, complete, flags, missing, sequence] => {
                if !matches!(complete, DataType::Boolean | DataType::Null) {
                    return plan_err!("trace_counts: `complete` is a boolean, not {complete}");
                }
                Ok(vec![
                    int(stream)?,
                    int(publisher)?,
                    DataType::Boolean,
                    int(flags)?,
                    int(missing)?,
                    int(sequence)?,
                ])
            }
            _ => plan_err!("trace_counts takes six arguments"),
        }
    }

    fn update(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.add_batch(values)
    }

    fn merge(&mut self, other: &Self) {
        self.add_counts(other);
    }

    fn encode(&self) -> Vec<u8> {
        TraceCounts::encode(self)
    }

    fn decode(bytes: &[u8]) -> Result<Self> {
        TraceCounts::decode(bytes)
    }

    fn allocated_bytes(&self) -> usize {
        let set = |s: &IdSet| match s {
            IdSet::Bits(w) => w.capacity() * 8,
            IdSet::Hashed(h) => h.capacity() * 16,
        };
        set(&self.streams) + set(&self.publishers) + self.keys.bytes()
    }
}

#[cfg(test)]
mod tests;
