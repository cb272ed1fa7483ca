//! A GPU hash join's probe input, read ahead while its build side is
//! collected (`gpu.tuning.read_probe_ahead`, off by default). DataFusion's
//! `HashJoinExec` reads its probe side only once its build side is in, so
//! the scans, filters and joins below the probe side wait for the build
//! side's scan. Here the join's task polls its probe input while it awaits
//! the build side: what runs in tasks of its own below the probe side
//! (DataFusion's repartitions and merges, the column cache's scans) then
//! runs beside the build side's scan, and the join probes with their first
//! batches as soon as its table is made. That pays where the build side
//! waits on its storage; where both sides decode files on every core they
//! only share the cores. What is read ahead is held in order, counted in
//! the session's memory pool, and handed on before anything read after it:
//! the join sees the same batches in the same order either way.

use std::collections::VecDeque;
use std::future::Future;

use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::metrics::Count;
use futures::stream::{BoxStream, StreamExt};

/// What an item read ahead holds while it waits for the join.
pub(crate) trait HeldAhead {
    /// Bytes of host memory it holds, or `None` for an item that holds
    /// device memory: nothing is read ahead past it.
    fn bytes_held(&self) -> Option<usize>;
    /// Rows in it.
    fn rows(&self) -> usize;
}

/// How far a probe input is read ahead, and where that is counted.
pub(crate) struct ReadAheadLimit {
    /// Bytes held from which the read ahead stops (the item that reaches
    /// them is held, and counted).
    pub(crate) max_bytes: usize,
    /// The bytes held, in the session's memory pool: an item the pool
    /// refuses is held uncounted, and the read ahead stops.
    pub(crate) reservation: MemoryReservation,
    /// Rows read ahead (`probe_rows_read_ahead`).
    pub(crate) rows: Count,
}

/// A probe input that can be read ahead while a future (the build side) is
/// awaited: [`Self::next`] hands on what was read ahead first, then reads
/// on.
pub(crate) struct ProbeReader<T> {
    input: BoxStream<'static, Result<T>>,
    /// Items read ahead, in order, each with the bytes it holds.
    held: VecDeque<(Result<T>, usize)>,
    /// The input ended while it was read ahead.
    ended: bool,
    limit: Option<ReadAheadLimit>,
}

impl<T: HeldAhead> ProbeReader<T> {
    /// Reads `input`; read ahead within `limit`, or not at all without one.
    pub(crate) fn new(input: BoxStream<'static, Result<T>>, limit: Option<ReadAheadLimit>) -> Self {
        Self {
            input,
            held: VecDeque::new(),
            ended: false,
            limit,
        }
    }

    /// Awaits `build`, reading the input ahead meanwhile: until the input
    /// ends or fails, an item holds device memory, the bytes held reach the
    /// limit or the memory pool refuses an item's. The read ahead then
    /// waits; nothing is read ahead once `build` is ready, or without a
    /// limit.
    pub(crate) async fn read_ahead_until<F: Future>(&mut self, build: F) -> F::Output {
        let mut build = std::pin::pin!(build);
        let Some(limit) = &self.limit else {
            return build.await;
        };
        let mut reading = true;
        let mut bytes = 0;
        loop {
            if !reading {
                return build.await;
            }
            let read = {
                let next = self.input.next();
                futures::pin_mut!(next);
                match futures::future::select(build.as_mut(), next).await {
                    futures::future::Either::Left((built, _)) => return built,
                    futures::future::Either::Right((read, _)) => read,
                }
            };
            let Some(item) = read else {
                self.ended = true;
                reading = false;
                continue;
            };
            let held = match &item {
                Ok(item) => item.bytes_held(),
                Err(_) => None,
            };
            if let Ok(item) = &item {
                limit.rows.add(item.rows());
            }
            // Every item read is held; one the pool refuses uncounted.
            let counted = held.filter(|&size| limit.reservation.try_grow(size).is_ok());
            bytes += counted.unwrap_or(0);
            self.held.push_back((item, counted.unwrap_or(0)));
            reading = counted.is_some() && bytes < limit.max_bytes;
        }
    }

    /// The next item: those read ahead first, then the input's.
    pub(crate) async fn next(&mut self) -> Option<Result<T>> {
        if let Some((item, bytes)) = self.held.pop_front() {
            if let Some(limit) = &self.limit {
                limit.reservation.shrink(bytes);
            }
            return Some(item);
        }
        if self.ended {
            return None;
        }
        self.input.next().await
    }

