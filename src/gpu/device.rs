//! One GPU: its context, kernels, memory budget, pinned pool and streams.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaStream};

use super::launch::{Kernels, Launcher};
use super::column_cache::{ColumnCache, Evict};
use super::{DeviceBudget, DeviceConstants, DriverResultExt, GpuResult, PinnedPool};

/// An opened device. Created once per process by [`super::gpu_runtime`].
#[derive(Debug)]
pub struct GpuDevice {
    id: u64,
    ordinal: usize,
    name: String,
    compute_capability: (i32, i32),
    sm_count: u32,
    total_memory: usize,
    ctx: Arc<CudaContext>,
    kernels: Kernels,
    budget: Arc<DeviceBudget>,
    pinned: Arc<PinnedPool>,
    idle_streams: Mutex<Vec<Arc<CudaStream>>>,
    admitted: Mutex<usize>,
    admission_freed: Condvar,
    constants: OnceLock<Result<DeviceConstants, String>>,
    column_cache: Arc<ColumnCache>,
}

/// A slot of the device's admission limit, released on drop.
#[derive(Debug)]
pub struct Admission<'a> {
    device: &'a GpuDevice,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        let mut admitted = self
            .device
            .admitted
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *admitted -= 1;
        // Every waiter re-checks: callers may pass different limits, so the
        // one woken by `notify_one` might not be the one that can go on.
        self.device.admission_freed.notify_all();
    }
}

impl GpuDevice {
    /// Waits until fewer than `limit` tasks hold a slot, then takes one, so
    /// operators bound the device work they start at once (one task per
    /// DataFusion partition would otherwise all start together).
    pub fn admit(&self, limit: usize) -> Admission<'_> {
        let mut admitted = self.admitted.lock().unwrap_or_else(|p| p.into_inner());
        while *admitted >= limit.max(1) {
            admitted = self
                .admission_freed
                .wait(admitted)
                .unwrap_or_else(|p| p.into_inner());
        }
        *admitted += 1;
        Admission { device: self }
    }

    /// Opens device `ordinal` in a context of `kind`, keeps freed
    /// stream-ordered allocations in the driver's pool (so allocation on the
    /// hot path does not go back to the OS), and loads the PTX.
    pub(crate) fn open(ordinal: usize, kind: ContextKind) -> GpuResult<Self> {
        let ctx = match kind {
            ContextKind::Primary => CudaContext::new(ordinal),
            ContextKind::Fresh => CudaContext::new_non_primary(ordinal, 0),
        }
        .during("creating a CUDA context")?;
        let name = ctx.name().during("reading the device name")?;
        let compute_capability = ctx
            .compute_capability()
            .during("reading the compute capability")?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during("reading the multiprocessor count")? as u32;
        let total_memory = ctx.total_mem().during("reading the device memory size")?;
        let (free_memory, _) = ctx.mem_get_info().during("reading free device memory")?;
        if ctx.has_async_alloc() {
            keep_freed_memory_in_pool(&ctx)?;
        }
        let kernels = Kernels::load(&ctx)?;
        let budget = DeviceBudget::new(free_memory);
        let column_cache = ColumnCache::new();
        let evictor: Arc<dyn Evict> = Arc::clone(&column_cache) as Arc<dyn Evict>;
        budget.set_evictor(Arc::downgrade(&evictor));
        static OPENED: AtomicU64 = AtomicU64::new(0);
        Ok(Self {
            id: OPENED.fetch_add(1, Ordering::Relaxed),
            ordinal,
            name,
            compute_capability,
            sm_count: sm_count.max(1),
            total_memory,
            pinned: PinnedPool::new(Arc::clone(&ctx)),
            budget,
            ctx,
            kernels,
            idle_streams: Mutex::new(Vec::new()),
            admitted: Mutex::new(0),
            admission_freed: Condvar::new(),
            constants: OnceLock::new(),
            column_cache,
        })
    }

    /// The device's measured constants ([`DeviceConstants`]), measured at
    /// the first call (about 0.1 s; the runtime makes it for the first
    /// device as it opens the devices) and kept; the reason where
    /// measuring failed.
    pub fn constants(self: &Arc<Self>) -> Result<DeviceConstants, String> {
        self.constants
            .get_or_init(|| super::calibration::measure(self).map_err(|e| e.to_string()))
            .clone()
    }

    /// This opened device within the process. A device opened again after a
    /// fault broke its context has a new id, so what was made in the old
    /// context is never used in the new one.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// CUDA device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// (major, minor) compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// Device memory in bytes.
    pub fn total_memory(&self) -> usize {
        self.total_memory
    }

    /// The device's context.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The kernels loaded into this device.
    #[cfg(any(test, feature = "test-support"))]
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// Launches of this device's kernels on `stream` (one of its own).
    pub fn launcher<'a>(&'a self, stream: &'a Arc<CudaStream>) -> Launcher<'a> {
        Launcher::new(&self.kernels, stream, self.sm_count)
    }

    /// The device memory budget.
    pub fn budget(&self) -> &Arc<DeviceBudget> {
        &self.budget
    }

    /// The device's column cache.
    pub fn column_cache(&self) -> &Arc<ColumnCache> {
        &self.column_cache
    }

    /// Pinned staging buffers of this device.
    pub fn pinned(&self) -> &Arc<PinnedPool> {
        &self.pinned
    }

    /// A stream for one unit of work, returned to the device on drop.
    pub fn stream(self: &Arc<Self>) -> GpuResult<PooledStream> {
        let idle = self
            .idle_streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        let stream = match idle {
            Some(stream) => stream,
            None => self.ctx.new_stream().during("creating a stream")?,
        };
        Ok(PooledStream {
            stream: Some(stream),
            device: Arc::clone(self),
        })
    }

    /// `Ok(())` while the context can run work; the driver's error once a
    /// kernel fault broke it ([`GpuError::breaks_context`]). Waits for the
    /// work queued on the device, so the runtime calls it only after such
    /// an error was seen in the process.
    pub(crate) fn check_context(&self) -> GpuResult<()> {
        self.bind_to_thread()?;
        self.ctx.synchronize().during("checking the device context")
    }

    /// Breaks this device's context the way a faulting kernel would (a
    /// kernel writes to an address the context never allocated) and returns
    /// the driver's error, for the tests of recovery from device faults.
    #[cfg(any(test, feature = "test-support"))]
    pub fn break_context_for_test(self: &Arc<Self>) -> super::GpuError {
        let attempt = || -> GpuResult<()> {
            self.bind_to_thread()?;
            let stream = self.stream()?;
            super::launch::write_to_unowned_address(&self.launcher(stream.stream()))?;
            stream.stream().synchronize().during("waiting for a faulting kernel")
        };
        match attempt() {
            Err(error) => error,
            Ok(()) => super::GpuError::Invalid("the faulting kernel did not fault".into()),
        }
    }

    /// Makes the context current on the calling thread (needed before driver
    /// calls from a thread that has not used this device yet).
    pub fn bind_to_thread(&self) -> GpuResult<()> {
        self.ctx
            .bind_to_thread()
            .during("binding the CUDA context to a thread")
    }
}

