//! Errors of the GPU layer, converted once into [`DataFusionError`] at the
//! boundary with DataFusion.

use std::fmt;

use cudarc::driver::DriverError;
use datafusion::error::DataFusionError;

/// Result of a GPU-layer operation.
pub type GpuResult<T> = Result<T, GpuError>;

/// Everything that can go wrong below the DataFusion operators.
#[derive(Debug)]
pub enum GpuError {
    /// No usable GPU: no driver library, no device, or a device that failed to
    /// initialise. The string says which.
    Unavailable(String),
    /// A CUDA driver call failed.
    Driver {
        /// What the crate was doing, e.g. "copying probe keys to the device".
        during: &'static str,
        /// The driver's error code and message.
        source: DriverError,
    },
    /// The work needs more device memory than the budget allows.
    OutOfDeviceMemory {
        /// Bytes asked for.
        requested: usize,
        /// The budget in force for this request.
        limit: usize,
        /// Bytes held by other reservations when the request failed.
        in_use: usize,
    },
    /// A caller broke a contract of this layer (a size that does not fit).
    Invalid(String),
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::Unavailable(reason) => write!(f, "no GPU: {reason}"),
            GpuError::Driver { during, source } => {
                write!(f, "CUDA driver error while {during}: {source}")
            }
            GpuError::OutOfDeviceMemory { requested, limit, in_use } => write!(
                f,
                "GPU memory budget exceeded: {requested} bytes requested, {in_use} of {limit} bytes in use \
                 (raise gpu.memory_fraction or lower gpu.tuning.probe_chunk_rows)"
            ),
            GpuError::Invalid(msg) => write!(f, "invalid GPU operation: {msg}"),
        }
    }
}

impl GpuError {
    /// Whether the device lacks memory for the work, which DataFusion's CPU
    /// operators can then do instead, rather than a fault to report.
    pub fn is_out_of_device_memory(&self) -> bool {
        match self {
            GpuError::OutOfDeviceMemory { .. } => true,
            GpuError::Driver { source, .. } => {
                source.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
            }
            _ => false,
        }
    }
}

impl std::error::Error for GpuError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GpuError::Driver { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<GpuError> for DataFusionError {
    fn from(err: GpuError) -> Self {
        match err {
            GpuError::OutOfDeviceMemory { .. } => {
                DataFusionError::ResourcesExhausted(err.to_string())
            }
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

/// Attaches what the crate was doing to a driver error.
pub trait DriverResultExt<T> {
    /// Maps `Err(DriverError)` to [`GpuError::Driver`] with `during`.
    fn during(self, during: &'static str) -> GpuResult<T>;
}

impl<T> DriverResultExt<T> for Result<T, DriverError> {
    fn during(self, during: &'static str) -> GpuResult<T> {
        self.map_err(|source| GpuError::Driver { during, source })
    }
}
