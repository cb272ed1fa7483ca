//! Settings for the crate's own tests, under the prefix `gpu_test`, present
//! only with the `test-support` feature: they make rare paths happen on
//! purpose and are no user's choice.

use datafusion::common::config::ConfigExtension;
use datafusion::common::extensions_options;
use datafusion::config::ConfigOptions;

extensions_options! {
    /// Test-only settings (`SET gpu_test.<name>`).
    pub struct GpuTestOptions {
        /// The low bits of each hashed group key that the device groups by,
        /// 1 to 64: fewer make different keys share a hash, so that the
        /// host's check of hashed keys sends partitions to the CPU operator.
        pub hashed_group_key_bits: u32, default = 64
    }
}

impl ConfigExtension for GpuTestOptions {
    const PREFIX: &'static str = "gpu_test";
}

/// The bits of a hashed group key the device groups by in this session.
pub(crate) fn hashed_group_key_bits(config: &ConfigOptions) -> u32 {
    config
        .extensions
        .get::<GpuTestOptions>()
        .map_or(64, |options| options.hashed_group_key_bits)
}