    /// Whether the input is read ahead while the build side is awaited.
    pub(crate) fn reads_ahead(&self) -> bool {
        self.limit.is_some()
    }

    /// Items read ahead and not yet taken.
    #[cfg(test)]
    fn held_items(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use datafusion::error::DataFusionError;
    use datafusion::execution::memory_pool::{
        GreedyMemoryPool, MemoryConsumer, MemoryPool, UnboundedMemoryPool,
    };
    use futures::channel::oneshot;

    /// A test item: its rows, and the bytes it holds (`None`: device
    /// memory).
    #[derive(Debug, Clone, PartialEq)]
    struct Item(usize, Option<usize>);

    impl HeldAhead for Item {
        fn bytes_held(&self) -> Option<usize> {
            self.1
        }
        fn rows(&self) -> usize {
            self.0
        }
    }

    fn limit(pool: &Arc<dyn MemoryPool>, max_bytes: usize) -> ReadAheadLimit {
        ReadAheadLimit {
            max_bytes,
            reservation: MemoryConsumer::new("probe read ahead").register(pool),
            rows: Count::new(),
        }
    }

    /// A stream of `items` that counts how many were taken from it.
    fn counted(items: Vec<Result<Item>>) -> (BoxStream<'static, Result<Item>>, Arc<AtomicUsize>) {
        let taken = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&taken);
        let stream = futures::stream::iter(items).inspect(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        (stream.boxed(), taken)
    }

    async fn drain(reader: &mut ProbeReader<Item>) -> Vec<Item> {
        let mut out = Vec::new();
        while let Some(item) = reader.next().await {
            out.push(item.unwrap());
        }
        out
    }

    fn host(rows: usize) -> Item {
        Item(rows, Some(rows * 8))
    }

    /// While the build side is pending the input is read ahead to its end,
    /// and the join gets every item once, in order, the memory given back.
    #[tokio::test]
    async fn a_pending_build_side_reads_the_probe_side_ahead_in_order() {
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let items: Vec<Item> = (1..=5).map(host).collect();
        let (input, taken) = counted(items.iter().cloned().map(Ok).collect());
        let read_ahead = limit(&pool, 1 << 20);
        let rows = read_ahead.rows.clone();
        let mut reader = ProbeReader::new(input, Some(read_ahead));
        let (send, build) = oneshot::channel::<u32>();
        let reading = async {
            // Ready only after the reader has had the input to itself.
            tokio::task::yield_now().await;
            send.send(7).unwrap();
        };
        let (built, ()) = futures::join!(reader.read_ahead_until(build), reading);
        assert_eq!(built.unwrap(), 7);
        assert_eq!(taken.load(Ordering::SeqCst), 5, "the whole input read ahead");
        assert_eq!(reader.held_items(), 5);
        assert_eq!(rows.value(), 15);
        assert_eq!(pool.reserved(), 8 * 15);
        assert_eq!(drain(&mut reader).await, items);
        assert_eq!(pool.reserved(), 0);
    }

    /// A build side ready at once reads nothing ahead; without a limit
    /// nothing is read ahead either.
    #[tokio::test]
    async fn a_ready_build_side_or_no_limit_reads_nothing_ahead() {
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let items: Vec<Item> = (1..=3).map(host).collect();
        for with_limit in [true, false] {
            let (input, taken) = counted(items.iter().cloned().map(Ok).collect());
            let mut reader = ProbeReader::new(input, with_limit.then(|| limit(&pool, 1 << 20)));
            assert_eq!(reader.read_ahead_until(async { 3 }).await, 3);
            assert_eq!(taken.load(Ordering::SeqCst), 0);
            assert_eq!(drain(&mut reader).await, items);
        }
        // Without a limit, a pending build side reads nothing ahead.
        let (input, taken) = counted(items.iter().cloned().map(Ok).collect());
        let mut reader = ProbeReader::new(input, None);
        let (send, build) = oneshot::channel::<u32>();
        let ready = async {
            tokio::task::yield_now().await;
            send.send(1).unwrap();
        };
        let (built, ()) = futures::join!(reader.read_ahead_until(build), ready);
        assert_eq!(built.unwrap(), 1);
        assert_eq!(taken.load(Ordering::SeqCst), 0);
        assert_eq!(drain(&mut reader).await, items);
    }

    /// The read ahead stops after the item that takes it past its bytes, an
    /// item on the device, an error, or a refusal of the memory pool; the
    /// rest is read after, in order, and an error reaches the join in its
    /// place.
    #[tokio::test]
    async fn the_read_ahead_stops_at_its_bound_the_device_an_error_or_the_pool() {
        let pending_build = || futures::future::pending::<()>();
        let cases: Vec<(&str, Vec<Result<Item>>, usize, usize)> = vec![
            // 8 + 16 bytes stay below 30; the third (24 more) reaches it.
            ("bound", (1..=5).map(|r| Ok(host(r))).collect(), 30, 3),
            (
                "device",
                vec![Ok(host(1)), Ok(Item(9, None)), Ok(host(2)), Ok(host(3))],
                1 << 20,
                2,
            ),
            (
                "error",
                vec![
                    Ok(host(1)),
                    Err(DataFusionError::Execution("probe failed".into())),
                    Ok(host(2)),
                ],
                1 << 20,
                2,
            ),
        ];
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        for (case, items, max_bytes, read) in cases {
            let expected: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
            let (input, taken) = counted(items);
            let mut reader = ProbeReader::new(input, Some(limit(&pool, max_bytes)));
            // The build side never comes: the read ahead stops by itself.
            let stopped = tokio::time::timeout(
                std::time::Duration::from_millis(200),
                reader.read_ahead_until(pending_build()),
            )
            .await;
            assert!(stopped.is_err(), "{case}: the build side is still pending");
            assert_eq!(taken.load(Ordering::SeqCst), read, "{case}");
            assert_eq!(reader.held_items(), read, "{case}");
            let mut got = Vec::new();
            while let Some(item) = reader.next().await {
                got.push(format!("{item:?}"));
            }
            assert_eq!(got, expected, "{case}");
            assert_eq!(pool.reserved(), 0, "{case}");
        }
        // A pool that refuses the second item's bytes.
        let small: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(20));
        let items: Vec<Item> = (1..=4).map(host).collect();
        let (input, taken) = counted(items.iter().cloned().map(Ok).collect());
        let mut reader = ProbeReader::new(input, Some(limit(&small, 1 << 20)));
        let stopped = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            reader.read_ahead_until(pending_build()),
        )
        .await;
        assert!(stopped.is_err());
        assert_eq!(taken.load(Ordering::SeqCst), 2, "8 bytes fit, 16 more do not");
        assert_eq!(small.reserved(), 8);
        assert_eq!(drain(&mut reader).await, items);
        assert_eq!(small.reserved(), 0);
    }

    /// A build side ready while the next item is awaited: that item is not
    /// lost, and comes first after the build side.
    #[tokio::test]
    async fn an_item_awaited_when_the_build_side_is_ready_is_not_lost() {
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let (send, received) = futures::channel::mpsc::unbounded::<Result<Item>>();
        let mut reader = ProbeReader::new(received.boxed(), Some(limit(&pool, 1 << 20)));
        send.unbounded_send(Ok(host(1))).unwrap();
        let (built, build) = oneshot::channel::<()>();
        let ready = async {
            // The reader has taken the first item and waits for the next.
            tokio::task::yield_now().await;
            built.send(()).unwrap();
        };
        let (result, ()) = futures::join!(reader.read_ahead_until(build), ready);
        result.unwrap();
        assert_eq!(reader.held_items(), 1);
        send.unbounded_send(Ok(host(2))).unwrap();
        send.unbounded_send(Ok(host(3))).unwrap();
        drop(send);
        assert_eq!(drain(&mut reader).await, vec![host(1), host(2), host(3)]);
        assert_eq!(pool.reserved(), 0);
    }

    /// An input that ends while read ahead is not read again.
    #[tokio::test]
    async fn an_input_ended_while_read_ahead_is_not_read_again() {
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let polled_after_end = Arc::new(AtomicUsize::new(0));
        let after = Arc::clone(&polled_after_end);
        let input = futures::stream::iter(vec![Ok(host(2))])
            .chain(futures::stream::poll_fn(move |_| {
                after.fetch_add(1, Ordering::SeqCst);
                std::task::Poll::Ready(None)
            }))
            .boxed();
        let mut reader = ProbeReader::new(input, Some(limit(&pool, 1 << 20)));
        let (send, build) = oneshot::channel::<()>();
        let ready = async {
            tokio::task::yield_now().await;
            send.send(()).unwrap();
        };
        let (built, ()) = futures::join!(reader.read_ahead_until(build), ready);
        built.unwrap();
        assert_eq!(polled_after_end.load(Ordering::SeqCst), 1);
        assert_eq!(drain(&mut reader).await, vec![host(2)]);
        assert_eq!(polled_after_end.load(Ordering::SeqCst), 1, "the end read once");
    }
}
