//! One device of the runtime and what a kernel fault does to it.
//!
//! A fault in a kernel (an illegal address or instruction, a failed launch)
//! breaks the CUDA context it happens in for good: every later call there
//! fails the same way ([`GpuError::breaks_context`]). Every driver error
//! passes through `DriverResultExt::during`, which counts such faults; after
//! one, the slot checks its device's context before handing the device to
//! new work. A broken device is taken off new work (the planner keeps nodes
//! on the CPU and says why), while work that holds it meets its errors and
//! answers on the CPU. Opening the device again in a context of its own is
//! tried at an interval: the CUDA 13.0 driver refuses any new context in the
//! process after such a fault (measured on an H200 with driver 580), so the
//! GPU comes back only with a new process, but a driver that allows it gets
//! the device back without one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::device::ContextKind;
use super::error::context_faults_seen;
use super::{GpuDevice, GpuUnavailable};
#[cfg(doc)]
use super::GpuError;
use crate::trace;

/// How often opening a device whose context is broken is tried again.
const REOPEN_INTERVAL: Duration = Duration::from_secs(1);

/// One device of the runtime: the [`GpuDevice`] new work gets.
#[derive(Debug)]
pub(super) struct DeviceSlot {
    ordinal: usize,
    state: Mutex<SlotState>,
}

#[derive(Debug)]
struct SlotState {
    device: Arc<GpuDevice>,
    /// [`context_faults_seen`] when this slot's context was last checked.
    faults_checked: u64,
    /// Why the device's context is broken, until it is opened again.
    broken: Option<String>,
    /// When opening the device again was last tried.
    last_reopen: Option<Instant>,
}

/// A device whose context a fault broke: the device, for work planned
/// before the fault, and the reason new work stays off it.
#[derive(Debug)]
pub(super) struct BrokenDevice {
    pub(super) device: Arc<GpuDevice>,
    pub(super) reason: GpuUnavailable,
}

impl DeviceSlot {
    pub(super) fn new(device: GpuDevice) -> Self {
        Self {
            ordinal: device.ordinal(),
            state: Mutex::new(SlotState {
                device: Arc::new(device),
                faults_checked: context_faults_seen(),
                broken: None,
                last_reopen: None,
            }),
        }
    }

    /// The device's number, as CUDA numbers the visible devices.
    pub(super) fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device for new work, or, where a fault broke its context and it
    /// could not be opened again, the broken device and why. `resets`
    /// counts the reopenings.
    pub(super) fn current(&self, resets: &AtomicU64) -> Result<Arc<GpuDevice>, BrokenDevice> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.broken.is_none() && context_faults_seen() != state.faults_checked {
            let checked = state.device.check_context();
            trace::event(|| format!("GPU {}: context checked after a fault: {checked:?}", self.ordinal));
            if let Err(e) = checked {
                if e.breaks_context() {
                    state.broken = Some(e.to_string());
                }
            }
            // The check's own error counts as seen.
            state.faults_checked = context_faults_seen();
        }
        let Some(reason) = state.broken.clone() else {
            return Ok(Arc::clone(&state.device));
        };
        if state.last_reopen.is_none_or(|at| at.elapsed() >= REOPEN_INTERVAL) {
            state.last_reopen = Some(Instant::now());
            let reopened = GpuDevice::open(self.ordinal, ContextKind::Fresh)
                .and_then(|device| device.check_context().map(|()| device));
            match reopened {
                Ok(device) => {
                    trace::event(|| format!("GPU {}: opened again after {reason}", self.ordinal));
                    state.device = Arc::new(device);
                    state.broken = None;
                    state.faults_checked = context_faults_seen();
                    resets.fetch_add(1, Ordering::AcqRel);
                    return Ok(Arc::clone(&state.device));
                }
                Err(e) => trace::event(|| {
                    format!("GPU {}: opening the device again failed: {e}", self.ordinal)
                }),
            }
        }
        Err(BrokenDevice {
            device: Arc::clone(&state.device),
            reason: GpuUnavailable(format!(
                "a kernel fault broke GPU {}'s CUDA context ({reason}); the driver keeps such a \
                 fault for the life of the process, so queries run on the CPU until it restarts",
                self.ordinal
            )),
        })
    }
}
