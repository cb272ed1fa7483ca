//! Host work spread over scoped threads.

use datafusion::error::{DataFusionError, Result};

use crate::host::copy::host_threads;

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

/// Pieces (one per input batch) below which one thread takes a per-piece
/// step over all of them: each piece costs a cache miss or two and an
/// allocation, about a tenth of a microsecond, where starting a thread
/// costs tens. A table in memory arrives in tens of thousands of batches
/// (2^28 rows: 32,768), over which several such steps on one thread would
/// delay the device's start.
pub(crate) const PIECES_PER_THREAD: usize = 2048;

/// `work(i)` for every piece `i` in `0..len`, the results in piece order:
/// on one thread up to [`PIECES_PER_THREAD`] pieces a thread, else spread
/// over the cores in consecutive ranges.
pub(crate) fn map_pieces<T: Send>(
    len: usize,
    work: impl Fn(usize) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let threads = host_threads().min(len / PIECES_PER_THREAD).max(1);
    if threads == 1 {
        return (0..len).map(work).collect();
    }
    let per_range = on_ranges(len, threads, |range| {
        range.map(&work).collect::<Result<Vec<T>>>()
    })?;
    Ok(per_range.into_iter().flatten().collect())
}

/// `work(range)` over `0..len` cut into at most `tasks` consecutive ranges
/// of equal length (the last shorter), each on a thread of its own, the
/// results in range order: how a pass over rows or batches is spread over
/// the cores. No range is empty; `len = 0` runs nothing.
pub(crate) fn on_ranges<R: Send>(
    len: usize,
    tasks: usize,
    work: impl Fn(std::ops::Range<usize>) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let per_task = len.div_ceil(tasks.clamp(1, len));
    on_threads(len.div_ceil(per_task), |i| {
        let start = i * per_task;
        work(start..(start + per_task).min(len))
    })
}

/// `work(start, rows, flags)` over consecutive chunks of `per_task` rows of
/// `rows` and of `flags` (the same chunks of it, where given), each chunk on
/// a thread of its own: how one output buffer is filled by several threads
/// without a merge afterwards. The first error (or a panicking task,
/// reported as one) is returned.
pub(crate) fn on_row_chunks<T: Send, F: Send>(
    rows: &mut [T],
    flags: Option<&mut [F]>,
    per_task: usize,
    work: impl Fn(usize, &mut [T], Option<&mut [F]>) -> Result<()> + Sync,
) -> Result<()> {
    let per_task = per_task.max(1);
    if rows.len() <= per_task {
        return work(0, rows, flags);
    }
    let mut flag_chunks: Vec<Option<&mut [F]>> = match flags {
        Some(flags) => flags.chunks_mut(per_task).map(Some).collect(),
        None => Vec::new(),
    };
    flag_chunks.resize_with(rows.len().div_ceil(per_task), || None);
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = rows
            .chunks_mut(per_task)
            .zip(flag_chunks)
            .enumerate()
            .map(|(i, (rows, flags))| scope.spawn(move || work(i * per_task, rows, flags)))
            .collect();
        handles.into_iter().try_for_each(|handle| {
            handle.join().unwrap_or_else(|_| {
                Err(DataFusionError::Internal(
                    "a host worker thread panicked".into(),
                ))
            })
        })
    })
}

/// Where each of pieces of `lengths` rows begins when they are laid end to
/// end (the row of each batch's first row among all batches' rows).
pub(crate) fn starts_of(lengths: impl IntoIterator<Item = usize>) -> Vec<usize> {
    lengths
        .into_iter()
        .scan(0, |start, len| {
            let this = *start;
            *start += len;
            Some(this)
        })
        .collect()
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

    #[test]
    fn ranges_cover_the_length_in_order_without_empty_ones() {
        for (len, tasks) in [(10, 3), (10, 1), (10, 0), (3, 8), (1, 1), (16, 4)] {
            let ranges = on_ranges(len, tasks, Ok).unwrap();
            assert!(ranges.len() <= tasks.max(1), "{len} in {tasks}: {ranges:?}");
            assert!(ranges.iter().all(|r| !r.is_empty()), "{ranges:?}");
            let covered: Vec<usize> = ranges.into_iter().flatten().collect();
            assert_eq!(covered, (0..len).collect::<Vec<_>>());
        }
        assert!(on_ranges(0, 4, Ok).unwrap().is_empty());
    }

    #[test]
    fn row_chunks_fill_one_buffer_and_their_flags() {
        for per_task in [1, 3, 10, 100] {
            let mut rows = vec![0usize; 10];
            let mut flags = vec![false; 10];
            on_row_chunks(
                &mut rows,
                Some(&mut flags),
                per_task,
                |start, rows, flags| {
                    for (i, row) in rows.iter_mut().enumerate() {
                        *row = start + i;
                    }
                    flags.expect("given")[0] = true;
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(rows, (0..10).collect::<Vec<_>>());
            let firsts: Vec<bool> = (0..10).map(|i| i % per_task == 0).collect();
            assert_eq!(flags, firsts, "{per_task} a task");
        }
        let mut empty: Vec<u8> = Vec::new();
        let mut no_flags: Vec<bool> = Vec::new();
        on_row_chunks(&mut empty, Some(&mut no_flags), 0, |start, rows, flags| {
            assert_eq!((start, rows.len(), flags.map(|f| f.len())), (0, 0, Some(0)));
            Ok(())
        })
        .unwrap();
        let mut rows = vec![0u8; 4];
        let failed = on_row_chunks::<u8, bool>(&mut rows, None, 2, |start, _, flags| {
            assert!(flags.is_none());
            match start {
                2 => Err(DataFusionError::Internal("chunk at 2".into())),
                _ => Ok(()),
            }
        });
        assert!(failed.unwrap_err().to_string().contains("chunk at 2"));
    }
}
