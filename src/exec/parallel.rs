//! Host work spread over scoped threads.

use datafusion::error::{DataFusionError, Result};

/// `work(i)` for every `i` in `0..tasks`, each on a thread of its own, the
/// results in task order; the first error (or a panicking task, reported as
/// one) is returned.
pub(crate) fn on_threads<R: Send>(
    tasks: usize,
    work: impl Fn(usize) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    if tasks == 1 {
        return Ok(vec![work(0)?]);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..tasks).map(|i| scope.spawn(move || work(i))).collect();
        handles
            .into_iter()
            .map(|handle| {
                handle.join().unwrap_or_else(|_| {
                    Err(DataFusionError::Internal(
                        "a host worker thread panicked".into(),
                    ))
                })
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_in_task_order_and_errors_are_returned() {
        assert_eq!(
            on_threads(5, |i| Ok(i * 10)).unwrap(),
            vec![0, 10, 20, 30, 40]
        );
        assert_eq!(on_threads(1, |i| Ok(i + 7)).unwrap(), vec![7]);
        let failed = on_threads(3, |i| {
            if i == 1 {
                Err(DataFusionError::Internal("task 1".into()))
            } else {
                Ok(i)
            }
        });
        assert!(failed.unwrap_err().to_string().contains("task 1"));
    }
}
