//! sluice's expert store.
//!
//! Routed experts stay in the checkpoint's own shards and are read in place — O_DIRECT where the
//! file system allows it, buffered reads that drop their pages otherwise — into aligned buffers
//! behind an in-memory cache. This crate moves bytes; it never interprets them.

mod aligned;
mod error;
mod experts;
pub mod io;
pub mod policy;
mod pool;
#[cfg(target_os = "linux")]
mod ring;
/// No io_uring off Linux: nothing of this type exists.
#[cfg(not(target_os = "linux"))]
mod ring {
    #[derive(Debug)]
    pub(crate) enum RingReader {}
}
pub mod probe;
pub mod trace;
mod trunk;

pub use aligned::AlignedBuf;
pub use error::StoreError;
pub use experts::{
    Arrivals, ExpertStats, ExpertStore, ExpertStoreConfig, GUESS_MARGIN, GUESS_PROBE_EVERY, Guess,
    Lease, PREFETCH_PRECISION, PREFETCH_PRECISION_LATE, PREFETCH_WARMUP, Pinned, READ_PART,
};
pub use io::{Blob, IoMode, Piece, Reader, ShardFile, ShardSet, read_blob};
pub use policy::{Key, Policy, PolicyChoice, PolicyFactory};
pub use trace::{SimResult, TraceEvent, belady, read_trace, simulate, write_trace};
pub use trunk::{TrunkPart, TrunkStats, TrunkStore, Verifier, part_footprint};
