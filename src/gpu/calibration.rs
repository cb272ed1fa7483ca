//! The device's constants that placement by cost needs, measured once per
//! opened device: the first device's as the process opens its GPUs, another's
//! at its first use (about 0.1 s on an H200 host, the first pinned
//! staging buffers included): how fast bytes cross the bus from pinned memory and from ordinary host memory (staged through the
//! pinned windows every upload of a table as users hold it takes), how fast
//! the device's own memory moves them, and what one kernel launch costs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    download_byte_pieces, launch, DriverResultExt, GpuDevice, GpuResult, PhaseTimer,
    StagingWindows,
};

/// Measured constants of one device. Bandwidths are in bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceConstants {
    /// Host to device, from pinned host memory.
    pub pinned_to_device: f64,
    /// Device to host, into pinned host memory.
    pub pinned_from_device: f64,
    /// Host to device from ordinary host memory, staged through pinned
    /// windows by the host's threads (how a `MemTable` or a Parquet scan's
    /// batches travel).
    pub staged_to_device: f64,
    /// Device to host into ordinary host memory, copied out of the pinned
    /// buffer on the host's threads (how results come back).
    pub staged_from_device: f64,
    /// The device's own memory, each byte read and each byte written
    /// counted (a device-to-device copy).
    pub device_memory: f64,
    /// Wall time of one small kernel launch, enqueue to completion, when
    /// launches follow one another on one stream.
    pub launch: Duration,
    /// How long measuring these took.
    pub measured_in: Duration,
}

impl DeviceConstants {
    /// Constants of an H100 or H200 over PCIe 5, for estimates where no
    /// device was measured (tests of the cost model, and `gpu_decisions`
    /// on a plan made for another machine).
    pub const TYPICAL: DeviceConstants = DeviceConstants {
        pinned_to_device: 50e9,
        pinned_from_device: 50e9,
        staged_to_device: 20e9,
        staged_from_device: 12e9,
        device_memory: 3.0e12,
        launch: Duration::from_micros(5),
        measured_in: Duration::ZERO,
    };
}

impl std::fmt::Display for DeviceConstants {
    /// One line, bandwidths in GB/s: what placement by cost weighed, for a
    /// benchmark's log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pinned up {:.1} GB/s, down {:.1}; staged up {:.1}, down {:.1}; device memory {:.0}; \
             launch {:.1} us; measured in {:.1} ms",
            self.pinned_to_device / 1e9,
            self.pinned_from_device / 1e9,
            self.staged_to_device / 1e9,
            self.staged_from_device / 1e9,
            self.device_memory / 1e9,
            self.launch.as_secs_f64() * 1e6,
            self.measured_in.as_secs_f64() * 1e3
        )
    }
}


/// Bytes each bandwidth is measured with: long enough that a copy's fixed
/// cost is a few percent of it, short enough that the whole measurement
/// takes milliseconds.
const MEASURE_BYTES: usize = 32 << 20;

/// Rounds of each measurement after a first one that warms the pinned pool
/// and the driver; the fastest round counts (the others met noise).
const ROUNDS: usize = 3;

/// Launches timed back to back for the launch cost.
const LAUNCHES: usize = 64;

/// Measures `device`'s constants.
pub(super) fn measure(device: &Arc<GpuDevice>) -> GpuResult<DeviceConstants> {
    let started = Instant::now();
    device.bind_to_thread()?;
    let pooled = device.stream()?;
    let stream = pooled.stream();
    let words = MEASURE_BYTES / 8;
    let host: Vec<u8> = (0..MEASURE_BYTES).map(|i| (i % 251) as u8).collect();
    let mut staged_up = f64::MAX;
    let mut staged_down = f64::MAX;
    for round in 0..=ROUNDS {
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let up = Instant::now();
        let on_device = StagingWindows::standard(device).upload_bytes(stream, &[&host], &mut timer)?;
        stream.synchronize().during("waiting for a measured upload")?;
        let up = up.elapsed().as_secs_f64();
        let down = Instant::now();
        let back = download_byte_pieces(
            device,
            stream,
            &on_device.as_view(),
            MEASURE_BYTES,
            1 << 20,
            crate::host::copy::host_threads(),
            &mut timer,
        )?;
        let down = down.elapsed().as_secs_f64();
        timer.finish()?;
        drop(back);
        if round > 0 {
            staged_up = staged_up.min(up);
            staged_down = staged_down.min(down);
        }
    }
    let pinned = super::transfer::copy_bandwidth(device, stream, MEASURE_BYTES, ROUNDS)?;
    let mut target = super::alloc_zeroed::<u64>(stream, 1, "allocating a launch target")?;
    let launcher = device.launcher(stream);
    launch::fill_u64(&launcher, &mut target, 0)?;
    stream.synchronize().during("waiting for a launch")?;
    let launches = Instant::now();
    for _ in 0..LAUNCHES {
        launch::fill_u64(&launcher, &mut target, 1)?;
    }
    stream.synchronize().during("waiting for measured launches")?;
    let launch = launches.elapsed() / LAUNCHES as u32;
    let bytes = (8 * words) as f64;
    Ok(DeviceConstants {
        pinned_to_device: pinned.host_to_device,
        pinned_from_device: pinned.device_to_host,
        staged_to_device: bytes / staged_up,
        staged_from_device: bytes / staged_down,
        device_memory: pinned.device_memory,
        launch,
        measured_in: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::DeviceConstants;

    #[test]
    fn constants_print_on_one_line_in_gb_per_second() {
        assert_eq!(
            DeviceConstants::TYPICAL.to_string(),
            "pinned up 50.0 GB/s, down 50.0; staged up 20.0, down 12.0; device memory 3000; \
             launch 5.0 us; measured in 0.0 ms"
        );
    }
}
