//! Hugging Face checkpoint directories for sluice.
//!
//! This crate reads what model publishers release — `config.json`, `generation_config.json`,
//! `model.safetensors` or sharded `model-0000N-of-0000M.safetensors` with
//! `model.safetensors.index.json` — and validates it before anything else touches it: every
//! safetensors header (length capped, JSON well formed, dtypes known, shape × dtype size equal to
//! the byte range, ranges inside the file and disjoint, all arithmetic checked) and the index
//! against the shards. For every tensor it yields the file, byte offset, byte length, dtype and
//! shape, so experts can be read in place; trunk tensors can be read into memory.
//!
//! [`gguf`] reads llama.cpp's GGUF files (v2/v3, little-endian, split sets included) with the
//! same care: header, metadata, tensor infos and byte ranges validated before anything uses them.
//!
//! Checkpoint files are treated as hostile: nothing here panics on any input, and every error
//! names the file and, where one is involved, the tensor.
//!
//! ```no_run
//! let ck = sluice_format::Checkpoint::open("models/demo")?;
//! let t = ck.tensor("model.embed_tokens.weight")?;
//! println!("{} {:?} at {}+{} in {}", t.dtype, t.shape, t.offset, t.len,
//!          ck.shards()[t.shard].path.display());
//! # Ok::<(), sluice_format::FormatError>(())
//! ```

#![forbid(unsafe_code)]

mod checkpoint;
mod dtype;
mod error;
pub mod file;
pub mod gguf;
pub mod packed;
pub mod safetensors;

pub use checkpoint::{
    Checkpoint, INDEX_FILE, SINGLE_FILE, Shard, ShardIndex, TensorInfo, gguf_in, parse_index,
    read_json,
};
pub use dtype::Dtype;
pub use error::FormatError;
