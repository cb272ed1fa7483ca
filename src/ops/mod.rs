//! Algorithms on device columns, knowing nothing of DataFusion: exclusive
//! scan, radix partitioning, the partitioned hash join, the sort-merge join
//! and the hash group-by. Each has a plain
//! CPU reference implementation in its `reference` module, used by tests to
//! check the device results exactly.

pub mod gather;
pub mod group_by;
pub mod hash_join;
pub mod join_tasks;
pub mod merge_join;
pub mod pair_order;
pub mod radix;
pub mod scan;
pub mod scan_filter;

#[cfg(any(test, feature = "test-support"))]
/// The device's key hash, `mix64` in `ptx/common.cuh`: MurmurHash3's 64-bit
/// finalizer of the key XOR the process's hash seed
/// ([`crate::gpu::launch::hash_seed`]). A bijection, so distinct keys never
/// share all 64 bits.
pub fn mix64(key: u64) -> u64 {
    murmur3_finalizer(key ^ crate::gpu::launch::hash_seed())
}

#[cfg(any(test, feature = "test-support"))]
/// MurmurHash3's 64-bit finalizer.
pub fn murmur3_finalizer(mut key: u64) -> u64 {
    key ^= key >> 33;
    key = key.wrapping_mul(0xff51_afd7_ed55_8ccd);
    key ^= key >> 33;
    key = key.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    key ^= key >> 33;
    key
}

#[cfg(any(test, feature = "test-support"))]
/// The key that [`murmur3_finalizer`] takes to `hash`: how an adversary
/// who knew the hash would pick keys that share a partition.
pub fn murmur3_finalizer_inverse(mut hash: u64) -> u64 {
    // The inverse of an odd multiplier modulo 2^64, by Newton's iteration.
    let inverse = |m: u64| {
        let mut x = m;
        for _ in 0..6 {
            x = x.wrapping_mul(2u64.wrapping_sub(m.wrapping_mul(x)));
        }
        x
    };
    // `k ^= k >> 33` undoes itself: the shift is more than half the width.
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(inverse(0xc4ce_b9fe_1a85_ec53));
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(inverse(0xff51_afd7_ed55_8ccd));
    hash ^= hash >> 33;
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix64_is_a_bijection_on_a_sample() {
        let mut seen: Vec<u64> = (0..100_000u64).map(mix64).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 100_000);
    }

    #[test]
    fn the_finalizer_matches_murmur3_and_its_inverse_undoes_it() {
        // fmix64(1) from the reference MurmurHash3 implementation.
        assert_eq!(murmur3_finalizer(1), 0xb456_bcfc_34c2_cb2c);
        assert_eq!(murmur3_finalizer(0), 0);
        for k in [0, 1, 7, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(murmur3_finalizer_inverse(murmur3_finalizer(k)), k);
            assert_eq!(murmur3_finalizer(murmur3_finalizer_inverse(k)), k);
        }
    }

    #[test]
    fn keys_aimed_at_one_partition_of_the_unseeded_hash_spread_under_the_seed() {
        // 2^16 keys whose unseeded hashes all end in 16 zero bits: one
        // partition of 2^10. Under the seed they fill every partition,
        // none with more than twice its share.
        let keys: Vec<u64> = (0..1u64 << 16)
            .map(|i| murmur3_finalizer_inverse(i << 16))
            .collect();
        assert!(keys.iter().all(|&k| murmur3_finalizer(k) & 0xffff == 0));
        let mut partitions = vec![0usize; 1 << 10];
        for &k in &keys {
            partitions[(mix64(k) & 1023) as usize] += 1;
        }
        let share = keys.len() / partitions.len();
        assert!(
            partitions.iter().all(|&n| n > 0 && n <= 2 * share),
            "seed {:#x}: partitions from {} to {} keys",
            crate::gpu::launch::hash_seed(),
            partitions.iter().min().unwrap(),
            partitions.iter().max().unwrap()
        );
    }
}
