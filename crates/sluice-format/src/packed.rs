//! The packed trunk: every tensor that is not a routed expert, copied layer by layer into one
//! file (each layer's run aligned to 4096 bytes at both ends) with a versioned manifest of
//! per-tensor offsets, dtypes, shapes and a checksum per run. Routed experts stay in the
//! original shards, which the manifest names.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Dtype, FormatError};

/// The manifest's file name in a pack directory.
pub const MANIFEST: &str = "sluice-trunk.json";
/// The trunk file's name in a pack directory.
pub const TRUNK_FILE: &str = "trunk.bin";
/// The `format` field of a manifest.
pub const FORMAT: &str = "sluice-packed-trunk";
/// The manifest version this crate writes and reads.
pub const VERSION: u32 = 1;
/// Alignment of every run in the trunk file.
pub const ALIGN: u64 = 4096;
/// The largest manifest accepted.
pub const MAX_MANIFEST_LEN: u64 = 256 << 20;

/// One source shard as it was when packed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceShard {
    /// File name in the source directory.
    pub name: String,
    /// Its length in bytes.
    pub len: u64,
}

/// One tensor in the trunk file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedTensor {
    /// Tensor name.
    pub name: String,
    /// Safetensors dtype name.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Absolute offset in the trunk file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One run of the trunk file: a layer, the embedding table or the head.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedPart {
    /// `embed`, `layer.N` or `head`.
    pub name: String,
    /// Offset of the run (a multiple of 4096).
    pub offset: u64,
    /// Payload bytes of the run (its tensors, back to back).
    pub len: u64,
    /// xxh3-64 of the payload, 16 lower-case hex digits.
    pub xxh3: String,
    /// Its tensors, in file order.
    pub tensors: Vec<PackedTensor>,
}

/// A pack directory's manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    /// The source checkpoint directory (absolute).
    pub source: String,
    /// The source's shards as packed.
    pub source_shards: Vec<SourceShard>,
    /// The trunk file's name.
    pub file: String,
    /// The trunk file's length.
    pub file_len: u64,
    /// The runs, in file order.
    pub parts: Vec<PackedPart>,
}

impl Manifest {
    /// Parses and validates a manifest: known format and version, every run aligned and inside
    /// the file, runs in order without overlap, every tensor inside its run with a known dtype
    /// and shape × dtype size equal to its length, tensors back to back.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Manifest, FormatError> {
        let bad = |msg: String| FormatError::Manifest {
            path: path.to_path_buf(),
            msg,
        };
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
        if m.format != FORMAT {
            return Err(bad(format!("format `{}` is not `{FORMAT}`", m.format)));
        }
        if m.version != VERSION {
            return Err(bad(format!(
                "version {} is not supported (this sluice reads version {VERSION})",
                m.version
            )));
        }
        if m.file.is_empty()
            || m.file.contains('/')
            || m.file.contains('\\')
            || m.file == ".."
            || m.file == "."
        {
            return Err(bad(format!(
                "trunk file `{}` is not a plain file name",
                m.file
            )));
        }
        for s in &m.source_shards {
            if s.name.is_empty()
                || s.name.contains('/')
                || s.name.contains('\\')
                || s.name == ".."
                || s.name == "."
            {
                return Err(bad(format!(
                    "source shard `{}` is not a plain file name",
                    s.name
                )));
            }
        }
        let mut end = 0u64;
        for p in &m.parts {
            if p.offset % ALIGN != 0 || p.offset < end {
                return Err(bad(format!(
                    "part `{}` at {} is misaligned or overlaps the one before",
                    p.name, p.offset
                )));
            }
            let pend = p
                .offset
                .checked_add(p.len)
                .ok_or_else(|| bad(format!("part `{}` overflows", p.name)))?;
            if pend > m.file_len {
                return Err(bad(format!(
                    "part `{}` ends at {pend}, past the {}-byte file",
                    p.name, m.file_len
                )));
            }
            if p.xxh3.len() != 16 || !p.xxh3.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(format!(
                    "part `{}`: checksum `{}` is not 16 hex digits",
                    p.name, p.xxh3
                )));
            }
            let mut at = p.offset;
            for t in &p.tensors {
                let dtype = Dtype::from_safetensors(&t.dtype).ok_or_else(|| {
                    bad(format!("tensor `{}`: unknown dtype `{}`", t.name, t.dtype))
                })?;
                let want = t
                    .shape
                    .iter()
                    .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64))
                    .ok_or_else(|| bad(format!("tensor `{}`: size overflows", t.name)))?;
                if want != t.len || t.offset != at {
                    return Err(bad(format!(
                        "tensor `{}`: {} bytes at {}, expected {want} at {at}",
                        t.name, t.len, t.offset
                    )));
                }
                // Checked, and against the run's end: a length near 2^64 would otherwise wrap
                // `at` back inside the run and a later tensor could make the sums agree.
                at = at
                    .checked_add(t.len)
                    .filter(|&e| e <= pend)
                    .ok_or_else(|| {
                        bad(format!(
                            "tensor `{}`: {} bytes at {} run past the end of part `{}` at {pend}",
                            t.name, t.len, t.offset, p.name
                        ))
                    })?;
            }
            if at != pend {
                return Err(bad(format!(
                    "part `{}`: tensors cover {} bytes of {}",
                    p.name,
                    at - p.offset,
                    p.len
                )));
            }
            end = pend;
        }
        Ok(m)
    }

    /// Reads and validates `dir/sluice-trunk.json`.
    pub fn read(dir: &Path) -> Result<Manifest, FormatError> {
        let path = dir.join(MANIFEST);
        let bytes = crate::file::read_capped(&path, MAX_MANIFEST_LEN)?;
        Manifest::parse(&bytes, &path)
    }

    /// The source directory.
    pub fn source_dir(&self) -> PathBuf {
        PathBuf::from(&self.source)
    }

    /// The part named `name`.
    pub fn part(&self, name: &str) -> Option<&PackedPart> {
        self.parts.iter().find(|p| p.name == name)
    }
}

