//! Exclusive prefix sum of u64 on the device (offsets for radix scatter and
//! for join output).

use std::sync::Arc;

use crate::gpu::alloc_zeroed;
use crate::gpu::launch::{self, SCAN_TILE};
use crate::gpu::{DeviceVec, GpuDevice, GpuResult};
use crate::gpu::DeviceStream;

/// Replaces `values[..n]` by its exclusive prefix sum: tiles are scanned in
/// one launch, their totals are scanned recursively, then added back.
pub fn exclusive_scan(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    values: &mut DeviceVec<u64>,
    n: usize,
) -> GpuResult<()> {
    if n == 0 {
        return Ok(());
    }
    let tiles = n.div_ceil(SCAN_TILE);
    let mut tile_totals = alloc_zeroed::<u64>(stream, tiles, "allocating scan tile totals")?;
    launch::scan_tiles(&device.launcher(stream), values, n, &mut tile_totals)?;
    if tiles > 1 {
        exclusive_scan(device, stream, &mut tile_totals, tiles)?;
        launch::scan_add_tile_offsets(&device.launcher(stream), values, n, &tile_totals)?;
    }
    Ok(())
}

/// CPU references.
#[cfg(any(test, feature = "test-support"))]
pub mod reference {
    /// Exclusive prefix sum.
    pub fn exclusive_scan(values: &[u64]) -> Vec<u64> {
        let mut running = 0u64;
        values
            .iter()
            .map(|v| {
                let start = running;
                running += v;
                start
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reference_scan_is_exclusive() {
        assert_eq!(
            super::reference::exclusive_scan(&[3, 0, 2, 5]),
            vec![0, 3, 3, 5]
        );
        assert!(super::reference::exclusive_scan(&[]).is_empty());
    }
}
