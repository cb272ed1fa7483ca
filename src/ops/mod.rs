//! Algorithms on device columns, knowing nothing of DataFusion: exclusive
//! scan, radix partitioning, the partitioned hash join, the sort-merge join
//! and the hash group-by. Each has a plain
//! CPU reference implementation in its `reference` module, used by tests to
//! check the device results exactly.

pub mod gather;
pub mod group_by;
pub mod hash_join;
pub mod merge_join;
pub mod radix;
pub mod scan;

#[cfg(any(test, feature = "test-support"))]
/// MurmurHash3's 64-bit finalizer, the same function as `mix64` in
/// `ptx/common.cuh`: a bijection, so distinct keys never share all 64 bits.
pub fn mix64(mut key: u64) -> u64 {
    key ^= key >> 33;
    key = key.wrapping_mul(0xff51_afd7_ed55_8ccd);
    key ^= key >> 33;
    key = key.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    key ^= key >> 33;
    key
}

#[cfg(test)]
mod tests {
    use super::mix64;

    #[test]
    fn mix64_is_a_bijection_on_a_sample() {
        let mut seen: Vec<u64> = (0..100_000u64).map(mix64).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 100_000);
    }

    #[test]
    fn mix64_matches_the_murmur3_finalizer() {
        // fmix64(1) from the reference MurmurHash3 implementation.
        assert_eq!(mix64(1), 0xb456_bcfc_34c2_cb2c);
        assert_eq!(mix64(0), 0);
    }
}
