//! The process's hash seed, and its copy into each PTX module's constant.

use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaStream};

use crate::gpu::{DriverResultExt, GpuError, GpuResult};

/// The process's hash seed: drawn once, at random, for every key the
/// device hashes into a partition or a table slot (`mix64` in
/// `ptx/common.cuh` hashes the key XOR it), so that no key set chosen
/// in advance lands in one partition or one probe chain.
pub fn hash_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        use std::hash::BuildHasher;
        // The standard library's randomly keyed hasher: random per process.
        std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
    })
}

/// Writes [`hash_seed`] into `module`'s `hash_seed` constant, and waits
/// for the copy, before any kernel of the module runs.
pub(super) fn set_hash_seed(module: &Arc<CudaModule>, stream: &Arc<CudaStream>) -> GpuResult<()> {
    let mut constant = module
        .get_global("hash_seed", stream)
        .during("finding the hash seed in the PTX")?;
    let seed = hash_seed().to_le_bytes();
    if constant.len() != seed.len() {
        return Err(GpuError::Invalid(format!(
            "the PTX's hash seed is {} bytes, not {}",
            constant.len(),
            seed.len()
        )));
    }
    stream
        .memcpy_htod(&seed, &mut constant)
        .during("setting the hash seed")?;
    stream.synchronize().during("setting the hash seed")
}
