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
}

impl PhaseTimes {
    /// Sum of both copy directions.
    pub fn transfer(&self) -> Duration {
        self.host_to_device + self.device_to_host
    }
}

/// Records a pair of events around each span of work enqueued on one stream;
/// [`PhaseTimer::finish`] reads them once the stream has caught up.
#[derive(Debug)]
pub struct PhaseTimer {
    stream: Arc<CudaStream>,
    spans: Vec<(Phase, CudaEvent, CudaEvent)>,
    host_to_device_bytes: usize,
    device_to_host_bytes: usize,
}

impl PhaseTimer {
    /// A timer for work on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        Self {
            stream,
            spans: Vec::new(),
            host_to_device_bytes: 0,
            device_to_host_bytes: 0,
        }
    }

    /// Counts `bytes` copied in a copy phase.
    pub fn add_bytes(&mut self, phase: Phase, bytes: usize) {
        match phase {
            Phase::HostToDevice => self.host_to_device_bytes += bytes,
            Phase::DeviceToHost => self.device_to_host_bytes += bytes,
            Phase::Kernel => {}
        }
    }

    /// Enqueues `work` between two timing events.
    pub fn time<T>(&mut self, phase: Phase, work: impl FnOnce() -> GpuResult<T>) -> GpuResult<T> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self
            .stream
            .record_event(flags)
            .during("recording a timing event")?;
        let value = work()?;
        let end = self
            .stream
            .record_event(flags)
            .during("recording a timing event")?;
        self.spans.push((phase, start, end));
        Ok(value)
    }

    /// Waits for the stream, then sums the recorded spans per phase.
    pub fn finish(self) -> GpuResult<PhaseTimes> {
        self.stream.synchronize().during("synchronizing a stream")?;
        let mut times = PhaseTimes {
            host_to_device_bytes: self.host_to_device_bytes,
            device_to_host_bytes: self.device_to_host_bytes,
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
