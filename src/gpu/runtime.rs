//! Detection of the GPUs, once per process. Never panics: a machine without
//! the NVIDIA driver, without a device, or with `CUDA_VISIBLE_DEVICES` empty
//! gets a [`GpuUnavailable`] with the reason, and queries run on the CPU.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaContext;

use super::device::ContextKind;
use crate::config::DeviceSelection;
use super::device_slot::DeviceSlot;
use super::{GpuDevice, GpuError, GpuUnavailable};

/// The GPUs of this process.
#[derive(Debug)]
pub struct GpuRuntime {
    slots: Vec<DeviceSlot>,
    context_resets: AtomicU64,
    /// Nodes of one partition given a device so far ([`Self::device_in_turn`]).
    turns: AtomicUsize,
}

impl GpuRuntime {
    /// The devices new work may use: every device but one whose context a
    /// kernel fault broke.
    pub fn devices(&self) -> Vec<Arc<GpuDevice>> {
        self.slots
            .iter()
            .filter_map(|slot| slot.current(&self.context_resets).ok())
            .collect()
    }

    /// The device that serves DataFusion partition `partition` among those
    /// `selection` names: partitions are spread round robin over them, past
    /// any whose context a fault broke. Where every one is broken,
    /// partition's own: work planned before the fault meets its errors there
    /// and answers on the CPU. An error where `selection` names no device of
    /// the process.
    pub fn device_for_partition(
        &self,
        partition: usize,
        selection: &DeviceSelection,
    ) -> Result<Arc<GpuDevice>, GpuUnavailable> {
        let chosen = self.selected(selection)?;
        let n = chosen.len();
        let mut broken = None;
        for i in 0..n {
            match chosen[(partition + i) % n].current(&self.context_resets) {
                Ok(device) => return Ok(device),
                Err(e) => {
                    broken.get_or_insert(e.device);
                }
            }
        }
        Ok(broken.expect("a selection has at least one device"))
    }

    /// A device `selection` names for a node of one partition (a join or
    /// aggregation over all its input partitions), the devices taken in
    /// turn: the nodes of a plan, which run at once, spread over them.
    pub fn device_in_turn(
        &self,
        selection: &DeviceSelection,
    ) -> Result<Arc<GpuDevice>, GpuUnavailable> {
        let turn = self.turns.fetch_add(1, Ordering::Relaxed);
        self.device_for_partition(turn, selection)
    }

    /// `Ok(())` while some device `selection` names can take new work,
    /// otherwise why not.
    pub fn availability(&self, selection: &DeviceSelection) -> Result<(), GpuUnavailable> {
        let mut reasons = Vec::new();
        for slot in self.selected(selection)? {
            match slot.current(&self.context_resets) {
                Ok(_) => return Ok(()),
                Err(e) => reasons.push(e.reason.0),
            }
        }
        Err(GpuUnavailable(reasons.join("; ")))
    }

    /// The slots `selection` names, in its order; an error where it names
    /// none of them.
    fn selected(&self, selection: &DeviceSelection) -> Result<Vec<&DeviceSlot>, GpuUnavailable> {
        let ordinals: Vec<usize> = self.slots.iter().map(DeviceSlot::ordinal).collect();
        let chosen = chosen_slots(&ordinals, selection)?;
        Ok(chosen.into_iter().map(|i| &self.slots[i]).collect())
    }

    /// How many times a device was opened again because a kernel fault had
    /// broken its context (the CUDA 13.0 driver refuses new contexts after
    /// such a fault, so this stays 0 there).
    #[cfg(any(test, feature = "test-support"))]
    pub fn context_resets(&self) -> u64 {
        self.context_resets.load(Ordering::Acquire)
    }

    /// One line per device, for logs and examples.
    pub fn describe(&self) -> String {
        self.devices()
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

/// The indexes into `ordinals` (the process's devices, by number) of the
/// devices `selection` names, in its order: numbers the process lacks are
/// passed over. An error where it names none of them.
fn chosen_slots(
    ordinals: &[usize],
    selection: &DeviceSelection,
) -> Result<Vec<usize>, GpuUnavailable> {
    let chosen: Vec<usize> = match selection {
        DeviceSelection::All => (0..ordinals.len()).collect(),
        DeviceSelection::Ordinals(named) => named
            .iter()
            .filter_map(|ordinal| ordinals.iter().position(|o| o == ordinal))
            .collect(),
    };
    if chosen.is_empty() {
        let seen: Vec<String> = ordinals.iter().map(usize::to_string).collect();
        return Err(GpuUnavailable(format!(
            "gpu.devices = '{selection}' names no device of this process (it has {})",
            seen.join(", ")
        )));
    }
    Ok(chosen)
}

static RUNTIME: OnceLock<Result<Arc<GpuRuntime>, GpuUnavailable>> = OnceLock::new();

/// The process's GPUs, detected on first use.
pub fn gpu_runtime() -> Result<Arc<GpuRuntime>, GpuUnavailable> {
    RUNTIME.get_or_init(detect).clone()
}

/// `Ok(())` when a GPU `selection` names can be used, otherwise the reason: the form the
/// planner's decisions take.
pub fn gpu_availability(selection: &DeviceSelection) -> Result<(), String> {
    gpu_runtime()
        .and_then(|runtime| runtime.availability(selection))
        .map_err(|e| e.0)
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
        Ok(result) => result.map(|runtime| {
            // Placement by cost weighs every node with the first device's
            // constants: measured here, with the devices opened, so that the
            // cost (about 0.1 s) falls where the opening's does, not on the
            // first plan that prices a join. A failure is kept and the
            // planner uses typical constants.
            if let Some(first) = runtime.devices().first() {
                let _ = first.constants();
            }
            Arc::new(runtime)
        }),
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
        match GpuDevice::open(ordinal, ContextKind::Primary) {
            Ok(device) => devices.push(DeviceSlot::new(device)),
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
    Ok(GpuRuntime {
        slots: devices,
        context_resets: AtomicU64::new(0),
        turns: AtomicUsize::new(0),
    })
}

#[cfg(test)]
mod tests {
    use super::chosen_slots;
    use crate::config::DeviceSelection;

    #[test]
    fn a_selection_names_devices_in_its_order_and_passes_over_missing_ones() {
        let chosen = |text: &str| chosen_slots(&[0, 1], &text.parse::<DeviceSelection>().unwrap());
        assert_eq!(chosen("all").unwrap(), vec![0, 1]);
        assert_eq!(chosen("1").unwrap(), vec![1]);
        assert_eq!(chosen("1,0").unwrap(), vec![1, 0]);
        assert_eq!(chosen("0,5").unwrap(), vec![0]);
        let reason = chosen("5,7").unwrap_err().0;
        assert!(reason.contains("names no device"), "{reason}");
        assert!(reason.contains("it has 0, 1"), "{reason}");
        // Slots are found by device number, not by position.
        let by_number = chosen_slots(&[3, 4], &"4".parse().unwrap()).unwrap();
        assert_eq!(by_number, vec![1]);
    }
}
