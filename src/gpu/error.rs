//! Errors of the GPU layer, converted once into [`DataFusionError`] at the
//! boundary with DataFusion.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::DriverError;
use datafusion::error::DataFusionError;

/// Why no GPU can be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuUnavailable(pub String);

impl fmt::Display for GpuUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no GPU: {}", self.0)
    }
}

impl std::error::Error for GpuUnavailable {}

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

    /// Whether the error broke the context it happened in for good (a kernel
    /// fault: an illegal address or instruction, a failed launch): every
    /// later call on that context fails the same way, so the runtime opens
    /// the device again for later work.
    pub fn breaks_context(&self) -> bool {
        matches!(self, GpuError::Driver { source, .. } if breaks_context(source.0))
    }
}

/// The driver's "sticky" errors: the context that saw one cannot be used
/// again, only replaced.
fn breaks_context(code: cudarc::driver::sys::CUresult) -> bool {
    use cudarc::driver::sys::CUresult::*;
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

/// Context-breaking errors seen in this process, so the runtime knows when
/// to check its devices' contexts (see [`GpuError::breaks_context`]).
static CONTEXT_FAULTS: AtomicU64 = AtomicU64::new(0);

/// How many context-breaking driver errors this process has seen.
pub(crate) fn context_faults_seen() -> u64 {
    CONTEXT_FAULTS.load(Ordering::Acquire)
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
        self.map_err(|source| {
            if breaks_context(source.0) {
                CONTEXT_FAULTS.fetch_add(1, Ordering::AcqRel);
            }
            GpuError::Driver { during, source }
        })
    }
}

#[cfg(test)]
mod tests {
    use cudarc::driver::sys::CUresult;
    use cudarc::driver::DriverError;

    use super::*;

    fn driver_error(code: CUresult) -> Result<(), DriverError> {
        Err(DriverError(code))
    }

    #[test]
    fn kernel_faults_break_the_context_and_are_counted_where_they_pass() {
        let before = context_faults_seen();
        let fault = driver_error(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)
            .during("waiting for a kernel")
            .unwrap_err();
        assert!(fault.breaks_context());
        assert!(!fault.is_out_of_device_memory());
        assert!(context_faults_seen() > before);
        let launch = driver_error(CUresult::CUDA_ERROR_LAUNCH_FAILED).during("launching");
        assert!(launch.unwrap_err().breaks_context());

        // Errors that leave the context usable are not counted.
        let seen = context_faults_seen();
        for code in [
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            CUresult::CUDA_ERROR_INVALID_VALUE,
            CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        ] {
            let error = driver_error(code).during("allocating").unwrap_err();
            assert!(!error.breaks_context(), "{error}");
        }
        assert!(!GpuError::Invalid("x".into()).breaks_context());
        // (No other unit test meets a context-breaking error.)
        assert_eq!(context_faults_seen(), seen);
    }
}
