//! Detection of the GPUs, once per process. Never panics: a machine without
//! the NVIDIA driver, without a device, or with `CUDA_VISIBLE_DEVICES` empty
//! gets a [`GpuUnavailable`] with the reason, and queries run on the CPU.

use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaContext;

use super::{GpuDevice, GpuError};

/// Why no GPU can be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuUnavailable(pub String);

impl fmt::Display for GpuUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no GPU: {}", self.0)
    }
}

impl std::error::Error for GpuUnavailable {}

/// The GPUs of this process.
#[derive(Debug)]
pub struct GpuRuntime {
    devices: Vec<Arc<GpuDevice>>,
}

impl GpuRuntime {
    /// Every usable device, at least one.
    pub fn devices(&self) -> &[Arc<GpuDevice>] {
        &self.devices
    }

    /// The device that serves DataFusion partition `partition`: partitions are
    /// spread round-robin over the devices.
    pub fn device_for_partition(&self, partition: usize) -> &Arc<GpuDevice> {
        &self.devices[partition % self.devices.len()]
    }

    /// One line per device, for logs and examples.
    pub fn describe(&self) -> String {
        self.devices
            .iter()
            .map(|d| {
                let (major, minor) = d.compute_capability();
                format!(
                    "GPU {}: {} (sm_{major}{minor}, {} SMs, {:.1} GiB)",
                    d.ordinal(),
                    d.name(),
                    d.sm_count(),
                    d.total_memory() as f64 / (1u64 << 30) as f64
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

static RUNTIME: OnceLock<Result<Arc<GpuRuntime>, GpuUnavailable>> = OnceLock::new();

/// The process's GPUs, detected on first use.
pub fn gpu_runtime() -> Result<Arc<GpuRuntime>, GpuUnavailable> {
    RUNTIME.get_or_init(detect).clone()
}

/// `Ok(())` when a GPU can be used, otherwise the reason: the form the
/// planner's decisions take.
pub fn gpu_availability() -> Result<(), String> {
    gpu_runtime().map(|_| ()).map_err(|e| e.0)
}

fn detect() -> Result<Arc<GpuRuntime>, GpuUnavailable> {
    if let Ok(visible) = std::env::var("CUDA_VISIBLE_DEVICES") {
        if visible.trim().is_empty() {
            return Err(GpuUnavailable(
                "CUDA_VISIBLE_DEVICES is set and empty".into(),
            ));
        }
    }
    // SAFETY: only tries to dlopen the driver library; no symbol is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuUnavailable(
            "the NVIDIA driver library (libcuda.so) was not found".into(),
        ));
    }
    // cudarc resolves each driver symbol on first use and panics if a symbol
    // is missing (a driver older than CUDA 13.0); turn that into a reason.
    match std::panic::catch_unwind(open_devices) {
        Ok(result) => result.map(Arc::new),
        Err(_) => Err(GpuUnavailable(
            "the NVIDIA driver lacks a CUDA 13.0 entry point (driver 580 or newer is needed)"
                .into(),
        )),
    }
}

fn open_devices() -> Result<GpuRuntime, GpuUnavailable> {
    let count = CudaContext::device_count()
        .map_err(|e| GpuUnavailable(format!("the CUDA driver failed to initialise: {e}")))?;
    if count <= 0 {
        return Err(GpuUnavailable("the CUDA driver reports no device".into()));
    }
    let mut devices = Vec::new();
    let mut first_error: Option<GpuError> = None;
    for ordinal in 0..count as usize {
        match GpuDevice::open(ordinal) {
            Ok(device) => devices.push(Arc::new(device)),
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    if devices.is_empty() {
        let reason = first_error.map(|e| e.to_string()).unwrap_or_default();
        return Err(GpuUnavailable(format!(
            "no device could be opened: {reason}"
        )));
    }
    Ok(GpuRuntime { devices })
}