/// The name of part `i` in the numbering the model loads parts by: layers `0..layers` are
/// `layer.N`, part `layers` is `head`, part `layers + 1` is `embed`; anything past is `None`.
pub fn part_name(i: usize, layers: usize) -> Option<String> {
    match i.checked_sub(layers) {
        None => Some(format!("layer.{i}")),
        Some(0) => Some("head".to_owned()),
        Some(1) => Some("embed".to_owned()),
        Some(_) => None,
    }
}

/// A packed trunk that fails verification.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PackedError {
    /// The bytes of a part do not hash to the manifest's checksum.
    #[error(
        "{}: {part}: checksum mismatch (stored {stored}, computed {computed}): the packed trunk is corrupt; pack it again",
        file.display()
    )]
    Checksum {
        /// The trunk file.
        file: PathBuf,
        /// The part's name (`layer.N`, `head`, `embed`).
        part: String,
        /// The manifest's checksum (empty when the manifest has no such part).
        stored: String,
        /// The checksum of the bytes read.
        computed: String,
    },
}

/// The manifest's checksum of every part of a packed trunk, by part number ([`part_name`]),
/// to verify parts as they are read.
///
/// ```
/// # use sluice_format::packed::{TrunkChecksums, Manifest};
/// # fn demo(m: &Manifest, pieces: &[&[u8]]) -> Result<(), sluice_format::packed::PackedError> {
/// let sums = TrunkChecksums::new(m, std::path::Path::new("pack/trunk.bin"), 2);
/// sums.verify(0, pieces.iter().copied())?; // layer.0, its tensors in file order
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrunkChecksums {
    file: PathBuf,
    /// (name, stored checksum) of parts `0..layers + 2`.
    sums: Vec<(String, String)>,
}

impl TrunkChecksums {
    /// The checksums of parts `0..layers + 2` of `m`; `trunk_file` is the path errors name. A
    /// part missing from the manifest has the empty checksum, which nothing matches.
    pub fn new(m: &Manifest, trunk_file: &Path, layers: usize) -> TrunkChecksums {
        let sums = (0..layers + 2)
            .filter_map(|i| part_name(i, layers))
            .map(|name| {
                let sum = m.part(&name).map(|p| p.xxh3.clone()).unwrap_or_default();
                (name, sum)
            })
            .collect();
        TrunkChecksums {
            file: trunk_file.to_path_buf(),
            sums,
        }
    }

    /// Checks that `pieces` (the bytes of part `part`, in file order) hash to the stored
    /// checksum. Part numbers past the trunk have nothing to check and pass.
    pub fn verify<'a>(
        &self,
        part: usize,
        pieces: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<(), PackedError> {
        let Some((name, stored)) = self.sums.get(part) else {
            return Ok(());
        };
        verify_part(&self.file, name, stored, pieces)
    }
}

/// Checks that `pieces` hash ([`xxh3_hex`]) to `stored`, the checksum of part `part` of the
/// trunk file `file`.
pub fn verify_part<'a>(
    file: &Path,
    part: &str,
    stored: &str,
    pieces: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(), PackedError> {
    let computed = xxh3_hex(pieces);
    if computed != stored {
        return Err(PackedError::Checksum {
            file: file.to_path_buf(),
            part: part.to_owned(),
            stored: stored.to_owned(),
            computed,
        });
    }
    Ok(())
}

