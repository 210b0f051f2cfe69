//! Validated safetensors headers.
//!
//! A safetensors file is an 8-byte little-endian header length `N`, `N` bytes of JSON, and the
//! data. The JSON maps tensor names to `{dtype, shape, data_offsets: [begin, end]}` (offsets
//! relative to the start of the data) plus an optional `__metadata__` map of strings.
//!
//! Validation order (every step uses checked arithmetic and stops at the first failure):
//! 1. the file holds at least the 8-byte length; the length is at most [`MAX_HEADER_LEN`] and
//!    the header ends inside the file;
//! 2. the header is UTF-8 JSON whose top level is an object with at most [`MAX_TENSORS`] entries;
//! 3. per tensor: the dtype is known, the shape has at most [`MAX_RANK`] dimensions, the element
//!    count × dtype size does not overflow and equals `end − begin`, and `begin ≤ end ≤` data
//!    length;
//! 4. across tensors: no two byte ranges overlap.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Dtype, FormatError};

/// The largest header accepted, in bytes (the reference implementation's cap as well).
pub const MAX_HEADER_LEN: u64 = 100 * 1024 * 1024;
/// The largest number of tensors accepted in one file.
pub const MAX_TENSORS: usize = 1 << 20;
/// The largest tensor rank accepted.
pub const MAX_RANK: usize = 8;

/// One tensor entry of a safetensors header, with absolute file offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderEntry {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major, outermost first).
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first element in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A parsed and validated safetensors header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Tensors, sorted by file offset.
    pub tensors: Vec<HeaderEntry>,
    /// The `__metadata__` map (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// Absolute offset where the data section begins (`8 + N`).
    pub data_start: u64,
}

/// Reads the 8-byte length prefix. `file_len` is the size of the whole file.
///
/// Returns the header length after checking it against [`MAX_HEADER_LEN`] and the file size.
pub fn header_len(prefix: &[u8], file_len: u64, path: &Path) -> Result<u64, FormatError> {
    if file_len < 8 || prefix.len() < 8 {
        return Err(FormatError::TooShort {
            path: path.to_path_buf(),
            len: file_len,
        });
    }
    let mut le = [0u8; 8];
    le.copy_from_slice(&prefix[..8]);
    let n = u64::from_le_bytes(le);
    if n > MAX_HEADER_LEN {
        return Err(FormatError::HeaderTooLarge {
            path: path.to_path_buf(),
            header_len: n,
        });
    }
    if n.checked_add(8).is_none_or(|end| end > file_len) {
        return Err(FormatError::HeaderPastEnd {
            path: path.to_path_buf(),
            header_len: n,
            file_len,
        });
    }
    Ok(n)
}

/// Parses and validates a whole header.
///
/// `bytes` must start at offset 0 of the file and contain at least the length prefix and the
/// header JSON; `file_len` is the size of the whole file. Nothing here panics on any input.
pub fn parse_header(bytes: &[u8], file_len: u64, path: &Path) -> Result<Header, FormatError> {
    let n = header_len(bytes, file_len, path)?;
    let end = 8usize.saturating_add(usize::try_from(n).unwrap_or(usize::MAX));
    let json = bytes
        .get(8..end)
        .ok_or_else(|| FormatError::HeaderPastEnd {
            path: path.to_path_buf(),
            header_len: n,
            file_len: bytes.len() as u64,
        })?;
    let data_start = 8 + n;
    let data_len = file_len - data_start;
    let bad = |msg: String| FormatError::HeaderJson {
        path: path.to_path_buf(),
        msg,
    };

    let text = std::str::from_utf8(json).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    let value: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let Value::Object(map) = value else {
        return Err(bad("top level is not an object".into()));
    };
    if map.len() > MAX_TENSORS + 1 {
        return Err(bad(format!(
            "{} entries, more than the {MAX_TENSORS} accepted",
            map.len()
        )));
    }

    let mut header = Header {
        data_start,
        ..Header::default()
    };
    for (name, entry) in map {
        if name == "__metadata__" {
            header.metadata = parse_metadata(&entry)
                .ok_or_else(|| bad("`__metadata__` is not an object of strings".into()))?;
            continue;
        }
        header
            .tensors
            .push(parse_entry(path, name, &entry, data_start, data_len)?);
    }

    header
        .tensors
        .sort_by(|a, b| (a.offset, a.len, &a.name).cmp(&(b.offset, b.len, &b.name)));
    // With ranges sorted by start, an overlap can only be with the furthest-reaching earlier range.
    let mut reach: Option<(u64, usize)> = None;
    for (i, t) in header.tensors.iter().enumerate() {
        if t.len == 0 {
            continue;
        }
        if let Some((end, j)) = reach
            && t.offset < end
        {
            return Err(FormatError::Overlap {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                other: header.tensors[j].name.clone(),
            });
        }
        let end = t.offset + t.len;
        if reach.is_none_or(|(e, _)| end > e) {
            reach = Some((end, i));
        }
    }
    Ok(header)
}

