//! One cache fill of a part at a time: a task that needs a part's columns
//! while another fills them (a scan and the fill ahead of its plan, or two
//! queries) waits for that fill and then finds them in the cache, rather
//! than reading the part a second time.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use tokio::sync::{Mutex as FillMutex, OwnedMutexGuard};

/// The lock of each part being filled or waited for, by
/// [`super::Part::fill_key`] and device.
static FILLS: LazyLock<Mutex<HashMap<String, Weak<FillMutex<()>>>>> =
    LazyLock::new(Default::default);

/// Locks past which those no task holds or waits for are dropped.
const PRUNE_AT: usize = 4096;

/// Held while a part's columns are filled on the device `device`: the
/// next task asking for the same `part_key` and device waits until it is
/// dropped.
pub(crate) async fn fill_guard(part_key: &str, device: u64) -> OwnedMutexGuard<()> {
    let lock = {
        let mut fills = FILLS.lock().unwrap_or_else(|p| p.into_inner());
        if fills.len() >= PRUNE_AT {
            fills.retain(|_, lock| lock.strong_count() > 0);
        }
        let key = format!("{device}|{part_key}");
        match fills.get(&key).and_then(Weak::upgrade) {
            Some(lock) => lock,
            None => {
                let lock = Arc::new(FillMutex::new(()));
                fills.insert(key, Arc::downgrade(&lock));
                lock
            }
        }
    };
    lock.lock_owned().await
}

/// Whether a task fills the part `part_key` on the device `device` now:
/// one that need not wait for it (a fill ahead) can go on to another part.
pub(crate) fn being_filled(part_key: &str, device: u64) -> bool {
    let fills = FILLS.lock().unwrap_or_else(|p| p.into_inner());
    fills
        .get(&format!("{device}|{part_key}"))
        .and_then(Weak::upgrade)
        .is_some_and(|lock| lock.try_lock().is_err())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fills_of_one_part_on_one_device_take_turns() {
        let first = fill_guard("part a", 0).await;
        assert!(being_filled("part a", 0));
        assert!(!being_filled("part a", 1) && !being_filled("part z", 0));
        // The same part on the same device waits for the first fill.
        let same = tokio::spawn(async { fill_guard("part a", 0).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!same.is_finished(), "a second fill of the part did not wait");
        // Another part, or the same part on another device, does not.
        let other_part = tokio::time::timeout(Duration::from_secs(5), fill_guard("part b", 0)).await;
        assert!(other_part.is_ok());
        let other_device = tokio::time::timeout(Duration::from_secs(5), fill_guard("part a", 1)).await;
        assert!(other_device.is_ok());
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), same).await;
        assert!(second.is_ok(), "the waiting fill did not start once the first ended");
        drop(second);
        assert!(!being_filled("part a", 0), "no task fills the part any more");
    }
}
