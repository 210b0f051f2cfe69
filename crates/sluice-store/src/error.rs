//! The one error type of this crate.

use std::io;
use std::path::PathBuf;

/// What can go wrong moving bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An operating-system error reading a shard.
    #[error("{}: read at offset {offset}: {source}", path.display())]
    Io {
        /// The shard.
        path: PathBuf,
        /// Where the read started.
        offset: u64,
        /// The underlying error.
        source: io::Error,
    },
    /// `--io uring` asked for, and no io_uring could be set up for the shards' reads.
    #[error("{}: cannot queue its reads on an io_uring: {source}; use --io direct", path.display())]
    Ring {
        /// The first shard.
        path: PathBuf,
        /// Why (io_uring disabled by `kernel.io_uring_disabled`, a seccomp filter, an old
        /// kernel, not Linux).
        source: io::Error,
    },
    /// An operating-system error writing a file (a trace, a scratch file).
    #[error("{}: write: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The file ended before the bytes its header promised.
    #[error("{}: short read at offset {offset}: wanted {wanted} bytes, got {got} (file truncated?)", path.display())]
    ShortRead {
        /// The shard.
        path: PathBuf,
        /// Where the read started.
        offset: u64,
        /// Bytes needed.
        wanted: u64,
        /// Bytes obtained.
        got: u64,
    },
    /// An allocation failed.
    #[error("could not allocate {bytes} bytes")]
    Alloc {
        /// Bytes asked for.
        bytes: u64,
    },
    /// The memory budget cannot hold what is needed.
    #[error(
        "memory budget of {budget} bytes is too small: at least {minimum} bytes are needed ({what})"
    )]
    BudgetTooSmall {
        /// The budget given.
        budget: u64,
        /// The smallest budget that works.
        minimum: u64,
        /// What the minimum is made of.
        what: String,
    },
    /// A layer or expert id outside the model.
    #[error("no expert {expert} in layer {layer}")]
    NoSuchExpert {
        /// Layer.
        layer: usize,
        /// Expert.
        expert: u32,
    },
    /// Bytes read do not match their checksum.
    #[error("{0}")]
    Corrupt(String),
    /// A lease on the expert cache's capacity could not grow: the cache is at its floor.
    #[error(
        "no room for {wanted} more bytes beside the expert cache's floor of {floor} bytes ({free} bytes could still be lent)"
    )]
    NoRoom {
        /// Bytes asked for.
        wanted: u64,
        /// Bytes the cache could still lend.
        free: u64,
        /// The least the cache keeps.
        floor: u64,
    },
    /// A cache policy name that is not known.
    #[error("unknown cache policy `{0}` (known: {known})", known = crate::policy::known())]
    UnknownPolicy(String),
    /// An earlier read of the same bytes failed; the failure is shared with every waiter.
    #[error("{0}")]
    Shared(String),
}
