//! Dropping an operator's large inputs off the query's path. An input of
//! thousands of batches is slow to drop on a many-core host: each array's
//! reference count sits in a cache line that the core which read the batch
//! last wrote, so every batch dropped is a few cache misses. Dropped on the
//! query's path, a join's two inputs would delay its answer after its last
//! device work. Handed to one long-lived thread, they are dropped there
//! while the query goes on.

use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;

/// What the releasing thread drops.
type Released = Box<dyn Send>;

/// The channel to the releasing thread, started on first use; `None` where
/// no thread could be started (values are then dropped in place).
fn releaser() -> Option<&'static Sender<Released>> {
    static RELEASER: OnceLock<Option<Sender<Released>>> = OnceLock::new();
    RELEASER
        .get_or_init(|| {
            let (sender, receiver) = channel::<Released>();
            std::thread::Builder::new()
                .name("datafusion-gpu-release".into())
                .spawn(move || {
                    receiver.into_iter().for_each(|released| {
                        crate::trace::event(|| "release: dropping a query's inputs".into());
                        drop(released);
                        crate::trace::event(|| "release: dropped".into());
                    })
                })
                .ok()
                .map(|_| sender)
        })
        .as_ref()
}

/// Drops `value` on the releasing thread, soon but not here. Memory
/// reservations that account for `value` belong in it too, so that the
/// memory pool sees the memory freed only once it is.
pub(crate) fn release_in_background<T: Send + 'static>(value: T) {
    match releaser() {
        // A send fails only once the thread has ended; the value then
        // comes back in the error and is dropped here.
        Some(sender) => drop(sender.send(Box::new(value))),
        None => drop(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;
    use std::time::{Duration, Instant};

    /// Records the thread it is dropped on.
    struct RecordsDrop(Arc<Mutex<Vec<ThreadId>>>);

    impl Drop for RecordsDrop {
        fn drop(&mut self) {
            self.0.lock().unwrap().push(std::thread::current().id());
        }
    }

    #[test]
    fn released_values_are_dropped_once_each_on_another_thread() {
        let dropped_on = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..100 {
            release_in_background(RecordsDrop(Arc::clone(&dropped_on)));
        }
        let start = Instant::now();
        while dropped_on.lock().unwrap().len() < 100 && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Give a value dropped twice the time to show.
        std::thread::sleep(Duration::from_millis(10));
        let threads = dropped_on.lock().unwrap();
        assert_eq!(threads.len(), 100);
        let here = std::thread::current().id();
        assert!(threads.iter().all(|&t| t != here));
    }
}
