//! Validated GGUF headers (llama.cpp's single-file model format), versions 2 and 3,
//! little-endian.
//!
//! A GGUF file is: magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata count, the
//! metadata key–value pairs, one tensor info per tensor (name, `u32` rank, `u64` dims innermost
//! first, `u32` ggml type, `u64` offset relative to the data section), padding to the alignment
//! (`general.alignment`, default 32), and the data section.
//!
//! Everything is hostile input. Validation, in order, every step with checked arithmetic and
//! stopping at the first failure:
//! 1. magic, version 2 or 3 (a byte-swapped version means a big-endian file, refused; version 1
//!    is refused), counts at most [`MAX_TENSORS`] and [`MAX_KV`];
//! 2. every string at most [`MAX_STRING_LEN`] bytes, valid UTF-8; every array at most
//!    [`MAX_ARRAY_LEN`] elements, nested at most [`MAX_ARRAY_DEPTH`] deep; every count is checked
//!    against the bytes actually remaining before anything proportional to it is allocated;
//!    value types known; booleans 0 or 1; no key twice;
//! 3. `general.alignment`, when present, a `u32` power of two at most [`MAX_ALIGNMENT`];
//! 4. per tensor: name at most [`MAX_NAME_LEN`] bytes and not seen before, rank 1 to
//!    [`MAX_DIMS`], every dim at most `i64::MAX`, ggml type known (else
//!    [`crate::FormatError::GgufUnknownType`] naming the tensor and the id), the row length (dim 0) a
//!    multiple of the type's block size, byte size = elements / block size × type size without
//!    overflow, offset a multiple of the alignment, data inside the file;
//! 5. across tensors: no two byte ranges overlap.
//!
//! The data section starts at the end of the header rounded up to the alignment, which must lie
//! inside the file — except in a file without tensors, which may end before its padding.
//!
//! [`parse`] works on a byte slice holding a prefix of the file (the fuzz target gives it whole
//! files); [`GgufFile::open`] reads only as much of the file as the header needs, growing its
//! read until the header fits (at most [`MAX_HEADER_BYTES`]). [`GgufSet::open`] opens a split
//! model, `NAME-0000N-of-0000M.gguf`.
//!
//! The code is in `types.rs` (ggml types and metadata values), `header.rs` (the parser and the
//! validated header) and `file.rs` (reading headers from files and split sets).

mod file;
mod header;
mod types;

pub use file::{GgufFile, GgufSet, split_name};
pub use header::{Gguf, GgufTensor, parse};
pub use types::{Array, GgmlType, Value, ValueType};

/// The file magic.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The largest `general.alignment` accepted.
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// The largest tensor count accepted.
pub const MAX_TENSORS: u64 = 1 << 20;
/// The largest metadata key–value count accepted.
pub const MAX_KV: u64 = 1 << 16;
/// The longest string accepted (keys, values, tensor names), in bytes.
pub const MAX_STRING_LEN: u64 = 64 << 20;
/// The longest tensor name accepted, in bytes.
pub const MAX_NAME_LEN: u64 = 1024;
/// The most elements accepted in one metadata array.
pub const MAX_ARRAY_LEN: u64 = 1 << 26;
/// The deepest nesting of metadata arrays accepted (an array of arrays is depth 2).
pub const MAX_ARRAY_DEPTH: usize = 4;
/// The most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// The largest header (everything before the data section) [`GgufFile::open`] will read.
pub const MAX_HEADER_BYTES: u64 = 1 << 30;

#[cfg(test)]
mod tests;
