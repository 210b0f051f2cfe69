//! The GGUF header parser: every check of the module documentation, in order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::FormatError;

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
pub(super) enum Stop {
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

pub(super) fn parse_prefix(bytes: &[u8], file_len: u64, path: &Path) -> Result<Gguf, Stop> {
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