/// Which context [`GpuDevice::open`] works in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContextKind {
    /// The device's primary context, which other libraries of the process
    /// may share: how a device is first opened.
    Primary,
    /// A context of this device's own: how a device whose context a fault
    /// broke is opened again, since the broken one lives on while earlier
    /// work still holds memory in it.
    Fresh,
}

/// Raises the release threshold of the device's default memory pool so that
/// memory freed with cuMemFreeAsync stays cached for the next cuMemAllocAsync.
fn keep_freed_memory_in_pool(ctx: &Arc<CudaContext>) -> GpuResult<()> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold: u64 = u64::MAX;
    // SAFETY: `pool` is a valid out-pointer and the device handle comes from a
    // live context; the driver library is present (checked by the runtime).
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .during("getting the default memory pool")?;
    // SAFETY: the attribute takes a pointer to a cuuint64_t, which `threshold` is.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    }
    .result()
    .during("setting the memory pool release threshold")
}

/// A stream on loan from a [`GpuDevice`].
#[derive(Debug)]
pub struct PooledStream {
    stream: Option<Arc<CudaStream>>,
    device: Arc<GpuDevice>,
}

impl PooledStream {
    /// The stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.stream.as_ref().expect("present until drop")
    }
}

impl Drop for PooledStream {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            // A stream with unfinished or failed work is not reused.
            if stream.synchronize().is_ok() {
                self.device
                    .idle_streams
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(stream);
            }
        }
    }
}
