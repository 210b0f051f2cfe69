//! GGUF headers read from files, and split sets (`NAME-0000N-of-0000M.gguf`).

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::header::{Stop, parse_prefix};
use super::*;
use crate::FormatError;

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
            // Missing only when there is no such name: a symlink that cannot be followed (a
            // loop, a dangling link) is opened and refused for what it is.
            if !crate::file::present(&p) {
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
