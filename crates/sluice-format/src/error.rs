//! The one error type of this crate.

use std::io;
use std::path::PathBuf;

use crate::Dtype;

/// Everything that can go wrong reading a checkpoint. Each variant names the file and, where one
/// is involved, the tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// An operating-system error on a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A read of a tensor's bytes failed or came up short.
    #[error("{}: reading tensor `{tensor}` (bytes {offset}..{end}): {source}", path.display())]
    Read {
        /// The shard.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// First byte read.
        offset: u64,
        /// One past the last byte read.
        end: u64,
        /// The underlying error (`UnexpectedEof` when the file is shorter than its header says).
        source: io::Error,
    },
    /// A file that must be a regular file is a FIFO, a device, a directory or a socket.
    #[error("{}: {kind}, not a regular file", path.display())]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// A file is larger than the size accepted for it.
    #[error("{}: {len} bytes is larger than the {cap} accepted", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its length (at least).
        len: u64,
        /// The most accepted.
        cap: u64,
    },
    /// A required file is missing.
    #[error("{}: no such file", path.display())]
    MissingFile {
        /// The file.
        path: PathBuf,
    },
    /// The directory holds neither `model.safetensors` nor `model.safetensors.index.json`.
    #[error("{}: no checkpoint here (expected model.safetensors or model.safetensors.index.json)", dir.display())]
    NoCheckpoint {
        /// The directory.
        dir: PathBuf,
    },
    /// The file is too short to hold the 8-byte header length.
    #[error("{}: {len} bytes is too short for a safetensors file", path.display())]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// The declared header length exceeds the accepted maximum.
    #[error("{}: safetensors header length {header_len} exceeds the 100 MiB limit", path.display())]
    HeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// The declared length.
        header_len: u64,
    },
    /// The declared header runs past the end of the file.
    #[error("{}: safetensors header of {header_len} bytes runs past the end of the {file_len}-byte file", path.display())]
    HeaderPastEnd {
        /// The file.
        path: PathBuf,
        /// The declared length.
        header_len: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The header is not the JSON object safetensors specifies.
    #[error("{}: bad safetensors header: {msg}", path.display())]
    HeaderJson {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A header entry lacks a field or has one of the wrong form.
    #[error("{}: tensor `{tensor}`: {what}", path.display())]
    MalformedTensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        what: String,
    },
    /// A dtype this crate does not know.
    #[error("{}: tensor `{tensor}`: unknown dtype `{dtype}`", path.display())]
    UnknownDtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype as written.
        dtype: String,
    },
    /// Size arithmetic overflowed.
    #[error("{}: tensor `{tensor}`: size overflows", path.display())]
    Overflow {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// The byte range does not match shape × dtype size.
    #[error("{}: tensor `{tensor}`: {dtype} {shape:?} needs {expected_bytes} bytes but its range holds {actual_bytes}", path.display())]
    ShapeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<usize>,
        /// Bytes the shape and dtype need.
        expected_bytes: u64,
        /// Bytes the offsets give.
        actual_bytes: u64,
    },
    /// The byte range ends past the end of the data.
    #[error("{}: tensor `{tensor}`: data ends at {end}, past the {data_len} bytes of data in the file (truncated download?)", path.display())]
    OutOfBounds {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// End offset relative to the data section.
        end: u64,
        /// Length of the data section.
        data_len: u64,
    },
    /// Two tensors share bytes.
    #[error("{}: tensor `{tensor}` overlaps tensor `{other}`", path.display())]
    Overlap {
        /// The file.
        path: PathBuf,
        /// The tensor found overlapping.
        tensor: String,
        /// The tensor it overlaps.
        other: String,
    },
    /// The index file is malformed.
    #[error("{}: bad index: {msg}", path.display())]
    IndexJson {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The index names a shard that does not exist.
    #[error("{}: shard `{shard}` named for tensor `{tensor}` does not exist", index.display())]
    IndexMissingShard {
        /// The index file.
        index: PathBuf,
        /// The shard file name.
        shard: String,
        /// A tensor mapped to it.
        tensor: String,
    },
    /// The index maps a tensor to a shard that does not hold it.
    #[error("{}: tensor `{tensor}` is not in shard `{shard}` where the index puts it", index.display())]
    IndexMissingTensor {
        /// The index file.
        index: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shard file name.
        shard: String,
    },
    /// A shard holds a tensor the index does not map to it.
    #[error("{}: tensor `{tensor}` is not mapped to this shard by the index", path.display())]
    NotInIndex {
        /// The shard.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// The same tensor name appears twice.
    #[error("tensor `{tensor}` appears in both {} and {}", first.display(), second.display())]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
        /// One file.
        first: PathBuf,
        /// The other file.
        second: PathBuf,
    },
    /// Two stored tensors would be found under one name (see [`crate::Checkpoint::rename`]).
    #[error("{}: tensors `{first}` and `{second}` are both read as `{name}`", dir.display())]
    SameName {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The name both map to.
        name: String,
        /// One stored name.
        first: String,
        /// The other.
        second: String,
    },
    /// A JSON configuration file is malformed.
    #[error("{}: {msg}", path.display())]
    ConfigJson {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A pack manifest is malformed or does not match what it describes.
    #[error("{}: {msg}", path.display())]
    Manifest {
        /// The manifest or trunk file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A packed trunk run does not match its checksum.
    #[error("{}: {part}: checksum mismatch (stored {expected}, computed {actual}): the packed trunk is corrupt; pack it again", path.display())]
    Checksum {
        /// The trunk file.
        path: PathBuf,
        /// The run (`layer.N`, `embed`, `head`).
        part: String,
        /// The manifest's checksum.
        expected: String,
        /// The checksum of the bytes read.
        actual: String,
    },
    /// A GGUF header is malformed (magic, version, counts, truncation, caps).
    #[error("{}: GGUF: {msg}", path.display())]
    GgufHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A GGUF metadata entry is malformed, missing, or of another type than asked for.
    #[error("{}: GGUF key `{key}`: {msg}", path.display())]
    GgufKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        msg: String,
    },
    /// A GGUF tensor info is malformed.
    #[error("{}: GGUF tensor `{tensor}`: {msg}", path.display())]
    GgufTensor {
        /// The file.
        path: PathBuf,
        /// The tensor (`#i` when its name could not be read).
        tensor: String,
        /// What is wrong.
        msg: String,
    },
    /// A GGUF tensor of a ggml type this crate does not know.
    #[error("{}: GGUF tensor `{tensor}`: unknown ggml type {type_id}", path.display())]
    GgufUnknownType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The type id as stored.
        type_id: u32,
    },
    /// The parts of a split GGUF model do not agree.
    #[error("{}: GGUF split: {msg}", path.display())]
    GgufSplit {
        /// The part.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// No tensor of that name exists in the checkpoint.
    #[error("{}: no tensor `{tensor}` in the checkpoint{note}", dir.display())]
    TensorNotFound {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The tensor asked for.
        tensor: String,
        /// Empty, or how the names were read (a renamed checkpoint's).
        note: &'static str,
    },
}
