//! Host utilities the operators share: work spread over threads
//! ([`parallel`]), large copies ([`copy`]), output memory mapped
//! ahead ([`mapped_ahead`]), Arrow buffers read in place
//! ([`array_buffers`]), a future shared by partitions ([`once`]) and inputs
//! dropped off the query's path ([`release`]).

pub(crate) mod array_buffers;
pub(crate) mod copy;
pub(crate) mod mapped_ahead;
pub(crate) mod once;
pub(crate) mod parallel;
pub(crate) mod release;