fn parse_metadata(v: &Value) -> Option<BTreeMap<String, String>> {
    let obj = v.as_object()?;
    let mut out = BTreeMap::new();
    for (k, v) in obj {
        out.insert(k.clone(), v.as_str()?.to_owned());
    }
    Some(out)
}

fn parse_entry(
    path: &Path,
    name: String,
    entry: &Value,
    data_start: u64,
    data_len: u64,
) -> Result<HeaderEntry, FormatError> {
    let p = || path.to_path_buf();
    let malformed = |name: &str, what: &str| FormatError::MalformedTensor {
        path: p(),
        tensor: name.to_owned(),
        what: what.to_owned(),
    };
    let obj = entry
        .as_object()
        .ok_or_else(|| malformed(&name, "entry is not an object"))?;
    let dtype_name = obj
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(&name, "`dtype` missing or not a string"))?;
    let dtype = Dtype::from_safetensors(dtype_name).ok_or_else(|| FormatError::UnknownDtype {
        path: p(),
        tensor: name.clone(),
        dtype: dtype_name.to_owned(),
    })?;
    let shape_v = obj
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed(&name, "`shape` missing or not an array"))?;
    if shape_v.len() > MAX_RANK {
        return Err(malformed(
            &name,
            &format!("rank {} exceeds {MAX_RANK}", shape_v.len()),
        ));
    }
    let mut shape = Vec::with_capacity(shape_v.len());
    for d in shape_v {
        let d = d
            .as_u64()
            .and_then(|d| usize::try_from(d).ok())
            .ok_or_else(|| malformed(&name, "`shape` holds a value that is not a dimension"))?;
        shape.push(d);
    }
    let offs = obj
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .ok_or_else(|| malformed(&name, "`data_offsets` missing or not [begin, end]"))?;
    let (Some(begin), Some(end)) = (offs[0].as_u64(), offs[1].as_u64()) else {
        return Err(malformed(
            &name,
            "`data_offsets` are not non-negative integers",
        ));
    };
    if begin > end {
        return Err(malformed(&name, "`data_offsets` begin is after end"));
    }
    let expected = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .and_then(|n| n.checked_mul(dtype.size() as u64))
        .ok_or_else(|| FormatError::Overflow {
            path: p(),
            tensor: name.clone(),
        })?;
    let len = end - begin;
    if expected != len {
        return Err(FormatError::ShapeMismatch {
            path: p(),
            tensor: name,
            dtype,
            shape,
            expected_bytes: expected,
            actual_bytes: len,
        });
    }
    if end > data_len {
        return Err(FormatError::OutOfBounds {
            path: p(),
            tensor: name,
            end,
            data_len,
        });
    }
    Ok(HeaderEntry {
        name,
        dtype,
        shape,
        offset: data_start + begin,
        len,
    })
}

/// Serialises tensors into safetensors bytes (used by tests, fuzz seeds and tools).
///
/// Each entry is `(name, dtype, shape, bytes)`; data is laid out in the given order, the header
/// padded with spaces to a multiple of 8 as the reference writer does.
pub fn serialize(
    tensors: &[(&str, Dtype, &[usize], &[u8])],
    metadata: Option<&BTreeMap<String, String>>,
) -> Vec<u8> {
    let entries: Vec<(&str, Dtype, &[usize], usize)> = tensors
        .iter()
        .map(|&(name, dtype, shape, data)| (name, dtype, shape, data.len()))
        .collect();
    let mut out = header_bytes(&entries, metadata);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}

/// The bytes of a safetensors file before its data: the header's length and the header, for
/// tensors `(name, dtype, shape, byte length)` laid out in the given order, padded with spaces
/// to a multiple of 8 as the reference writer does. For writers that place the data themselves.
pub fn header_bytes(
    tensors: &[(&str, Dtype, &[usize], usize)],
    metadata: Option<&BTreeMap<String, String>>,
) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    if let Some(m) = metadata {
        map.insert(
            "__metadata__".into(),
            serde_json::to_value(m).unwrap_or_default(),
        );
    }
    let mut off = 0usize;
    for (name, dtype, shape, len) in tensors {
        map.insert(
            (*name).to_owned(),
            serde_json::json!({
                "dtype": dtype.safetensors_name(),
                "shape": shape,
                "data_offsets": [off, off + len],
            }),
        );
        off += len;
    }
    let mut header = Value::Object(map).to_string().into_bytes();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + header.len());
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    out
}

