//! The device column cache: table columns kept in device memory between
//! queries, one entry per column of one part of a table (a Parquet file or
//! byte range of one, a `MemTable` partition), under a key the caller makes
//! from what identifies that part's data (so that changed data misses).
//!
//! The cache holds at most a share of the device budget (the caller's
//! `gpu.cache_memory_fraction`), evicts the least recently used entries to
//! stay within it, and gives way to every other reservation: where the
//! budget cannot fit a request, it evicts entries that no query is reading
//! before the request waits or fails ([`super::DeviceBudget`] calls
//! [`Evict::evict`]). An entry a query still reads lives on (the query holds
//! it) until that query drops it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::ArrayRef;

use super::{DeviceReservation, DeviceVec};

/// How a cached column's 8-byte words are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordKind {
    /// Signed 64-bit integers: integers, dates, timestamps, booleans (0 or
    /// 1), decimals as their unscaled value.
    I64,
    /// The bits of a double.
    F64,
    /// Codes into the entry's host dictionary.
    Code,
    /// Strings as their bytes: the words are `rows + 1` 4-byte offsets
    /// into the entry's `bytes`.
    Bytes,
}

/// One column of one part of a table in device memory: one 8-byte word a
/// row (or one 4-byte integer, see `narrow`), a validity bitmap where it has NULLs, and, for a dictionary-coded
/// column, the values its codes stand for (on the host).
#[derive(Debug)]
pub struct CachedColumn {
    pub rows: usize,
    #[cfg_attr(not(any(test, feature = "test-support")), allow(dead_code))]
    pub kind: WordKind,
    /// The values are 4-byte signed integers, two to a word.
    pub narrow: bool,
    pub values: DeviceVec<u64>,
    pub validity: Option<DeviceVec<u64>>,
    /// The distinct values a coded column's codes index, in code order.
    pub dictionary: Option<ArrayRef>,
    /// A [`WordKind::Bytes`] column's bytes (padded to whole words) and
    /// their count.
    pub bytes: Option<(DeviceVec<u64>, usize)>,
    /// Host arrays whose buffers the key names: held so that their memory
    /// cannot be freed and reused by other data under the same key while
    /// the entry lives (never read).
    #[allow(dead_code)]
    pub keep_alive: Vec<ArrayRef>,
    /// The entry's share of the device budget.
    pub reservation: DeviceReservation,
}

/// What a cache entry holds: its device bytes.
pub trait Cached: Send + Sync + std::fmt::Debug {
    /// Device bytes the entry holds.
    fn device_bytes(&self) -> usize;
}

impl Cached for CachedColumn {
    fn device_bytes(&self) -> usize {
        self.reservation.bytes()
    }
}

/// What the cache holds and has done, since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ColumnCacheStats {
    /// Columns held.
    pub entries: usize,
    /// Device bytes they hold.
    pub bytes: usize,
    /// Lookups that found their column.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Columns evicted, to stay within the cache's share or to make room
    /// for other work.
    pub evictions: u64,
}

/// Frees device memory on request: what the budget asks of the cache when
/// a reservation does not fit.
pub trait Evict: Send + Sync + std::fmt::Debug {
    /// Evicts entries no one is reading, least recently used first, until
    /// at least `bytes` are freed or none is left; returns the bytes freed.
    fn evict(&self, bytes: usize) -> usize;
}

#[derive(Debug)]
struct Entry<T> {
    column: Arc<T>,
    last_used: u64,
}

#[derive(Debug)]
struct CacheState<T> {
    entries: HashMap<String, Entry<T>>,
    clock: u64,
    bytes: usize,
}

/// The device column cache of one device (see the module docs).
pub type ColumnCache = DeviceCache<CachedColumn>;

