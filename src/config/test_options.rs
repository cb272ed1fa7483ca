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
        /// Make a device error end the query instead of sending the work to
        /// the CPU operator, so that a test sees a kernel's fault.
        pub device_errors_fail: bool, default = false
        /// Make every GPU aggregation's device part, and every GPU join's
        /// before it starts (a hash join's probe chunk, a sort-merge join's
        /// partition), report an error before any output: the path a
        /// device fault takes.
        pub inject_device_error: bool, default = false
        /// String and binary value bytes a hash join's probe chunk stays
        /// within (0: the built-in bound, 1 GiB): small, a probe side of
        /// strings comes in many chunks.
        pub max_probe_chunk_bytes: usize, default = 0
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

/// What a device error does in this session ([`super::DeviceErrorPolicy`]).
pub(crate) fn device_error_policy(config: &ConfigOptions) -> super::DeviceErrorPolicy {
    config
        .extensions
        .get::<GpuTestOptions>()
        .map_or_else(Default::default, |options| super::DeviceErrorPolicy {
            fail: options.device_errors_fail,
            inject: options.inject_device_error,
        })
}

/// The bound on a hash join's probe chunk bytes a test set, if any.
pub(crate) fn max_probe_chunk_bytes(config: &ConfigOptions) -> Option<usize> {
    config
        .extensions
        .get::<GpuTestOptions>()
        .map(|options| options.max_probe_chunk_bytes)
        .filter(|&bytes| bytes > 0)
}
