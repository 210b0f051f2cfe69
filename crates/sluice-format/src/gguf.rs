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
//!    [`FormatError::GgufUnknownType`] naming the tensor and the id), the row length (dim 0) a
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

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::FormatError;

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

/// A ggml tensor type: its id in the file, and how many elements a block of how many bytes holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types, missing_docs)]
#[non_exhaustive]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// `(type, id, name, block elements, block bytes)` as gguf-py's `GGML_QUANT_SIZES` gives them.
const TYPES: [(GgmlType, u32, &str, u32, u32); 34] = {
    use GgmlType::*;
    const K: u32 = 256;
    [
        (F32, 0, "F32", 1, 4),
        (F16, 1, "F16", 1, 2),
        (Q4_0, 2, "Q4_0", 32, 2 + 16),
        (Q4_1, 3, "Q4_1", 32, 2 + 2 + 16),
        (Q5_0, 6, "Q5_0", 32, 2 + 4 + 16),
        (Q5_1, 7, "Q5_1", 32, 2 + 2 + 4 + 16),
        (Q8_0, 8, "Q8_0", 32, 2 + 32),
        (Q8_1, 9, "Q8_1", 32, 4 + 4 + 32),
        (Q2_K, 10, "Q2_K", K, 2 + 2 + K / 16 + K / 4),
        (Q3_K, 11, "Q3_K", K, 2 + K / 4 + K / 8 + 12),
        (Q4_K, 12, "Q4_K", K, 2 + 2 + K / 2 + 12),
        (Q5_K, 13, "Q5_K", K, 2 + 2 + K / 2 + K / 8 + 12),
        (Q6_K, 14, "Q6_K", K, 2 + K / 2 + K / 4 + K / 16),
        (Q8_K, 15, "Q8_K", K, 4 + K + K / 8),
        (IQ2_XXS, 16, "IQ2_XXS", K, 2 + K / 4),
        (IQ2_XS, 17, "IQ2_XS", K, 2 + K / 4 + K / 32),
        (IQ3_XXS, 18, "IQ3_XXS", K, 2 + K / 4 + K / 8),
        (IQ1_S, 19, "IQ1_S", K, 2 + K / 8 + K / 16),
        (IQ4_NL, 20, "IQ4_NL", 32, 2 + 16),
        (IQ3_S, 21, "IQ3_S", K, 2 + K / 4 + K / 8 + K / 32 + 4),
        (IQ2_S, 22, "IQ2_S", K, 2 + K / 4 + K / 16),
        (IQ4_XS, 23, "IQ4_XS", K, 2 + 2 + K / 2 + K / 64),
        (I8, 24, "I8", 1, 1),
        (I16, 25, "I16", 1, 2),
        (I32, 26, "I32", 1, 4),
        (I64, 27, "I64", 1, 8),
        (F64, 28, "F64", 1, 8),
        (IQ1_M, 29, "IQ1_M", K, K / 8 + K / 16 + K / 32),
        (BF16, 30, "BF16", 1, 2),
        (TQ1_0, 34, "TQ1_0", K, 2 + 4 * 13),
        (TQ2_0, 35, "TQ2_0", K, 2 + 64),
        (MXFP4, 39, "MXFP4", 32, 1 + 16),
        (NVFP4, 40, "NVFP4", 64, 4 + 32),
        (Q1_0, 41, "Q1_0", 128, 2 + 16),
    ]
};

impl GgmlType {
    /// Every type this crate knows.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TYPES.iter().map(|t| t.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, u32, u32) {
        // Every variant has exactly one row (checked by a test).
        TYPES.iter().find(|t| t.0 == self).unwrap_or(&TYPES[0])
    }

    /// The type with this id in the file, if known.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().find(|t| t.1 == id).map(|t| t.0)
    }

    /// Its id in the file.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// Its name as ggml spells it.
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block.
    pub fn block_size(self) -> u64 {
        self.row().3 as u64
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.row().4 as u64
    }

    /// Bytes for `elements` elements: `None` when `elements` is not a whole number of blocks or
    /// the size overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        if !elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (elements / self.block_size()).checked_mul(self.type_size())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The type of a metadata value, with its id in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type takes in the file (a string is at least its
    /// 8-byte length, an array its 4-byte type and 8-byte length).
    fn min_bytes(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: one element type for all its elements.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Array {
    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }
}