/// Reads and validates the header of the safetensors file at `path`.
pub fn read_header(path: &Path) -> Result<(Header, u64), FormatError> {
    use std::io::Read;
    let io = |source| FormatError::Io {
        path: PathBuf::from(path),
        source,
    };
    let mut f = crate::file::open_regular(path)?;
    let file_len = f.metadata().map_err(io)?.len();
    let mut prefix = [0u8; 8];
    if file_len < 8 {
        return Err(FormatError::TooShort {
            path: path.to_path_buf(),
            len: file_len,
        });
    }
    f.read_exact(&mut prefix).map_err(io)?;
    let n = header_len(&prefix, file_len, path)?;
    let mut bytes = vec![0u8; 8 + n as usize];
    bytes[..8].copy_from_slice(&prefix);
    f.read_exact(&mut bytes[8..]).map_err(io)?;
    Ok((parse_header(&bytes, file_len, path)?, file_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("x.safetensors")
    }

    fn raw(json: &str, data_len: usize) -> Vec<u8> {
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(json.as_bytes());
        out.resize(out.len() + data_len, 0);
        out
    }

    fn parse(bytes: &[u8]) -> Result<Header, FormatError> {
        parse_header(bytes, bytes.len() as u64, p())
    }

    #[test]
    fn round_trip() {
        let a = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let b = [9u8; 6];
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        let bytes = serialize(
            &[("a", Dtype::F32, &[2], &a), ("b", Dtype::BF16, &[3, 1], &b)],
            Some(&meta),
        );
        let h = parse(&bytes).unwrap();
        assert_eq!(h.metadata, meta);
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.tensors[0].name, "a");
        assert_eq!(h.tensors[1].shape, vec![3, 1]);
        let t = &h.tensors[1];
        assert_eq!(&bytes[t.offset as usize..(t.offset + t.len) as usize], &b);
    }

    #[test]
    fn too_short() {
        assert!(matches!(
            parse(&[1, 2, 3]),
            Err(FormatError::TooShort { len: 3, .. })
        ));
    }

    #[test]
    fn header_past_end() {
        let mut b = 100u64.to_le_bytes().to_vec();
        b.extend_from_slice(b"{}");
        assert!(matches!(
            parse(&b),
            Err(FormatError::HeaderPastEnd {
                header_len: 100,
                ..
            })
        ));
        let b = u64::MAX.to_le_bytes();
        assert!(matches!(parse(&b), Err(FormatError::HeaderTooLarge { .. })));
        let b = (MAX_HEADER_LEN - 1).to_le_bytes();
        assert!(matches!(parse(&b), Err(FormatError::HeaderPastEnd { .. })));
    }

    #[test]
    fn bad_json() {
        for j in [
            "{",
            "[]",
            "\"x\"",
            "{\"a\": 1}",
            "{\"__metadata__\": {\"k\": 1}}",
        ] {
            let e = parse(&raw(j, 0)).unwrap_err();
            assert!(
                matches!(
                    e,
                    FormatError::HeaderJson { .. } | FormatError::MalformedTensor { .. }
                ),
                "{j}: {e}"
            );
        }
        let mut b = raw("{\"a\":1}", 0);
        b[9] = 0xff;
        assert!(matches!(parse(&b), Err(FormatError::HeaderJson { .. })));
    }

    #[test]
    fn unknown_dtype_names_tensor() {
        let e = parse(&raw(
            r#"{"w":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]}}"#,
            1,
        ))
        .unwrap_err();
        match e {
            FormatError::UnknownDtype { tensor, dtype, .. } => {
                assert_eq!(tensor, "w");
                assert_eq!(dtype, "Q4_K");
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn shape_mismatch() {
        let e = parse(&raw(
            r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
        ))
        .unwrap_err();
        assert!(matches!(
            e,
            FormatError::ShapeMismatch { expected_bytes: 12, actual_bytes: 8, ref tensor, .. } if tensor == "w"
        ));
        assert!(e.to_string().contains("x.safetensors"));
    }

    #[test]
    fn overflow() {
        let j = r#"{"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#;
        assert!(matches!(
            parse(&raw(j, 8)),
            Err(FormatError::Overflow { .. })
        ));
    }

    #[test]
    fn out_of_bounds() {
        let j = r#"{"w":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}}"#;
        assert!(matches!(
            parse(&raw(j, 8)),
            Err(FormatError::OutOfBounds {
                end: 9,
                data_len: 8,
                ..
            })
        ));
    }

    #[test]
    fn overlap() {
        let j = r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},
                    "b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},
                    "c":{"dtype":"U8","shape":[0],"data_offsets":[3,3]}}"#;
        match parse(&raw(j, 8)).unwrap_err() {
            FormatError::Overlap { tensor, other, .. } => {
                assert_eq!((tensor.as_str(), other.as_str()), ("b", "a"));
            }
            e => panic!("{e}"),
        }
        // Touching ranges and empty tensors do not overlap.
        let j = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                    "b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},
                    "c":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}}"#;
        assert_eq!(parse(&raw(j, 8)).unwrap().tensors.len(), 3);
    }

    #[test]
    fn malformed_entries() {
        for j in [
            r#"{"w":{"shape":[1],"data_offsets":[0,1]}}"#,
            r#"{"w":{"dtype":"U8","data_offsets":[0,1]}}"#,
            r#"{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#,
            r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}}"#,
            r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}}"#,
            r#"{"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}"#,
        ] {
            let e = parse(&raw(j, 1)).unwrap_err();
            assert!(
                matches!(&e, FormatError::MalformedTensor { tensor, .. } if tensor == "w"),
                "{j}: {e}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn never_panics_with_valid_prefix(json in ".{0,200}", extra in 0usize..64) {
            let _ = parse(&raw(&json, extra));
        }
    }
}