/// xxh3-64 of a sequence of byte slices, as 16 hex digits.
pub fn xxh3_hex<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for c in chunks {
        h.update(c);
    }
    format!("{:016x}", h.digest())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            source: "/models/x".into(),
            source_shards: vec![SourceShard {
                name: "model.safetensors".into(),
                len: 100,
            }],
            file: TRUNK_FILE.into(),
            file_len: 8192,
            parts: vec![PackedPart {
                name: "layer.0".into(),
                offset: 4096,
                len: 24,
                xxh3: "0123456789abcdef".into(),
                tensors: vec![
                    PackedTensor {
                        name: "a".into(),
                        dtype: "F32".into(),
                        shape: vec![2, 2],
                        offset: 4096,
                        len: 16,
                    },
                    PackedTensor {
                        name: "b".into(),
                        dtype: "BF16".into(),
                        shape: vec![4],
                        offset: 4112,
                        len: 8,
                    },
                ],
            }],
        }
    }

    fn parse(m: &Manifest) -> Result<Manifest, FormatError> {
        Manifest::parse(&serde_json::to_vec(m).unwrap(), Path::new("m.json"))
    }

    #[test]
    fn round_trip_and_checks() {
        assert_eq!(parse(&sample()).unwrap(), sample());
        let mut m = sample();
        m.version = 2;
        assert!(parse(&m).unwrap_err().to_string().contains("version 2"));
        let mut m = sample();
        m.parts[0].offset = 4000;
        assert!(parse(&m).is_err());
        let mut m = sample();
        m.parts[0].tensors[1].shape = vec![5];
        assert!(parse(&m).unwrap_err().to_string().contains("`b`"));
        let mut m = sample();
        m.file_len = 4100;
        assert!(parse(&m).is_err());
        let mut m = sample();
        m.source_shards[0].name = "../etc/passwd".into();
        assert!(parse(&m).is_err());
        let mut m = sample();
        m.parts[0].xxh3 = "zz".into();
        assert!(parse(&m).is_err());
        assert!(Manifest::parse(b"{", Path::new("m.json")).is_err());
    }

    /// Found by the `packed_manifest` fuzz target (docs/RELIABILITY.md): a tensor whose length
    /// (consistent with its shape) reaches past 2^64 overflowed the running offset — a panic with
    /// overflow checks, and without them a wrap back to 0 after which a second tensor could make
    /// the run look exactly covered, accepting a tensor of 2^64 - 4096 bytes.
    #[test]
    fn tensor_lengths_overflowing_the_run_are_refused() {
        let mut m = sample();
        let huge = u64::MAX - 4095; // 4096 + huge = 2^64
        m.parts[0].tensors[0] = PackedTensor {
            name: "a".into(),
            dtype: "U8".into(),
            shape: vec![huge as usize],
            offset: 4096,
            len: huge,
        };
        m.parts[0].tensors[1] = PackedTensor {
            name: "b".into(),
            dtype: "U8".into(),
            shape: vec![4120],
            offset: 0,
            len: 4120,
        };
        let e = parse(&m).unwrap_err().to_string();
        assert!(
            e.contains("tensor `a`") && e.contains("past the end"),
            "{e}"
        );
        // A tensor ending past its run (no overflow) is refused the same way.
        let mut m = sample();
        m.parts[0].tensors[0].shape = vec![2, 8];
        m.parts[0].tensors[0].len = 64;
        let e = parse(&m).unwrap_err().to_string();
        assert!(
            e.contains("tensor `a`") && e.contains("past the end"),
            "{e}"
        );
    }

    #[test]
    fn hash_is_streaming() {
        assert_eq!(xxh3_hex([&b"ab"[..], &b"cd"[..]]), xxh3_hex([&b"abcd"[..]]));
        assert_ne!(xxh3_hex([&b"abce"[..]]), xxh3_hex([&b"abcd"[..]]));
    }

    #[test]
    fn checksums_by_part_number() {
        assert_eq!(part_name(0, 2).as_deref(), Some("layer.0"));
        assert_eq!(part_name(2, 2).as_deref(), Some("head"));
        assert_eq!(part_name(3, 2).as_deref(), Some("embed"));
        assert_eq!(part_name(4, 2), None);
        let mut m = sample();
        let bytes = [7u8; 24];
        m.parts[0].xxh3 = xxh3_hex([&bytes[..10], &bytes[10..]]);
        let file = Path::new("/p/trunk.bin");
        let sums = TrunkChecksums::new(&m, file, 1);
        assert_eq!(sums.verify(0, [&bytes[..]]), Ok(()));
        assert_eq!(sums.verify(3, [&b"anything"[..]]), Ok(()));
        let e = sums.verify(0, [&bytes[1..]]).unwrap_err();
        let PackedError::Checksum {
            ref part,
            ref stored,
            ref computed,
            ..
        } = e;
        assert_eq!((part.as_str(), stored), ("layer.0", &m.parts[0].xxh3));
        assert_eq!(
            e.to_string(),
            format!(
                "/p/trunk.bin: layer.0: checksum mismatch (stored {stored}, computed {computed}): \
                 the packed trunk is corrupt; pack it again"
            )
        );
        // The head is not in the manifest: nothing matches the empty checksum.
        let e = sums.verify(1, [&bytes[..]]).unwrap_err().to_string();
        assert!(
            e.contains("head: checksum mismatch (stored , computed"),
            "{e}"
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in ".{0,400}") {
            let _ = Manifest::parse(s.as_bytes(), Path::new("m.json"));
        }
    }
}
