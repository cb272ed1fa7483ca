//! Device-side timing with CUDA events: host clocks would measure only the
//! enqueueing of asynchronous work.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use super::{DriverResultExt, GpuResult};

/// What a timed span of device work was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Host-to-device copies.
    HostToDevice,
    /// Kernels.
    Kernel,
    /// Device-to-host copies.
    DeviceToHost,
}

/// Device time per phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    /// Time in host-to-device copies.
    pub host_to_device: Duration,
    /// Time in kernels.
    pub kernel: Duration,
    /// Time in device-to-host copies.
    pub device_to_host: Duration,
    /// Bytes copied host to device.
    pub host_to_device_bytes: usize,
    /// Bytes copied device to host.
    pub device_to_host_bytes: usize,
    /// Host time copying between host memory and the pinned staging
    /// buffers, both ways (on the host's clock, not the device's).
    pub host_staging: Duration,
    /// Host time getting page-locked buffers from the pinned pool: locking
    /// new memory where none of the size was idle, else next to nothing.
    pub pinned_allocation: Duration,
    /// Of the bytes copied host to device, those copied straight from
    /// pinned host memory (pinned tables, a cache fill's words made
    /// there), without staging.
    pub direct_host_to_device_bytes: usize,
    /// Copies those bytes took: one per run of bytes that lie end to end
    /// in one pinned region, or per pinned buffer a fill made.
    pub direct_host_to_device_copies: usize,
}

impl PhaseTimes {
    /// Sum of both copy directions.
    pub fn transfer(&self) -> Duration {
        self.host_to_device + self.device_to_host
    }
}

/// Records a pair of events around each span of work enqueued on a stream
/// (its own, or another one the work runs on); [`PhaseTimer::finish`] reads
/// them once every such stream has caught up.
#[derive(Debug)]
pub struct PhaseTimer {
    stream: Arc<CudaStream>,
    /// Streams other than `stream` that spans were recorded on.
    other_streams: Vec<Arc<CudaStream>>,
    spans: Vec<(Phase, CudaEvent, CudaEvent)>,
    host_to_device_bytes: usize,
    device_to_host_bytes: usize,
    host_staging: Duration,
    pinned_allocation: Duration,
    direct_host_to_device_bytes: usize,
    direct_host_to_device_copies: usize,
}

impl PhaseTimer {
    /// A timer for work on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        Self {
            stream,
            other_streams: Vec::new(),
            spans: Vec::new(),
            host_to_device_bytes: 0,
            device_to_host_bytes: 0,
            host_staging: Duration::ZERO,
            pinned_allocation: Duration::ZERO,
            direct_host_to_device_bytes: 0,
            direct_host_to_device_copies: 0,
        }
    }

    /// Counts `bytes` copied to the device straight from pinned tables, in
    /// `copies` copies.
    pub fn add_direct_copies(&mut self, bytes: usize, copies: usize) {
        self.direct_host_to_device_bytes += bytes;
        self.direct_host_to_device_copies += copies;
    }

    /// Counts host time spent copying into or out of pinned staging buffers.
    pub fn add_host_staging(&mut self, time: Duration) {
        self.host_staging += time;
    }

    /// Counts host time spent getting buffers from the pinned pool.
    pub fn add_pinned_allocation(&mut self, time: Duration) {
        self.pinned_allocation += time;
    }

    /// Counts `bytes` copied in a copy phase.
    pub fn add_bytes(&mut self, phase: Phase, bytes: usize) {
        match phase {
            Phase::HostToDevice => self.host_to_device_bytes += bytes,
            Phase::DeviceToHost => self.device_to_host_bytes += bytes,
            Phase::Kernel => {}
        }
    }

    /// Enqueues `work` between two timing events on the timer's stream.
    pub fn time<T>(&mut self, phase: Phase, work: impl FnOnce() -> GpuResult<T>) -> GpuResult<T> {
        let stream = Arc::clone(&self.stream);
        self.time_on(&stream, phase, work)
    }

    /// Enqueues `work`, which runs on `stream`, between two timing events on
    /// that stream: the events must follow the work's own stream, or the
    /// span would measure whatever the timer's stream was doing instead.
    pub fn time_on<T>(
        &mut self,
        stream: &Arc<CudaStream>,
        phase: Phase,
        work: impl FnOnce() -> GpuResult<T>,
    ) -> GpuResult<T> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = stream
            .record_event(flags)
            .during("recording a timing event")?;
        let value = work()?;
        let end = stream
            .record_event(flags)
            .during("recording a timing event")?;
        self.spans.push((phase, start, end));
        let known = Arc::ptr_eq(stream, &self.stream)
            || self.other_streams.iter().any(|s| Arc::ptr_eq(s, stream));
        if !known {
            self.other_streams.push(Arc::clone(stream));
        }
        Ok(value)
    }

    /// Waits for every stream a span was recorded on, then sums the spans
    /// per phase. Spans on different streams may overlap in time: their sum
    /// is the work done, not the wall time it took.
    pub fn finish(self) -> GpuResult<PhaseTimes> {
        self.stream.synchronize().during("synchronizing a stream")?;
        for stream in &self.other_streams {
            stream.synchronize().during("synchronizing a stream")?;
        }
        let mut times = PhaseTimes {
            host_to_device_bytes: self.host_to_device_bytes,
            device_to_host_bytes: self.device_to_host_bytes,
            host_staging: self.host_staging,
            pinned_allocation: self.pinned_allocation,
            direct_host_to_device_bytes: self.direct_host_to_device_bytes,
            direct_host_to_device_copies: self.direct_host_to_device_copies,
            ..PhaseTimes::default()
        };
        for (phase, start, end) in &self.spans {
            let ms = start.elapsed_ms(end).during("reading a timing event")?;
            let span = Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1000.0);
            match phase {
                Phase::HostToDevice => times.host_to_device += span,
                Phase::Kernel => times.kernel += span,
                Phase::DeviceToHost => times.device_to_host += span,
            }
        }
        Ok(times)
    }
}
