//! The GPU runtime over cudarc: detection, one context per device, the PTX
//! modules, streams, a device memory budget, pinned staging buffers, pinned
//! regions that tables are copied into, and event timing. This is the only layer that names
//! cudarc; everything above it sees [`GpuDevice`], typed launch helpers and
//! [`GpuError`].

mod budget;
mod calibration;
mod column;
mod column_cache;
mod device;
mod device_slot;
mod error;
mod host_pages;
pub mod launch;
mod memory;
mod pinned;
mod pinned_region;
mod pinned_words;
mod runtime;
mod timing;
mod transfer;

pub use budget::{DeviceBudget, DeviceReservation, ReservationKind};
pub use calibration::DeviceConstants;
pub use column::{DeviceColumn, HostColumn};
pub use column_cache::{CachedColumn, WordKind};
#[cfg(any(test, feature = "test-support"))]
pub use column_cache::{ColumnCache, ColumnCacheStats};
pub use device::{Admission, GpuDevice};
#[cfg(any(test, feature = "test-support"))]
pub use device::PooledStream;
pub use error::{DriverResultExt, GpuError, GpuResult, GpuUnavailable};
pub use host_pages::zeroed_for_fill;
pub use memory::{
    alloc_uninit, alloc_zeroed, empty_device_vec, DeviceEvent, DeviceStream, DeviceVec, DeviceView,
};
#[cfg(any(test, feature = "test-support"))]
pub use pinned::PinnedStats;
pub use pinned::{FillingBuffer, LandedBuffer, PinnedBuffer, PinnedPool};
#[cfg(any(test, feature = "test-support"))]
pub use pinned::IDLE_LIMIT_BYTES as PINNED_IDLE_LIMIT_BYTES;
pub(crate) use pinned_region::{region_holding, PinnedRegion};
pub use runtime::{gpu_availability, gpu_runtime};
#[cfg(any(test, feature = "test-support"))]
pub use runtime::GpuRuntime;
pub use timing::{Phase, PhaseTimer, PhaseTimes};
pub use transfer::{
    download_byte_pieces, download_u64, download_widened_pieces, download_word, enqueue_download,
    in_pinned_memory, upload_byte_pieces, upload_filled, upload_u64, upload_u64_pieces,
    upload_words_narrowed, StagingWindows,
};
#[cfg(any(test, feature = "test-support"))]
pub use transfer::CopyBandwidth;
#[cfg(any(test, feature = "test-support"))]
pub use transfer::{measure_copy_bandwidth, upload_byte_pieces_in_windows};
