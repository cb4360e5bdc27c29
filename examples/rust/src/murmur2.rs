//! Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`) and its default
//! partitioner, as Headwater uses them (`headwater.client.partitioner`): a keyed record
//! goes to `(murmur2(key) & 0x7fffffff) % partitions`, so a key lands on the same
//! partition number here, in Headwater's Python client, in the broker (ProduceRequest
//! with `records` and partition -1) and in Kafka.

const SEED: u32 = 0x9747_b28c;
const M: u32 = 0x5bd1_e995;
const R: u32 = 24;

/// Kafka's murmur2 of `data`, as the signed 32-bit value Kafka's Java code returns.
pub fn murmur2(data: &[u8]) -> i32 {
    let length = data.len();
    // Kafka hashes an int length: keys are far shorter than 2^32 bytes.
    let mut h: u32 = SEED ^ (length as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let rest = chunks.remainder();
    if rest.len() == 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's (and Headwater's) default partitioner picks for `key` among
/// `partitions` (which must be positive).
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    ((murmur2(key) & 0x7fff_ffff) as u32) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values computed with Headwater's Python implementation:
    /// `from headwater.client.partitioner import murmur2, partition_for_key`.
    #[test]
    fn matches_the_python_client() {
        let all_bytes: Vec<u8> = (0..=255).collect();
        let cases: [(&[u8], i32, u32, u32); 10] = [
            (b"", 275_646_681, 0, 2),
            (b"a", -1_563_381_124, 1, 5),
            (b"ab", 316_155_434, 2, 0),
            (b"abc", 479_470_107, 0, 4),
            (b"abcd", -1_323_649_548, 2, 5),
            (b"hello", 2_132_663_229, 0, 4),
            (b"key-0", 29_210_041, 1, 0),
            (b"order-42", 501_153_024, 0, 1),
            (&all_bytes, -1_948_347_274, 1, 3),
            (b"\xff\xfe\xfd", 998_637_092, 2, 5),
        ];
        for (key, hash, of_3, of_7) in cases {
            assert_eq!(murmur2(key), hash, "murmur2({key:?})");
            assert_eq!(
                partition_for_key(key, 3),
                of_3,
                "partition of {key:?} among 3"
            );
            assert_eq!(
                partition_for_key(key, 7),
                of_7,
                "partition of {key:?} among 7"
            );
        }
    }

    #[test]
    fn one_partition_takes_every_key() {
        for key in [&b""[..], b"x", b"a longer key than four bytes"] {
            assert_eq!(partition_for_key(key, 1), 0);
        }
    }
}
