//! Join key filters: a hash join that stays on the CPU hands the keys of its
//! build side to the scan of its probe side, which then keeps only the rows
//! whose key is among them: on the GPU (`algorithm=scan_filter`, over the
//! table's columns in the device column cache) where the device reads the
//! scan, else in a `FilterExec` on the host. The join gets fewer rows to
//! repartition and probe; its result is the same, since a probe row whose
//! key no build row holds makes no output in the joins it is used for.
//!
//! [`JoinKeyCollectorExec`] sits above the build side and gathers one
//! integer key into a [`JoinKeySet`]; the scan tests [`JoinKeyFilterExpr`]
//! (on the device, `ScanOp::KeyTest`, a bitmap of the keys) once the set
//! is complete. DataFusion's hash join reads its whole build side (in every
//! partition, where its dynamic filter is in use) before it reads its
//! probe side, so the set is normally there when the scan starts. In a
//! multi-threaded runtime the collector reads its build side ahead of the
//! join, from the moment it is executed, so that a chain of joins reads its
//! build sides at once. A scan DataFusion may start early (below a merge of
//! partitions, which reads its input as soon as it is executed, or below a
//! build side read ahead) waits for a set whose build side is read in one
//! partition ([`JoinKeyWaitExec`] on the host, the GPU scan itself) or, the
//! GPU scan, read ahead; where a set is still not there, rows pass untested.

mod bitmap;
mod collector;
mod expr;
mod set;
mod wait;

pub(crate) use collector::gathers_keys_of;
pub use collector::JoinKeyCollectorExec;
pub(crate) use expr::{kept_by_join_keys, rows_passing};
pub use expr::JoinKeyFilterExpr;
pub use set::{JoinKeySet, MAX_KEPT_SHARE, MAX_KEPT_SHARE_OF_STRINGS};
pub(crate) use wait::{key_sets_in, waits_for};
pub use wait::JoinKeyWaitExec;
