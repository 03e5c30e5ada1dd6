//! Where a trace's records go among a topic's partitions: the key hash Kafka's default
//! partitioner applies, so that the collector's relay, the group members and the written-key
//! sets agree with the producers on which partition holds a trace.

use hoptrace_protocol::TraceKey;

/// MurmurHash2 as Kafka's default partitioner computes it for a keyed record (seed
/// `0x9747b28c`, 4-byte little-endian blocks).
#[must_use]
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    let len = u32::try_from(data.len()).expect("a key shorter than 4 GiB");
    let mut h = SEED ^ len;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        let mut k = u32::from_le_bytes(b.try_into().expect("4 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = blocks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if let Some(&b) = tail.first() {
        h ^= u32::from(b);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h.cast_signed()
}

/// The partition of `partitions` that a record keyed by `key` (its
/// [`TraceKey::to_le_bytes`]) goes to, as Kafka's default partitioner places it:
/// `(murmur2(key bytes) & 0x7fffffff) % partitions`.
#[must_use]
pub fn partition_of(key: &TraceKey, partitions: i32) -> i32 {
    (murmur2(&key.to_le_bytes()) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafkas_partitioner() {
        // Values of org.apache.kafka.common.utils.Utils.murmur2 (Kafka's own tests).
        for (input, want) in [
            (&b"21"[..], -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ] {
            assert_eq!(murmur2(input), want, "{}", String::from_utf8_lossy(input));
        }
    }
}
