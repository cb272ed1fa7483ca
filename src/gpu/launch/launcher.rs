//! What every launch takes, in one value.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::Kernels;

/// What every launch takes: the kernels, the stream they run on in order,
/// and the device's multiprocessor count, which sizes grid-stride grids.
/// Made by [`crate::gpu::GpuDevice::launcher`] for one of the device's
/// streams.
#[derive(Clone, Copy)]
pub struct Launcher<'a> {
    pub(super) kernels: &'a Kernels,
    pub(super) stream: &'a Arc<CudaStream>,
    pub(super) sm_count: u32,
}

impl<'a> Launcher<'a> {
    /// Launches of `kernels` on `stream`, on a device of `sm_count`
    /// multiprocessors.
    pub fn new(kernels: &'a Kernels, stream: &'a Arc<CudaStream>, sm_count: u32) -> Self {
        Self {
            kernels,
            stream,
            sm_count,
        }
    }
}