impl Value {
    /// Its type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as a non-negative integer, whatever its integer type.
    pub fn as_uint(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// One tensor of a GGUF file, with its absolute byte range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    /// Tensor name.
    pub name: String,
    /// Dimensions as the file stores them: innermost (the row length, `ne[0]`) first.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Absolute byte offset of the tensor's data in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl GgufTensor {
    /// The shape outermost first (the reverse of [`GgufTensor::dims`]), as safetensors and
    /// PyTorch write it.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// The number of elements.
    pub fn elements(&self) -> u64 {
        // Checked when parsed.
        self.dims.iter().product()
    }

    /// The row length (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Bytes per row of `ne[0]` elements.
    pub fn row_bytes(&self) -> u64 {
        self.row_len() / self.ty.block_size() * self.ty.type_size()
    }

    /// The tensor as a matrix `(rows, cols)`: `cols = ne[0]`, `rows` the product of the other
    /// dims (ggml's row-major layout).
    pub fn matrix_dims(&self) -> (u64, u64) {
        let cols = self.row_len();
        (self.elements().checked_div(cols).unwrap_or(0), cols)
    }

    /// The absolute `(offset, len)` of slab `i` along the outermost dimension — one expert of a
    /// stacked `ffn_{gate,up,down}_exps` tensor `[n_expert, rows, cols]` — or `None` past the
    /// end (or for a 1-D tensor).
    pub fn slab(&self, i: u64) -> Option<(u64, u64)> {
        if self.dims.len() < 2 {
            return None;
        }
        let n = *self.dims.last()?;
        if i >= n {
            return None;
        }
        let len = self.len / n;
        Some((self.offset + i * len, len))
    }
}

/// A parsed and validated GGUF header.
#[derive(Clone, Debug, PartialEq)]
pub struct Gguf {
    /// The file (for error messages).
    pub path: PathBuf,
    /// 2 or 3.
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    /// Tensors in file order.
    pub tensors: Vec<GgufTensor>,
    tensor_index: HashMap<String, usize>,
    /// The alignment in force.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    /// The length of the file.
    pub file_len: u64,
}

/// Why a parse of a prefix stopped: a real error, or the prefix ended before the header did.
enum Stop {
    Err(FormatError),
    /// The header needs bytes past the prefix (but inside the file).
    More,
}

impl From<FormatError> for Stop {
    fn from(e: FormatError) -> Self {
        Stop::Err(e)
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    file_len: u64,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn header_err(&self, msg: String) -> Stop {
        Stop::Err(FormatError::GgufHeader {
            path: self.path.to_path_buf(),
            msg,
        })
    }

    /// Whether `n` more bytes are there; `More` when the prefix ends first but the file does not.
    fn need(&self, n: u64, what: &dyn Fn() -> String) -> Result<(), Stop> {
        let have = (self.bytes.len() - self.pos) as u64;
        if n <= have {
            return Ok(());
        }
        let in_file = self.file_len.saturating_sub(self.pos as u64);
        if n <= in_file && (self.bytes.len() as u64) < self.file_len {
            return Err(Stop::More);
        }
        Err(self.header_err(format!(
            "{} needs {n} bytes at offset {} but the file has {in_file} left (truncated?)",
            what(),
            self.pos
        )))
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], Stop> {
        self.need(n as u64, what)?;
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], Stop> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, Stop> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, Stop> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    /// A length-prefixed UTF-8 string of at most `max` bytes; errors via `bad`.
    fn string(
        &mut self,
        max: u64,
        what: &dyn Fn() -> String,
        bad: &dyn Fn(String) -> FormatError,
    ) -> Result<String, Stop> {
        let n = self.u64(what)?;
        if n > max {
            return Err(Stop::Err(bad(format!(
                "string of {n} bytes exceeds the {max} accepted"
            ))));
        }
        let s = self.take(n as usize, what)?;
        String::from_utf8(s.to_vec())
            .map_err(|e| Stop::Err(bad(format!("string is not UTF-8: {e}"))))
    }
}

fn key_err(path: &Path, key: &str, msg: String) -> FormatError {
    FormatError::GgufKey {
        path: path.to_path_buf(),
        key: key.to_owned(),
        msg,
    }
}

fn tensor_err(path: &Path, tensor: &str, msg: String) -> FormatError {
    FormatError::GgufTensor {
        path: path.to_path_buf(),
        tensor: tensor.to_owned(),
        msg,
    }
}

fn read_scalar(c: &mut Cursor<'_>, ty: ValueType, key: &str) -> Result<Value, Stop> {
    let path = c.path;
    let what = || format!("value of `{key}`");
    Ok(match ty {
        ValueType::U8 => Value::U8(c.arr::<1>(&what)?[0]),
        ValueType::I8 => Value::I8(c.arr::<1>(&what)?[0] as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.arr(&what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.arr(&what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.arr(&what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.arr(&what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.arr(&what)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.arr(&what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.arr(&what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.arr(&what)?)),
        ValueType::Bool => match c.arr::<1>(&what)?[0] {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => {
                return Err(Stop::Err(key_err(
                    path,
                    key,
                    format!("boolean byte {b} is neither 0 nor 1"),
                )));
            }
        },
        ValueType::String => {
            Value::String(c.string(MAX_STRING_LEN, &what, &|m| key_err(path, key, m))?)
        }
        ValueType::Array => Value::Array(read_array(c, key, 1)?),
    })
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<Array, Stop> {
    let path = c.path;
    let what = || format!("array header of `{key}`");
    let tid = c.u32(&what)?;
    let ty = ValueType::from_id(tid).ok_or_else(|| {
        Stop::Err(key_err(
            path,
            key,
            format!("unknown array element type {tid}"),
        ))
    })?;
    let n = c.u64(&what)?;
    if n > MAX_ARRAY_LEN {
        return Err(Stop::Err(key_err(
            path,
            key,
            format!("array of {n} elements exceeds the {MAX_ARRAY_LEN} accepted"),
        )));
    }
    if ty == ValueType::Array && depth >= MAX_ARRAY_DEPTH {
        return Err(Stop::Err(key_err(
            path,
            key,
            format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
        )));
    }
    // Nothing proportional to `n` is allocated before the bytes it needs at the least are seen.
    let min = n.checked_mul(ty.min_bytes()).ok_or_else(|| {
        Stop::Err(key_err(
            path,
            key,
            format!("array of {n} elements overflows"),
        ))
    })?;
    c.need(min, &|| format!("array `{key}` of {n} elements"))?;
    let n = n as usize;
    macro_rules! fixed {
        ($variant:ident, $t:ty) => {{
            const W: usize = std::mem::size_of::<$t>();
            let bytes = c.take(n * W, &what)?;
            Array::$variant(
                bytes
                    .chunks_exact(W)
                    .map(|b| {
                        let mut a = [0u8; W];
                        a.copy_from_slice(b);
                        <$t>::from_le_bytes(a)
                    })
                    .collect(),
            )
        }};
    }
    Ok(match ty {
        ValueType::U8 => Array::U8(c.take(n, &what)?.to_vec()),
        ValueType::I8 => fixed!(I8, i8),
        ValueType::U16 => fixed!(U16, u16),
        ValueType::I16 => fixed!(I16, i16),
        ValueType::U32 => fixed!(U32, u32),
        ValueType::I32 => fixed!(I32, i32),
        ValueType::F32 => fixed!(F32, f32),
        ValueType::U64 => fixed!(U64, u64),
        ValueType::I64 => fixed!(I64, i64),
        ValueType::F64 => fixed!(F64, f64),
        ValueType::Bool => {
            let bytes = c.take(n, &what)?;
            let mut v = Vec::with_capacity(n);
            for (i, &b) in bytes.iter().enumerate() {
                match b {
                    0 => v.push(false),
                    1 => v.push(true),
                    b => {
                        return Err(Stop::Err(key_err(
                            path,
                            key,
                            format!("element {i}: boolean byte {b} is neither 0 nor 1"),
                        )));
                    }
                }
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(c.string(
                    MAX_STRING_LEN,
                    &|| format!("element {i} of `{key}`"),
                    &|m| key_err(path, key, format!("element {i}: {m}")),
                )?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

/// Parses and validates a GGUF header.
///
/// `bytes` must start at offset 0 of the file and hold at least the whole header (everything
/// up to the data section); `file_len` is the length of the whole file, at least `bytes.len()`.
/// Nothing here panics on any input, and nothing is allocated beyond a small multiple of
/// `bytes.len()`.
pub fn parse(bytes: &[u8], file_len: u64, path: &Path) -> Result<Gguf, FormatError> {
    match parse_prefix(bytes, file_len, path) {
        Ok(g) => Ok(g),
        Err(Stop::Err(e)) => Err(e),
        Err(Stop::More) => Err(FormatError::GgufHeader {
            path: path.to_path_buf(),
            msg: format!(
                "the header runs past the {} bytes given (of a {file_len}-byte file)",
                bytes.len()
            ),
        }),
    }
}

fn parse_prefix(bytes: &[u8], file_len: u64, path: &Path) -> Result<Gguf, Stop> {
    if (bytes.len() as u64) > file_len {
        return Err(Stop::Err(FormatError::GgufHeader {
            path: path.to_path_buf(),
            msg: format!("{} bytes given for a {file_len}-byte file", bytes.len()),
        }));
    }
    let mut c = Cursor {
        bytes,
        pos: 0,
        file_len,
        path,
    };
    let magic: [u8; 4] = c.arr(&|| "the magic".into())?;
    if magic != MAGIC {
        return Err(c.header_err(format!("not a GGUF file (magic {magic:02x?})")));
    }
    let version = c.u32(&|| "the version".into())?;
    if version != 0 && version & 0xffff == 0 {
        return Err(c.header_err(format!(
            "big-endian GGUF (version {} byte-swapped) is not supported",
            version.swap_bytes()
        )));
    }
    match version {
        2 | 3 => {}
        1 => {
            return Err(c.header_err(
                "GGUF version 1 (32-bit counts) is not supported; convert it with a current llama.cpp"
                    .into(),
            ));
        }
        v => return Err(c.header_err(format!("unsupported GGUF version {v}"))),
    }
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.u64(&|| "the metadata count".into())?;
    if n_tensors > MAX_TENSORS {
        return Err(c.header_err(format!(
            "{n_tensors} tensors exceed the {MAX_TENSORS} accepted"
        )));
    }
    if n_kv > MAX_KV {
        return Err(c.header_err(format!(
            "{n_kv} metadata entries exceed the {MAX_KV} accepted"
        )));
    }

    // Each key–value pair takes at least 8 (key length) + 4 (type) + 1 bytes.
    c.need(n_kv * 13, &|| format!("{n_kv} metadata entries"))?;
    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut index = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = c.string(MAX_STRING_LEN, &|| format!("metadata key {i}"), &|m| {
            FormatError::GgufHeader {
                path: path.to_path_buf(),
                msg: format!("metadata key {i}: {m}"),
            }
        })?;
        let tid = c.u32(&|| format!("type of `{key}`"))?;
        let ty = ValueType::from_id(tid)
            .ok_or_else(|| Stop::Err(key_err(path, &key, format!("unknown value type {tid}"))))?;
        let value = read_scalar(&mut c, ty, &key)?;
        if index.contains_key(&key) {
            return Err(Stop::Err(key_err(path, &key, "key appears twice".into())));
        }
        index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) => {
            let a = *a as u64;
            if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                return Err(Stop::Err(key_err(
                    path,
                    "general.alignment",
                    format!("{a} is not a power of two up to {MAX_ALIGNMENT}"),
                )));
            }
            a
        }
        Some(v) => {
            return Err(Stop::Err(key_err(
                path,
                "general.alignment",
                format!("is {:?}, not U32", v.value_type()),
            )));
        }
    };

    // Each tensor info takes at least 8 (name length) + 4 (rank) + 4 (type) + 8 (offset) bytes.
    c.need(n_tensors * 24, &|| format!("{n_tensors} tensor infos"))?;
    struct Raw {
        name: String,
        dims: Vec<u64>,
        ty: GgmlType,
        rel: u64,
        len: u64,
    }
    let mut raws: Vec<Raw> = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string(MAX_NAME_LEN, &|| format!("name of tensor {i}"), &|m| {
            tensor_err(path, &format!("#{i}"), m)
        })?;
        let terr = |m: String| Stop::Err(tensor_err(path, &name, m));
        let rank = c.u32(&|| format!("rank of `{name}`"))?;
        if rank == 0 || rank > MAX_DIMS {
            return Err(terr(format!("rank {rank} is not 1 to {MAX_DIMS}")));
        }
        let mut dims = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            let d = c.u64(&|| format!("dims of `{name}`"))?;
            if d > i64::MAX as u64 {
                return Err(terr(format!("dimension {d} exceeds i64::MAX")));
            }
            dims.push(d);
        }
        let tid = c.u32(&|| format!("type of `{name}`"))?;
        let ty = GgmlType::from_id(tid).ok_or_else(|| {
            Stop::Err(FormatError::GgufUnknownType {
                path: path.to_path_buf(),
                tensor: name.clone(),
                type_id: tid,
            })
        })?;
        let rel = c.u64(&|| format!("offset of `{name}`"))?;
        // The product must fit with zero dims counted as 1 too, so that no partial product
        // (a row, a slab) can overflow in a tensor of no elements.
        dims.iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d.max(1)))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| terr(format!("element count of {dims:?} overflows")))?;
        let elements: u64 = dims.iter().product();
        if !dims[0].is_multiple_of(ty.block_size()) {
            return Err(terr(format!(
                "row length {} is not a multiple of the {ty} block size {}",
                dims[0],
                ty.block_size()
            )));
        }
        if ty.bytes_for(dims[0]).is_none() {
            return Err(terr(format!(
                "byte size of a row of {} {ty} overflows",
                dims[0]
            )));
        }
        let len = ty
            .bytes_for(elements)
            .ok_or_else(|| terr(format!("byte size of {elements} {ty} elements overflows")))?;
        if !rel.is_multiple_of(alignment) {
            return Err(terr(format!(
                "data offset {rel} is not a multiple of the alignment {alignment}"
            )));
        }
        if tensor_index.contains_key(&name) {
            return Err(terr("tensor name appears twice".into()));
        }
        tensor_index.insert(name.clone(), raws.len());
        raws.push(Raw {
            name,
            dims,
            ty,
            rel,
            len,
        });
    }

    let header_end = c.pos as u64;
    // A file without tensors (vocabulary only) may end before the padding; llama.cpp and
    // gguf-py read it, so its (empty) data section starts at the end of the file.
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .map(|s| if raws.is_empty() { s.min(file_len) } else { s })
        .filter(|&s| s <= file_len)
        .ok_or_else(|| {
            c.header_err(format!(
                "data section (header ends at {header_end}, aligned to {alignment}) starts past the end of the {file_len}-byte file"
            ))
        })?;
    let data_len = file_len - data_start;
    let mut tensors = Vec::with_capacity(raws.len());
    for r in raws {
        let end = r.rel.checked_add(r.len);
        if end.is_none_or(|e| e > data_len) {
            return Err(Stop::Err(FormatError::OutOfBounds {
                path: path.to_path_buf(),
                tensor: r.name,
                end: end.unwrap_or(u64::MAX),
                data_len,
            }));
        }
        tensors.push(GgufTensor {
            name: r.name,
            dims: r.dims,
            ty: r.ty,
            offset: data_start + r.rel,
            len: r.len,
        });
    }

    // With ranges sorted by start, an overlap can only be with the furthest-reaching earlier one.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| (tensors[i].offset, tensors[i].len));
    let mut reach: Option<(u64, usize)> = None;
    for &i in &order {
        let t = &tensors[i];
        if t.len == 0 {
            continue;
        }
        if let Some((end, j)) = reach
            && t.offset < end
        {
            return Err(Stop::Err(FormatError::Overlap {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                other: tensors[j].name.clone(),
            }));
        }
        let end = t.offset + t.len;
        if reach.is_none_or(|(e, _)| end > e) {
            reach = Some((end, i));
        }
    }

    Ok(Gguf {
        path: path.to_path_buf(),
        version,
        metadata,
        index,
        tensors,
        tensor_index,
        alignment,
        data_start,
        file_len,
    })
}

macro_rules! getter {
    ($(#[$doc:meta])* $name:ident, $variant:ident, $t:ty) => {
        $(#[$doc])*
        pub fn $name(&self, key: &str) -> Result<$t, FormatError> {
            match self.get(key)? {
                Value::$variant(v) => Ok(v.clone()),
                v => Err(self.mismatch(key, stringify!($variant), v)),
            }
        }
    };
}

impl Gguf {
    /// The value of `key`, if present.
    pub fn value(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The value of `key`; an error naming the key when absent.
    pub fn get(&self, key: &str) -> Result<&Value, FormatError> {
        self.value(key)
            .ok_or_else(|| key_err(&self.path, key, "missing".into()))
    }

    fn mismatch(&self, key: &str, want: &str, v: &Value) -> FormatError {
        key_err(
            &self.path,
            key,
            format!("is {:?}, not {want}", v.value_type()),
        )
    }

    getter!(
        /// A `u8` value.
        get_u8, U8, u8);
    getter!(
        /// An `i8` value.
        get_i8, I8, i8);
    getter!(
        /// A `u16` value.
        get_u16, U16, u16);
    getter!(
        /// An `i16` value.
        get_i16, I16, i16);
    getter!(
        /// A `u32` value.
        get_u32, U32, u32);
    getter!(
        /// An `i32` value.
        get_i32, I32, i32);
    getter!(
        /// A `u64` value.
        get_u64, U64, u64);
    getter!(
        /// An `i64` value.
        get_i64, I64, i64);
    getter!(
        /// An `f32` value.
        get_f32, F32, f32);
    getter!(
        /// An `f64` value.
        get_f64, F64, f64);
    getter!(
        /// A boolean value.
        get_bool, Bool, bool);

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, FormatError> {
        match self.get(key)? {
            Value::String(s) => Ok(s),
            v => Err(self.mismatch(key, "String", v)),
        }
    }

    /// An array value.
    pub fn get_array(&self, key: &str) -> Result<&Array, FormatError> {
        match self.get(key)? {
            Value::Array(a) => Ok(a),
            v => Err(self.mismatch(key, "Array", v)),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<&[String], FormatError> {
        match self.get_array(key)? {
            Array::String(v) => Ok(v),
            a => Err(key_err(
                &self.path,
                key,
                format!("is an array of {:?}, not of String", a.elem_type()),
            )),
        }
    }

    /// An integer of any width and signedness that is non-negative (writers disagree on the
    /// width of counts such as `split.count`).
    pub fn get_uint(&self, key: &str) -> Result<u64, FormatError> {
        let v = self.get(key)?;
        v.as_uint()
            .ok_or_else(|| self.mismatch(key, "a non-negative integer", v))
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
}

/// A GGUF file whose header has been read and validated.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufFile {
    /// The validated header.
    pub header: Gguf,
}

impl GgufFile {
    /// Opens `path` and reads and validates its header, reading only the header region: first
    /// 1 MiB, then twice as much each time the header turns out longer, up to
    /// [`MAX_HEADER_BYTES`].
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, FormatError> {
        let path = path.as_ref();
        let io = |source| FormatError::Io {
            path: path.to_path_buf(),
            source,
        };
        // Only a regular file: a FIFO or a device would hang or read for ever.
        let mut f = crate::file::open_regular(path)?;
        let file_len = f.metadata().map_err(io)?.len();
        let mut want: u64 = 1 << 20;
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let n = want.min(file_len);
            if n > buf.len() as u64 {
                let old = buf.len();
                buf.resize(n as usize, 0);
                f.seek(SeekFrom::Start(old as u64)).map_err(io)?;
                f.read_exact(&mut buf[old..]).map_err(io)?;
            }
            match parse_prefix(&buf, file_len, path) {
                Ok(header) => return Ok(GgufFile { header }),
                Err(Stop::Err(e)) => return Err(e),
                Err(Stop::More) if want >= MAX_HEADER_BYTES => {
                    return Err(FormatError::GgufHeader {
                        path: path.to_path_buf(),
                        msg: format!("header is longer than the {MAX_HEADER_BYTES} bytes accepted"),
                    });
                }
                Err(Stop::More) => want = want.saturating_mul(2).min(MAX_HEADER_BYTES),
            }
        }
    }
}

/// The parts of a split file name `NAME-0000N-of-0000M.gguf`: `(NAME, N, M)`, 1-based.
pub fn split_name(file_name: &str) -> Option<(&str, u32, u32)> {
    let stem = file_name.strip_suffix(".gguf")?;
    // "-00001-of-00003" is 15 bytes.
    let cut = stem.len().checked_sub(15)?;
    let (prefix, tail) = (stem.get(..cut)?, stem.get(cut..)?);
    let tail = tail.as_bytes();
    let digits = |s: &[u8]| -> Option<u32> {
        s.iter()
            .all(u8::is_ascii_digit)
            .then(|| std::str::from_utf8(s).ok()?.parse().ok())
            .flatten()
    };
    if tail[0] != b'-' || &tail[6..10] != b"-of-" {
        return None;
    }
    let n = digits(&tail[1..6])?;
    let m = digits(&tail[10..15])?;
    if prefix.is_empty() || n == 0 || m == 0 || n > m {
        return None;
    }
    Some((prefix, n, m))
}

/// A model in one GGUF file or split across several.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufSet {
    /// The parts in order (one for an unsplit file).
    pub parts: Vec<GgufFile>,
    /// Tensor name → (part, index in that part's tensors).
    index: BTreeMap<String, (usize, usize)>,
}

impl GgufSet {
    /// Opens a model from any of its files: a single `.gguf`, or any part of a split set
    /// `NAME-0000N-of-0000M.gguf`, in which case every part is opened and checked: all present,
    /// `split.no` (0-based) and `split.count` agreeing with the names, `split.tensors.count`
    /// the same in each and equal to the tensors found, no tensor in two parts.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufSet, FormatError> {
        let path = path.as_ref();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let split = |p: &Path, msg: String| FormatError::GgufSplit {
            path: p.to_path_buf(),
            msg,
        };
        let Some((prefix, _, count)) = split_name(name) else {
            let f = GgufFile::open(path)?;
            if let Some(v) = f.header.value("split.count").and_then(Value::as_uint)
                && v > 1
            {
                return Err(split(
                    path,
                    format!("split.count is {v} but the file name is not NAME-0000N-of-0000M.gguf"),
                ));
            }
            return GgufSet::from_parts(vec![f]);
        };
        let dir = path.parent().unwrap_or(Path::new(""));
        let mut parts = Vec::with_capacity(count as usize);
        for n in 1..=count {
            let p = dir.join(format!("{prefix}-{n:05}-of-{count:05}.gguf"));
            if !p.exists() {
                return Err(FormatError::MissingFile { path: p });
            }
            let f = GgufFile::open(&p)?;
            let h = &f.header;
            let no = h.get_uint("split.no")?;
            let cnt = h.get_uint("split.count")?;
            if no != (n - 1) as u64 || cnt != count as u64 {
                return Err(split(
                    &p,
                    format!(
                        "split.no {no} / split.count {cnt} disagree with the name (part {n} of {count})"
                    ),
                ));
            }
            parts.push(f);
        }
        let total = parts[0].header.get_uint("split.tensors.count")?;
        for f in &parts {
            let t = f.header.get_uint("split.tensors.count")?;
            if t != total {
                return Err(split(
                    &f.header.path,
                    format!("split.tensors.count {t}, but the first part says {total}"),
                ));
            }
        }
        let found: u64 = parts.iter().map(|f| f.header.tensors.len() as u64).sum();
        if found != total {
            return Err(split(
                &parts[0].header.path,
                format!("split.tensors.count is {total} but the parts hold {found} tensors"),
            ));
        }
        GgufSet::from_parts(parts)
    }

    fn from_parts(parts: Vec<GgufFile>) -> Result<GgufSet, FormatError> {
        let mut index = BTreeMap::new();
        for (p, f) in parts.iter().enumerate() {
            for (i, t) in f.header.tensors.iter().enumerate() {
                if let Some((q, _)) = index.insert(t.name.clone(), (p, i)) {
                    return Err(FormatError::DuplicateTensor {
                        tensor: t.name.clone(),
                        first: parts[q].header.path.clone(),
                        second: f.header.path.clone(),
                    });
                }
            }
        }
        Ok(GgufSet { parts, index })
    }

    /// The first part's header, which holds the model's metadata.
    pub fn header(&self) -> &Gguf {
        &self.parts[0].header
    }

    /// The tensor called `name` and the file that holds it.
    pub fn tensor(&self, name: &str) -> Option<(&Path, &GgufTensor)> {
        let &(p, i) = self.index.get(name)?;
        let h = &self.parts[p].header;
        Some((&h.path, &h.tensors[i]))
    }

    /// Every tensor name, sorted.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("x.gguf")
    }

    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        out.extend_from_slice(v.as_bytes());
    }

    /// Hand-built GGUF bytes.
    #[derive(Clone)]
    struct B {
        version: u32,
        n_kv: u64,
        kv: Vec<u8>,
        n_t: u64,
        ti: Vec<u8>,
        align: u64,
        data: Vec<u8>,
    }

    fn b() -> B {
        B {
            version: 3,
            n_kv: 0,
            kv: vec![],
            n_t: 0,
            ti: vec![],
            align: 32,
            data: vec![],
        }
    }

    impl B {
        fn kv(mut self, key: &str, ty: u32, payload: &[u8]) -> B {
            s(&mut self.kv, key);
            self.kv.extend_from_slice(&ty.to_le_bytes());
            self.kv.extend_from_slice(payload);
            self.n_kv += 1;
            self
        }
        fn u32kv(self, key: &str, v: u32) -> B {
            self.kv(key, 4, &v.to_le_bytes())
        }
        fn tensor(mut self, name: &str, dims: &[u64], ty: u32, off: u64) -> B {
            s(&mut self.ti, name);
            self.ti
                .extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                self.ti.extend_from_slice(&d.to_le_bytes());
            }
            self.ti.extend_from_slice(&ty.to_le_bytes());
            self.ti.extend_from_slice(&off.to_le_bytes());
            self.n_t += 1;
            self
        }
        fn data(mut self, n: usize) -> B {
            self.data = vec![0; n];
            self
        }
        fn bytes(&self) -> Vec<u8> {
            let mut o = b"GGUF".to_vec();
            o.extend_from_slice(&self.version.to_le_bytes());
            o.extend_from_slice(&self.n_t.to_le_bytes());
            o.extend_from_slice(&self.n_kv.to_le_bytes());
            o.extend_from_slice(&self.kv);
            o.extend_from_slice(&self.ti);
            while !(o.len() as u64).is_multiple_of(self.align) {
                o.push(0);
            }
            o.extend_from_slice(&self.data);
            o
        }
        fn parse(&self) -> Result<Gguf, FormatError> {
            let v = self.bytes();
            parse(&v, v.len() as u64, p())
        }
    }

    fn err(r: Result<Gguf, FormatError>) -> String {
        match r {
            Ok(g) => panic!("accepted: {g:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[track_caller]
    fn refused(bb: &B, needle: &str) {
        let e = err(bb.parse());
        assert!(e.contains(needle), "`{e}` lacks `{needle}`");
        assert!(e.starts_with("x.gguf: "), "`{e}` does not name the file");
    }

    #[test]
    fn hand_built_header_parses() {
        let g = b()
            .u32kv("general.alignment", 64)
            .tensor("w", &[64, 2], 8, 0) // Q8_0: 2 rows of 2 blocks = 136 bytes
            .tensor("v", &[3], 0, 192)
            .data(256)
            .clone();
        let mut g = g;
        g.align = 64;
        let h = g.parse().unwrap();
        assert_eq!(h.alignment, 64);
        assert_eq!(h.data_start % 64, 0);
        let w = h.tensor("w").unwrap();
        assert_eq!((w.ty, w.len, w.offset), (GgmlType::Q8_0, 136, h.data_start));
        assert_eq!(w.shape(), vec![2, 64]);
        assert_eq!(w.row_bytes(), 68);
        assert_eq!(h.tensor("v").unwrap().offset, h.data_start + 192);
    }

    #[test]
    fn refuses_bad_magic_versions_and_endianness() {
        let mut bad = b().bytes();
        bad[0] = b'X';
        assert!(err(parse(&bad, bad.len() as u64, p())).contains("not a GGUF file"));
        let mut v = b();
        v.version = 1;
        refused(&v, "version 1");
        v.version = 4;
        refused(&v, "unsupported GGUF version 4");
        v.version = 3u32.swap_bytes();
        refused(&v, "big-endian");
        v.version = 0;
        refused(&v, "unsupported GGUF version 0");
        // Version 2 has the same layout as 3 and is read.
        v.version = 2;
        assert_eq!(
            v.tensor("t", &[8], 0, 0).data(32).parse().unwrap().version,
            2
        );
    }

    #[test]
    fn refuses_counts_past_caps_and_past_the_bytes() {
        let mut x = b();
        x.n_t = MAX_TENSORS + 1;
        refused(&x, "tensors exceed");
        let mut x = b();
        x.n_kv = MAX_KV + 1;
        refused(&x, "metadata entries exceed");
        // Within the caps but more than the file can hold: refused before allocating.
        let mut x = b();
        x.n_kv = MAX_KV;
        refused(&x, "metadata entries needs");
        let mut x = b();
        x.n_t = MAX_TENSORS;
        refused(&x, "tensor infos needs");
        // An array longer than the cap, and one longer than the bytes left.
        let mut pl = 0u32.to_le_bytes().to_vec();
        pl.extend_from_slice(&(MAX_ARRAY_LEN + 1).to_le_bytes());
        refused(&b().kv("a", 9, &pl), "exceeds the");
        let mut pl = 6u32.to_le_bytes().to_vec();
        pl.extend_from_slice(&1_000_000u64.to_le_bytes());
        refused(&b().kv("a", 9, &pl), "array `a` of 1000000 elements needs");
        // A string longer than the cap, and one longer than the file.
        let mut pl = (MAX_STRING_LEN + 1).to_le_bytes().to_vec();
        pl.push(b'x');
        refused(&b().kv("s", 8, &pl), "GGUF key `s`: string of");
        let mut pl = 100u64.to_le_bytes().to_vec();
        pl.push(b'x');
        refused(&b().kv("s", 8, &pl), "value of `s` needs 100 bytes");
        // Name length past the cap.
        refused(
            &b().tensor(&"n".repeat(MAX_NAME_LEN as usize + 1), &[1], 0, 0),
            "exceeds the 1024",
        );
    }

    #[test]
    fn a_file_without_tensors_need_not_be_padded() {
        let v = b().u32kv("k", 1).bytes();
        let unpadded = &v[..24 + 8 + 1 + 4 + 4];
        let g = parse(unpadded, unpadded.len() as u64, p()).unwrap();
        assert_eq!(g.data_start, unpadded.len() as u64);
        assert!(g.tensors.is_empty());
        // With a tensor the data section must be there.
        let v = b().tensor("t", &[1], 0, 0).bytes();
        let e = err(parse(&v[..v.len() - 4], v.len() as u64 - 4, p()));
        assert!(e.contains("starts past the end"), "{e}");
    }

    #[test]
    fn refuses_malformed_metadata() {
        refused(
            &b().kv("k", 13, &[0]),
            "GGUF key `k`: unknown value type 13",
        );
        refused(&b().kv("k", 7, &[2]), "GGUF key `k`: boolean byte 2");
        refused(
            &b().kv("k", 8, &[1, 0, 0, 0, 0, 0, 0, 0, 0xff]),
            "not UTF-8",
        );
        refused(
            &b().u32kv("k", 1).u32kv("k", 2),
            "GGUF key `k`: key appears twice",
        );
        let mut pl = 99u32.to_le_bytes().to_vec();
        pl.extend_from_slice(&1u64.to_le_bytes());
        refused(&b().kv("a", 9, &pl), "unknown array element type 99");
        // Nesting: [[[[[u8]]]]] is 5 deep.
        let mut pl = Vec::new();
        for _ in 0..MAX_ARRAY_DEPTH {
            pl.extend_from_slice(&9u32.to_le_bytes());
            pl.extend_from_slice(&1u64.to_le_bytes());
        }
        pl.extend_from_slice(&0u32.to_le_bytes());
        pl.extend_from_slice(&1u64.to_le_bytes());
        pl.push(7);
        refused(&b().kv("deep", 9, &pl), "nested deeper");
        // One level less is accepted.
        assert!(b().kv("deep", 9, &pl[12..]).parse().is_ok());
        // Alignment: type and value.
        refused(&b().u32kv("general.alignment", 48), "not a power of two");
        refused(&b().u32kv("general.alignment", 0), "not a power of two");
        refused(
            &b().kv("general.alignment", 10, &64u64.to_le_bytes()),
            "is U64, not U32",
        );
    }

    #[test]
    fn refuses_malformed_tensors() {
        let t = |dims: &[u64], ty: u32, off: u64| b().tensor("t", dims, ty, off).data(4096);
        refused(&t(&[], 0, 0), "GGUF tensor `t`: rank 0");
        refused(&t(&[1, 1, 1, 1, 1], 0, 0), "rank 5");
        refused(&t(&[1], 4, 0), "GGUF tensor `t`: unknown ggml type 4");
        refused(&t(&[1], 1000, 0), "unknown ggml type 1000");
        refused(
            &t(&[48], 8, 0),
            "row length 48 is not a multiple of the Q8_0 block size 32",
        );
        refused(&t(&[1 << 40, 1 << 40], 0, 0), "overflows");
        refused(&t(&[u64::MAX], 0, 0), "exceeds i64::MAX");
        // Found by the fuzz target: no elements, but a row whose byte size overflows.
        refused(&t(&[1 << 62, 0], 24 + 3, 0), "overflows");
        refused(&t(&[1 << 62, 0, 4], 0, 0), "overflows");
        refused(
            &t(&[1], 0, 8),
            "offset 8 is not a multiple of the alignment 32",
        );
        refused(
            &t(&[2048], 0, 0),
            "tensor `t`: data ends at 8192, past the 4096 bytes",
        );
        refused(&t(&[1], 0, u64::MAX - 31), "past the 4096 bytes");
        refused(
            &b().tensor("a", &[64], 0, 0)
                .tensor("b", &[8], 0, 224)
                .data(4096),
            "tensor `b` overlaps tensor `a`",
        );
        refused(
            &b().tensor("a", &[8], 0, 0)
                .tensor("a", &[8], 0, 32)
                .data(64),
            "GGUF tensor `a`: tensor name appears twice",
        );
        // Zero-sized tensors overlap nothing.
        assert!(
            b().tensor("a", &[0], 0, 0)
                .tensor("b", &[8], 0, 0)
                .data(32)
                .parse()
                .is_ok()
        );
    }

    #[test]
    fn every_truncation_is_an_error_and_never_a_panic() {
        let v = std::fs::read(files().join("tiny.gguf")).unwrap();
        let full = parse(&v, v.len() as u64, p()).unwrap();
        let data_end = full.tensors.iter().map(|t| t.offset + t.len).max().unwrap();
        assert!(data_end > full.data_start);
        for n in 0..v.len() {
            // A file cut short of its last tensor's data: refused (past it only padding is lost).
            let cut = parse(&v[..n], n as u64, p());
            assert_eq!(cut.is_ok(), n as u64 >= data_end, "cut at {n}");
            // The whole file, only a prefix given: refused too, never a wrong header.
            if let Ok(g) = parse(&v[..n], v.len() as u64, p()) {
                assert_eq!(g, full, "prefix {n}");
            }
        }
    }

    #[test]
    fn accessors_name_the_key_on_mismatch() {
        let g = b()
            .u32kv("a.u32", 7)
            .kv("a.str", 8, &{
                let mut v = vec![];
                s(&mut v, "hi");
                v
            })
            .kv("a.i32", 5, &(-1i32).to_le_bytes())
            .parse()
            .unwrap();
        assert_eq!(g.get_u32("a.u32").unwrap(), 7);
        assert_eq!(g.get_uint("a.u32").unwrap(), 7);
        assert_eq!(g.get_str("a.str").unwrap(), "hi");
        let e = g.get_str("a.u32").unwrap_err().to_string();
        assert_eq!(e, "x.gguf: GGUF key `a.u32`: is U32, not String");
        let e = g.get_u32("nope").unwrap_err().to_string();
        assert_eq!(e, "x.gguf: GGUF key `nope`: missing");
        assert!(
            g.get_uint("a.i32")
                .unwrap_err()
                .to_string()
                .contains("`a.i32`")
        );
        assert!(g.get_array("a.str").is_err());
    }

    fn files() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gguf/files")
    }

    #[test]
    fn reads_what_gguf_writer_wrote_as_gguf_reader_does() {
        let expect: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(files().join("expect.json")).unwrap())
                .unwrap();
        let expect = expect.as_object().unwrap();
        assert_eq!(expect.len(), 4);
        for (name, want) in expect {
            let g = GgufFile::open(files().join(name)).unwrap().header;
            assert_eq!(g.version, 3, "{name}");
            assert_eq!(g.alignment, want["alignment"].as_u64().unwrap(), "{name}");
            assert_eq!(g.data_start, want["data_start"].as_u64().unwrap(), "{name}");
            let keys: Vec<(String, u64)> = g
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.value_type() as u64))
                .collect();
            let want_keys: Vec<(String, u64)> = want["keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|kv| (kv[0].as_str().unwrap().to_owned(), kv[1].as_u64().unwrap()))
                .collect();
            assert_eq!(keys, want_keys, "{name}");
            let wt = want["tensors"].as_array().unwrap();
            assert_eq!(g.tensors.len(), wt.len(), "{name}");
            for (t, w) in g.tensors.iter().zip(wt) {
                assert_eq!(t.name, w["name"].as_str().unwrap(), "{name}");
                let dims: Vec<u64> = w["dims"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect();
                assert_eq!(t.dims, dims, "{name} {}", t.name);
                assert_eq!(t.ty.id() as u64, w["type"].as_u64().unwrap());
                assert_eq!(t.offset, w["offset"].as_u64().unwrap(), "{name} {}", t.name);
                assert_eq!(t.len, w["len"].as_u64().unwrap(), "{name} {}", t.name);
            }
        }
    }

    #[test]
    fn metadata_values_of_every_type() {
        let g = GgufFile::open(files().join("tiny.gguf")).unwrap().header;
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.get_u8("t.u8").unwrap(), 200);
        assert_eq!(g.get_i8("t.i8").unwrap(), -100);
        assert_eq!(g.get_u16("t.u16").unwrap(), 60000);
        assert_eq!(g.get_i16("t.i16").unwrap(), -30000);
        assert_eq!(g.get_u32("t.u32").unwrap(), 4_000_000_000);
        assert_eq!(g.get_i32("t.i32").unwrap(), -2_000_000_000);
        assert_eq!(g.get_f32("t.f32").unwrap(), 0.1f32);
        assert_eq!(g.get_u64("t.u64").unwrap(), (1u64 << 63) + 5);
        assert_eq!(g.get_i64("t.i64").unwrap(), -(1i64 << 62));
        assert_eq!(g.get_f64("t.f64").unwrap(), -0.1f64);
        assert!(g.get_bool("t.bool").unwrap());
        assert_eq!(g.get_str("t.str").unwrap(), "héllo ✓");
        assert_eq!(
            g.get_array("t.arr_i32").unwrap(),
            &Array::I32(vec![1, -2, 3])
        );
        assert_eq!(g.get_str_array("t.arr_str").unwrap(), ["a", "", "ünï"]);
        assert_eq!(
            g.get_array("t.arr_f32").unwrap(),
            &Array::F32(vec![0.5, -1.25])
        );
        assert_eq!(
            g.get_array("t.arr_bool").unwrap(),
            &Array::Bool(vec![true, false])
        );
        assert_eq!(
            g.get_array("t.nested").unwrap(),
            &Array::Array(vec![Array::I32(vec![1, 2]), Array::I32(vec![3])])
        );
        assert_eq!(g.get_uint("llama.block_count").unwrap(), 2);
        let e = g.tensor("experts").unwrap();
        assert_eq!(
            (e.ty, e.dims.as_slice()),
            (GgmlType::IQ4_NL, &[32u64, 3, 2][..])
        );
    }

    #[test]
    fn big_endian_file_is_refused() {
        let e = GgufFile::open(files().join("big-endian.gguf"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("big-endian.gguf: GGUF: big-endian"), "{e}");
    }

    #[test]
    fn open_grows_its_read_past_one_mebibyte() {
        let dir = tempfile::tempdir().unwrap();
        let big = "x".repeat(3 << 20);
        let mut pl = Vec::new();
        s(&mut pl, &big);
        let v = b()
            .kv("big", 8, &pl)
            .tensor("t", &[4], 0, 0)
            .data(16)
            .bytes();
        let path = dir.path().join("big.gguf");
        std::fs::write(&path, &v).unwrap();
        let g = GgufFile::open(&path).unwrap().header;
        assert_eq!(g.get_str("big").unwrap().len(), 3 << 20);
        assert_eq!(g.tensor("t").unwrap().len, 16);
        // A header cut short inside a long file is still refused, naming the file.
        std::fs::write(&path, &v[..2 << 20]).unwrap();
        let e = GgufFile::open(&path).unwrap_err().to_string();
        assert!(
            e.contains("big.gguf: GGUF") && e.contains("truncated"),
            "{e}"
        );
    }

    #[test]
    fn split_names() {
        assert_eq!(split_name("m-00001-of-00003.gguf"), Some(("m", 1, 3)));
        assert_eq!(split_name("a-b-00003-of-00003.gguf"), Some(("a-b", 3, 3)));
        assert_eq!(split_name("m-00004-of-00003.gguf"), None);
        assert_eq!(split_name("m-00000-of-00003.gguf"), None);
        assert_eq!(split_name("-00001-of-00003.gguf"), None);
        assert_eq!(split_name("m-0001-of-00003.gguf"), None);
        assert_eq!(split_name("m.gguf"), None);
        assert_eq!(split_name("m-00001-of-00003.bin"), None);
    }

    #[test]
    fn opens_a_split_set_and_refuses_inconsistent_ones() {
        let set = GgufSet::open(files().join("split-00002-of-00002.gguf")).unwrap();
        assert_eq!(set.parts.len(), 2);
        assert_eq!(set.tensor_names().collect::<Vec<_>>(), ["t0", "t1", "t2"]);
        let (path, t) = set.tensor("t2").unwrap();
        assert!(path.ends_with("split-00002-of-00002.gguf"));
        assert_eq!(t.len, 16);
        assert_eq!(
            set.header().get_str("general.architecture").unwrap(),
            "llama"
        );
        let one = GgufSet::open(files().join("tiny.gguf")).unwrap();
        assert_eq!(one.parts.len(), 1);

        let dir = tempfile::tempdir().unwrap();
        let part = |no: u16, count: u16, total: i32, tensors: &[&str]| {
            let mut x = b()
                .kv("split.no", 2, &no.to_le_bytes())
                .kv("split.count", 2, &count.to_le_bytes())
                .kv("split.tensors.count", 5, &total.to_le_bytes());
            for (i, t) in tensors.iter().enumerate() {
                x = x.tensor(t, &[8], 0, 32 * i as u64);
            }
            x.data(32 * tensors.len()).bytes()
        };
        let w = |n: &str, v: Vec<u8>| std::fs::write(dir.path().join(n), v).unwrap();
        w("m-00001-of-00002.gguf", part(0, 2, 2, &["a"]));
        // Missing part.
        let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
        assert!(matches!(e, FormatError::MissingFile { .. }), "{e}");
        // Wrong split.no.
        w("m-00002-of-00002.gguf", part(0, 2, 2, &["b"]));
        let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
        assert!(
            e.to_string()
                .contains("m-00002-of-00002.gguf: GGUF split: split.no 0"),
            "{e}"
        );
        // Tensor count disagreeing.
        w("m-00002-of-00002.gguf", part(1, 2, 3, &["b"]));
        let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
        assert!(e.to_string().contains("split.tensors.count 3"), "{e}");
        w("m-00002-of-00002.gguf", part(1, 2, 3, &["b", "c"]));
        w("m-00001-of-00002.gguf", part(0, 2, 3, &["a"]));
        assert!(GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).is_ok());
        w("m-00001-of-00002.gguf", part(0, 2, 4, &["a"]));
        w("m-00002-of-00002.gguf", part(1, 2, 4, &["b", "c"]));
        let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
        assert!(e.to_string().contains("the parts hold 3 tensors"), "{e}");
        // The same tensor in two parts.
        w("m-00001-of-00002.gguf", part(0, 2, 3, &["a"]));
        w("m-00002-of-00002.gguf", part(1, 2, 3, &["b", "a"]));
        let e = GgufSet::open(dir.path().join("m-00001-of-00002.gguf")).unwrap_err();
        assert!(e.to_string().contains("tensor `a` appears in both"), "{e}");
        // A file claiming to be split under a plain name.
        w("plain.gguf", part(0, 2, 3, &["a"]));
        let e = GgufSet::open(dir.path().join("plain.gguf")).unwrap_err();
        assert!(e.to_string().contains("split.count is 2"), "{e}");
    }

    #[test]
    fn type_table_is_consistent() {
        let mut ids = std::collections::HashSet::new();
        for t in GgmlType::all() {
            assert!(ids.insert(t.id()), "{t} twice");
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(TYPES.iter().filter(|r| r.0 == t).count(), 1, "{t}");
        }
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(500), None);
    }
}
