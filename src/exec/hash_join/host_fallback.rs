//! The join of one probe chunk on the host, used when the device cannot
//! take it (the memory budget is too small, the driver is out of memory,
//! or the device failed before the chunk's first pairs). It works on the same encoded keys as the device and hands its
//! pairs to the same host steps, so results are identical; only the place
//! the matching runs differs.

use datafusion::error::Result;

use crate::encode::keys::NormalizedKeys;

/// The build keys sorted, with their row ids, for binary-search probing.
#[derive(Debug)]
pub(crate) struct HostBuildTable {
    keys: Vec<u64>,
    row_ids: Vec<u64>,
}

impl HostBuildTable {
    pub(crate) fn new(build: &NormalizedKeys) -> Self {
        let mut pairs: Vec<(u64, u64)> = build
            .keys
            .iter()
            .enumerate()
            .map(|(i, &k)| {
                let id = build.row_ids.as_ref().map_or(i as u64, |ids| ids[i]);
                (k, id)
            })
            .collect();
        pairs.sort_unstable();
        let (keys, row_ids) = pairs.into_iter().unzip();
        Self { keys, row_ids }
    }

    /// Every (build row, probe row) pair with equal keys, handed to
    /// `on_pairs` in batches of at most `max_pairs` (a key with more build
    /// rows than that is split over several batches).
    pub(crate) fn probe(
        &self,
        probe: &NormalizedKeys,
        max_pairs: usize,
        on_pairs: &mut dyn FnMut(Vec<u64>, Vec<u64>) -> Result<()>,
    ) -> Result<()> {
        let max_pairs = max_pairs.max(1);
        let mut build_ids = Vec::new();
        let mut probe_ids = Vec::new();
        for (i, &key) in probe.keys.iter().enumerate() {
            let probe_id = probe.row_ids.as_ref().map_or(i as u64, |ids| ids[i]);
            let start = self.keys.partition_point(|&k| k < key);
            let end = start + self.keys[start..].partition_point(|&k| k == key);
            for &build_id in &self.row_ids[start..end] {
                build_ids.push(build_id);
                probe_ids.push(probe_id);
                if build_ids.len() == max_pairs {
                    on_pairs(
                        std::mem::take(&mut build_ids),
                        std::mem::take(&mut probe_ids),
                    )?;
                }
            }
        }
        if !build_ids.is_empty() {
            on_pairs(build_ids, probe_ids)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::hash_join::reference;

    #[test]
    fn matches_the_reference_join_with_duplicates_and_row_ids() {
        let build = NormalizedKeys {
            keys: vec![5, 1, 5, 9, 5].into(),
            row_ids: Some(vec![10, 11, 12, 13, 14]),
        };
        let probe = NormalizedKeys {
            keys: vec![5, 2, 9, 5].into(),
            row_ids: None,
        };
        let table = HostBuildTable::new(&build);
        let mut pairs = Vec::new();
        let mut batches = 0;
        table
            .probe(&probe, 2, &mut |b, p| {
                assert!(b.len() <= 2);
                batches += 1;
                pairs.extend(b.into_iter().zip(p));
                Ok(())
            })
            .unwrap();
        pairs.sort_unstable();
        let expected = reference::hash_join(
            &build.keys,
            build.row_ids.as_ref().unwrap(),
            &probe.keys,
            &[0, 1, 2, 3],
        );
        assert_eq!(pairs, expected);
        assert_eq!(batches, 4); // 7 pairs in batches of at most 2
    }

    #[test]
    fn only_memory_errors_count_as_out_of_device_memory() {
        use crate::gpu::GpuError;
        assert!(GpuError::OutOfDeviceMemory {
            requested: 10,
            limit: 1,
            in_use: 0
        }
        .is_out_of_device_memory());
        assert!(!GpuError::Invalid("x".into()).is_out_of_device_memory());
    }
}