/// A least-recently-used cache of device data (see the module docs).
#[derive(Debug)]
pub struct DeviceCache<T> {
    state: Mutex<CacheState<T>>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl<T: Cached> DeviceCache<T> {
    /// An empty cache.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(CacheState {
                entries: HashMap::new(),
                clock: 0,
                bytes: 0,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState<T>> {
        // The map and its byte count are updated together under the lock
        // and never left half done, so a poisoned lock holds a whole state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The column under `key`, marked as just used; counts a hit or a miss.
    pub fn get(&self, key: &str) -> Option<Arc<T>> {
        let mut state = self.lock();
        state.clock += 1;
        let clock = state.clock;
        match state.entries.get_mut(key) {
            Some(entry) => {
                entry.last_used = clock;
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(Arc::clone(&entry.column))
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Keeps `column` under `key` within `capacity` bytes, evicting the
    /// least recently used entries that no one reads to make room; a
    /// column that cannot fit is not kept. Returns the column either way.
    pub fn insert(&self, key: String, column: T, capacity: usize) -> Arc<T> {
        let column = Arc::new(column);
        let bytes = column.device_bytes();
        // What leaves the map is dropped after the lock is released
        // (dropping returns reservations to the budget, which locks too).
        let (evicted, replaced) = {
            let mut state = self.lock();
            let replaced = state.entries.remove(&key);
            if let Some(old) = &replaced {
                state.bytes -= old.column.device_bytes();
            }
            let over = (state.bytes + bytes).saturating_sub(capacity);
            let evicted = evict_unused(&mut state, over);
            // Where entries in use hold the rest, the newcomer goes unkept.
            if state.bytes + bytes <= capacity {
                state.clock += 1;
                let last_used = state.clock;
                state.bytes += bytes;
                state.entries.insert(
                    key,
                    Entry {
                        column: Arc::clone(&column),
                        last_used,
                    },
                );
            }
            (evicted, replaced)
        };
        drop(replaced);
        finish(self, evicted.into_iter(), column)
    }

    /// Drops every entry (queries reading one keep it until they finish).
    pub fn clear(&self) {
        let dropped: Vec<Entry<T>> = {
            let mut state = self.lock();
            state.bytes = 0;
            state.entries.drain().map(|(_, entry)| entry).collect()
        };
        self.evictions
            .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        drop(dropped);
    }

    /// What the cache holds and has done.
    pub fn stats(&self) -> ColumnCacheStats {
        let state = self.lock();
        ColumnCacheStats {
            entries: state.entries.len(),
            bytes: state.bytes,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

/// Counts `evicted` and drops them outside the cache's lock (dropping
/// returns their reservations to the budget, which takes its own lock),
/// then hands `column` back.
fn finish<T: Cached>(
    cache: &DeviceCache<T>,
    evicted: impl Iterator<Item = Entry<T>>,
    column: Arc<T>,
) -> Arc<T> {
    let evicted: Vec<Entry<T>> = evicted.collect();
    cache
        .evictions
        .fetch_add(evicted.len() as u64, Ordering::Relaxed);
    drop(evicted);
    column
}

/// Takes out of `state` the least recently used entries that only the
/// cache holds, until `bytes` are out or none is left.
fn evict_unused<T: Cached>(state: &mut CacheState<T>, bytes: usize) -> Vec<Entry<T>> {
    if bytes == 0 {
        return Vec::new();
    }
    let mut unused: Vec<(u64, String)> = state
        .entries
        .iter()
        .filter(|(_, entry)| Arc::strong_count(&entry.column) == 1)
        .map(|(key, entry)| (entry.last_used, key.clone()))
        .collect();
    unused.sort_unstable();
    let mut out = Vec::new();
    let mut freed = 0;
    for (_, key) in unused {
        if freed >= bytes {
            break;
        }
        if let Some(entry) = state.entries.remove(&key) {
            let entry_bytes = entry.column.device_bytes();
            state.bytes -= entry_bytes;
            freed += entry_bytes;
            out.push(entry);
        }
    }
    out
}

impl<T: Cached> Evict for DeviceCache<T> {
    fn evict(&self, bytes: usize) -> usize {
        let evicted = evict_unused(&mut self.lock(), bytes);
        let freed = evicted.iter().map(|e| e.column.device_bytes()).sum();
        self.evictions
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        // Dropped here, outside the cache's lock; the caller holds no lock
        // of the budget's either (see `DeviceBudget::reserve_together`).
        drop(evicted);
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Bytes(usize);

    impl Cached for Bytes {
        fn device_bytes(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn least_recently_used_entries_go_first_to_stay_within_capacity() {
        let cache = DeviceCache::<Bytes>::new();
        cache.insert("a".into(), Bytes(40), 100);
        cache.insert("b".into(), Bytes(40), 100);
        assert!(cache.get("a").is_some()); // b is now the older one
        cache.insert("c".into(), Bytes(40), 100);
        assert!(cache.get("b").is_none());
        assert!(cache.get("a").is_some());
        assert!(cache.get("c").is_some());
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.bytes, stats.evictions), (2, 80, 1));
        assert_eq!((stats.hits, stats.misses), (3, 1));
    }

    #[test]
    fn entries_in_use_are_not_evicted_and_a_column_that_cannot_fit_is_not_kept() {
        let cache = DeviceCache::<Bytes>::new();
        let held = cache.insert("a".into(), Bytes(60), 100);
        let returned = cache.insert("b".into(), Bytes(60), 100);
        assert_eq!(returned.0, 60);
        assert!(cache.get("b").is_none(), "b did not fit beside a, which is read");
        assert!(cache.get("a").is_some());
        assert_eq!(cache.evict(1000), 0, "a is in use");
        drop(held);
        assert_eq!(cache.evict(1), 60);
        assert_eq!(cache.stats().entries, 0);
        assert_eq!(cache.stats().bytes, 0);
    }

    #[test]
    fn a_key_inserted_again_replaces_its_entry_and_clear_empties_the_cache() {
        let cache = DeviceCache::<Bytes>::new();
        cache.insert("a".into(), Bytes(10), 100);
        cache.insert("a".into(), Bytes(30), 100);
        assert_eq!(cache.stats().bytes, 30);
        assert_eq!(cache.get("a").map(|a| a.0), Some(30));
        cache.clear();
        assert_eq!(cache.stats().entries, 0);
        assert!(cache.get("a").is_none());
    }
}
