//! Device memory and the stream it is ordered on, as the layers above name
//! them, and the functions through which every layer above allocates it
//! ([`alloc_uninit`], [`alloc_zeroed`], [`empty_device_vec`]).

use std::sync::Arc;

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

use super::{DriverResultExt, GpuResult};

/// A stream of device work; allocations, copies and launches on it run in
/// order.
pub type DeviceStream = cudarc::driver::CudaStream;

/// A point in a stream's work, recorded to wait for or to time.
pub type DeviceEvent = cudarc::driver::CudaEvent;

/// Device memory of `T` values on one stream, freed (stream-ordered) when
/// dropped.
pub type DeviceVec<T> = cudarc::driver::CudaSlice<T>;

/// A borrowed range of a [`DeviceVec`] (its `slice(..)` or `as_view()`).
pub type DeviceView<'a, T> = cudarc::driver::CudaView<'a, T>;

/// Plain values a kernel writes: every bit pattern is one of them.
pub trait DeviceWord: DeviceRepr + ValidAsZeroBits + Copy {}

impl DeviceWord for u8 {}
impl DeviceWord for u32 {}
impl DeviceWord for u64 {}
impl DeviceWord for i32 {}
impl DeviceWord for i64 {}

/// `len` values of `T` on `stream`, all zero. `what` names the allocation
/// in the error.
pub fn alloc_zeroed<T: DeviceWord>(
    stream: &Arc<DeviceStream>,
    len: usize,
    what: &'static str,
) -> GpuResult<DeviceVec<T>> {
    stream.alloc_zeros::<T>(len).during(what)
}

/// An empty device vector on `stream`, which holds no memory.
pub fn empty_device_vec<T: DeviceWord>(
    stream: &Arc<DeviceStream>,
    what: &'static str,
) -> GpuResult<DeviceVec<T>> {
    stream.null::<T>().during(what)
}

/// `len` values of `T` on `stream`, not yet written: the caller's kernels
/// write what is read later (each call site says which). `what` names the
/// allocation in the error.
pub fn alloc_uninit<T: DeviceWord>(
    stream: &Arc<DeviceStream>,
    len: usize,
    what: &'static str,
) -> GpuResult<DeviceVec<T>> {
    // SAFETY: the driver's allocation is unsafe only because the memory
    // holds whatever it held before. Device memory is never read through a
    // Rust reference, only by kernels and copies; every bit pattern is a
    // valid `T` (`DeviceWord`), so a word read before it was written is an
    // unspecified value, not undefined behaviour.
    unsafe { stream.alloc::<T>(len) }.during(what)
}
