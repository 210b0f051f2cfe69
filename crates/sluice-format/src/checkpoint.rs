//! Hugging Face checkpoint directories: config, generation config, shards and their index.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::gguf::GgufSet;
use crate::packed::{MANIFEST, Manifest};
use crate::safetensors::read_header;
use crate::{Dtype, FormatError};

/// Name of the single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The largest index file accepted, in bytes.
pub const MAX_INDEX_LEN: u64 = 256 * 1024 * 1024;
/// The largest config file accepted, in bytes.
pub const MAX_CONFIG_LEN: u64 = 16 * 1024 * 1024;

/// Where one tensor lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major, outermost first).
    pub shape: Vec<usize>,
    /// Index of the shard in [`Checkpoint::shards`].
    pub shard: usize,
    /// Absolute byte offset in the shard.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One safetensors file of a checkpoint.
#[derive(Debug)]
pub struct Shard {
    /// Full path.
    pub path: PathBuf,
    /// File name as the index names it.
    pub name: String,
    /// Length in bytes when opened.
    pub len: u64,
    /// Metadata map of the header.
    pub metadata: BTreeMap<String, String>,
    file: File,
}

impl Shard {
    /// The open file (buffered reads).
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// A Hugging Face checkpoint directory, validated.
///
/// Opening reads `config.json`, `generation_config.json` when present, the shard index when
/// present and every shard's header; it checks that the index and the shards agree. No tensor
/// data is read until asked for.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    config: Value,
    generation_config: Option<Value>,
    shards: Vec<Shard>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    packed: Option<Manifest>,
    /// [`Checkpoint::rename`] renamed its tensors.
    renamed: bool,
    /// The GGUF model this checkpoint reads, when it is one (see [`Checkpoint::open`]).
    gguf: Option<Box<GgufSet>>,
    /// Tensors whose rows are stored in llama.cpp's rotary order, with their head dimension
    /// (see [`Checkpoint::set_gguf_layout`]).
    rope_rows: HashMap<String, usize>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> FormatError + '_ {
    move |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a JSON file of at most `cap` bytes (a regular file: see [`crate::file`]).
pub fn read_json(path: &Path, cap: u64) -> Result<Value, FormatError> {
    let text = crate::file::read_capped(path, cap)?;
    serde_json::from_slice(&text).map_err(|e| FormatError::ConfigJson {
        path: path.to_path_buf(),
        msg: format!("not valid JSON: {e}"),
    })
}

impl Checkpoint {
    /// Opens and validates the checkpoint in `dir`: a Hugging Face directory, or a pack
    /// directory written by `sluice pack` (its manifest names the source; the trunk's tensors
    /// then come from the packed trunk file, routed experts from the source's shards).
    ///
    /// A GGUF model is opened too: a `.gguf` file (any part of a split set
    /// `NAME-0000N-of-0000M.gguf`), or a directory without `config.json` holding one GGUF
    /// model. Its tensors are listed under their GGUF names with [`Dtype::Ggml`] types and an
    /// empty config; whoever maps GGUF onto a model gives them their names and the config
    /// ([`Checkpoint::set_gguf_layout`]).
    pub fn open(dir: impl AsRef<Path>) -> Result<Checkpoint, FormatError> {
        let dir = dir.as_ref();
        if let Some(g) = gguf_in(dir)? {
            return Checkpoint::open_gguf(&g);
        }
        if crate::file::present(&dir.join(MANIFEST)) {
            return Checkpoint::open_packed(dir);
        }
        Checkpoint::open_hf(dir)
    }

    fn open_gguf(path: &Path) -> Result<Checkpoint, FormatError> {
        let set = GgufSet::open(path)?;
        let mut shards = Vec::with_capacity(set.parts.len());
        let mut tensors = Vec::new();
        let mut by_name = HashMap::new();
        for (si, part) in set.parts.iter().enumerate() {
            let h = &part.header;
            let file = crate::file::open_regular(&h.path)?;
            let len = file.metadata().map_err(io_err(&h.path))?.len();
            for t in &h.tensors {
                let shape = t
                    .shape()
                    .into_iter()
                    .map(|d| usize::try_from(d).ok())
                    .collect::<Option<Vec<usize>>>()
                    .ok_or_else(|| FormatError::GgufTensor {
                        path: h.path.clone(),
                        tensor: t.name.clone(),
                        msg: "a dimension does not fit in memory".into(),
                    })?;
                by_name.insert(t.name.clone(), tensors.len());
                tensors.push(TensorInfo {
                    name: t.name.clone(),
                    dtype: Dtype::Ggml(t.ty),
                    shape,
                    shard: si,
                    offset: t.offset,
                    len: t.len,
                });
            }
            shards.push(Shard {
                path: h.path.clone(),
                name: h
                    .path
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
                len,
                metadata: BTreeMap::new(),
                file,
            });
        }
        Ok(Checkpoint {
            dir: set.header().path.clone(),
            config: Value::Object(Default::default()),
            generation_config: None,
            shards,
            tensors,
            by_name,
            packed: None,
            renamed: false,
            gguf: Some(Box::new(set)),
            rope_rows: HashMap::new(),
        })
    }

    /// The GGUF model, when this checkpoint is one.
    pub fn gguf(&self) -> Option<&GgufSet> {
        self.gguf.as_deref()
    }

    /// Gives a GGUF checkpoint the model's view of it: `config` (a `config.json` as Hugging
    /// Face writes it for the model), the tensors as the model reads them (`tensors`: the name
    /// the model asks for, e.g. a Hugging Face name, and a byte range of the GGUF files, such
    /// as one expert's slab of a stacked `ffn_up_exps`, whose [`TensorInfo::name`] is what
    /// errors show: the GGUF name), and the tensors whose rows llama.cpp's converter stored in
    /// its rotary order with their head dimension (`rope_rows`, by the names asked for). Two
    /// tensors of one name are refused, naming both.
    pub fn set_gguf_layout(
        &mut self,
        config: Value,
        tensors: Vec<(String, TensorInfo)>,
        rope_rows: HashMap<String, usize>,
    ) -> Result<(), FormatError> {
        let mut by_name = HashMap::with_capacity(tensors.len());
        for (i, (name, t)) in tensors.iter().enumerate() {
            if let Some(prev) = by_name.insert(name.clone(), i) {
                return Err(FormatError::SameName {
                    dir: self.dir.clone(),
                    name: name.clone(),
                    first: tensors[prev].1.name.clone(),
                    second: t.name.clone(),
                });
            }
        }
        self.config = config;
        self.tensors = tensors.into_iter().map(|(_, t)| t).collect();
        self.by_name = by_name;
        self.rope_rows = rope_rows;
        self.renamed = true;
        Ok(())
    }

    /// Gives a GGUF checkpoint the `generation_config.json` its metadata describes (the
    /// sampling defaults llama.cpp's converter copied into `general.sampling.*`).
    pub fn set_generation_config(&mut self, g: Value) {
        self.generation_config = Some(g);
    }

    /// The head dimension of a tensor whose rows are stored in llama.cpp's rotary order (the
    /// query and key projections of a Llama-family GGUF), if it is one.
    pub fn rope_rows(&self, name: &str) -> Option<usize> {
        self.rope_rows.get(name).copied()
    }

    fn open_packed(dir: &Path) -> Result<Checkpoint, FormatError> {
        let manifest = Manifest::read(dir)?;
        let mpath = dir.join(MANIFEST);
        let bad = |msg: String| FormatError::Manifest {
            path: mpath.clone(),
            msg,
        };
        let mut ck = Checkpoint::open_hf(&manifest.source_dir())?;
        // The source must be what was packed.
        let names: Vec<(&str, u64)> = ck.shards.iter().map(|s| (s.name.as_str(), s.len)).collect();
        let packed: Vec<(&str, u64)> = manifest
            .source_shards
            .iter()
            .map(|s| (s.name.as_str(), s.len))
            .collect();
        if names != packed {
            return Err(bad(format!(
                "the source {} has changed since it was packed (shards or their sizes differ); pack it again",
                manifest.source
            )));
        }
        let tpath = dir.join(&manifest.file);
        let file = crate::file::open_regular(&tpath)?;
        let len = file.metadata().map_err(io_err(&tpath))?.len();
        if len != manifest.file_len {
            return Err(FormatError::Manifest {
                path: tpath,
                msg: format!(
                    "{len} bytes, the manifest says {} (truncated or replaced?)",
                    manifest.file_len
                ),
            });
        }
        let si = ck.shards.len();
        for p in &manifest.parts {
            for t in &p.tensors {
                let Some(&i) = ck.by_name.get(&t.name) else {
                    return Err(bad(format!(
                        "tensor `{}` of part `{}` is not in the source",
                        t.name, p.name
                    )));
                };
                let orig = &mut ck.tensors[i];
                if orig.dtype.safetensors_name() != t.dtype || orig.shape != t.shape {
                    return Err(bad(format!(
                        "tensor `{}` differs from the source's",
                        t.name
                    )));
                }
                orig.shard = si;
                orig.offset = t.offset;
                orig.len = t.len;
            }
        }
        ck.shards.push(Shard {
            path: tpath,
            name: manifest.file.clone(),
            len,
            metadata: BTreeMap::new(),
            file,
        });
        // The pack directory holds its own copies of the small files.
        ck.config = read_json(&dir.join("config.json"), MAX_CONFIG_LEN)?;
        let gen_path = dir.join("generation_config.json");
        ck.generation_config = if crate::file::present(&gen_path) {
            Some(read_json(&gen_path, MAX_CONFIG_LEN)?)
        } else {
            None
        };
        ck.dir = dir.to_path_buf();
        ck.packed = Some(manifest);
        Ok(ck)
    }

    /// The pack manifest, when this is a pack directory.
    pub fn packed(&self) -> Option<&Manifest> {
        self.packed.as_ref()
    }

    fn open_hf(dir: &Path) -> Result<Checkpoint, FormatError> {
        let dir = dir.to_path_buf();
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(FormatError::Io {
                    path: dir,
                    source: std::io::Error::other("not a directory"),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(FormatError::MissingFile { path: dir });
            }
            Err(e) => {
                return Err(FormatError::Io {
                    path: dir,
                    source: e,
                });
            }
        }
        let config = read_json(&dir.join("config.json"), MAX_CONFIG_LEN)?;
        if !config.is_object() {
            return Err(FormatError::ConfigJson {
                path: dir.join("config.json"),
                msg: "top level is not an object".into(),
            });
        }
        let gen_path = dir.join("generation_config.json");
        let generation_config = if crate::file::present(&gen_path) {
            Some(read_json(&gen_path, MAX_CONFIG_LEN)?)
        } else {
            None
        };

        let index_path = dir.join(INDEX_FILE);
        let (shard_names, weight_map) = if crate::file::present(&index_path) {
            let index = read_index(&index_path)?;
            (index.shards, Some(index.weight_map))
        } else if crate::file::present(&dir.join(SINGLE_FILE)) {
            (vec![SINGLE_FILE.to_owned()], None)
        } else {
            return Err(FormatError::NoCheckpoint { dir });
        };

        let mut shards: Vec<Shard> = Vec::with_capacity(shard_names.len());
        let mut tensors: Vec<TensorInfo> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (si, name) in shard_names.iter().enumerate() {
            let path = dir.join(name);
            if !crate::file::present(&path) {
                if let Some(map) = &weight_map {
                    let tensor = map
                        .iter()
                        .find(|(_, s)| *s == name)
                        .map(|(t, _)| t.clone())
                        .unwrap_or_default();
                    return Err(FormatError::IndexMissingShard {
                        index: index_path,
                        shard: name.clone(),
                        tensor,
                    });
                }
                return Err(FormatError::MissingFile { path });
            }
            let (header, len) = read_header(&path)?;
            let file = crate::file::open_regular(&path)?;
            for e in header.tensors {
                if let Some(map) = &weight_map
                    && map.get(&e.name) != Some(name)
                {
                    return Err(FormatError::NotInIndex {
                        path,
                        tensor: e.name,
                    });
                }
                if let Some(&prev) = by_name.get(&e.name) {
                    return Err(FormatError::DuplicateTensor {
                        tensor: e.name,
                        // A shard cannot repeat a name, so the first sits in an earlier shard.
                        first: shards[tensors[prev].shard].path.clone(),
                        second: path,
                    });
                }
                by_name.insert(e.name.clone(), tensors.len());
                tensors.push(TensorInfo {
                    name: e.name,
                    dtype: e.dtype,
                    shape: e.shape,
                    shard: si,
                    offset: e.offset,
                    len: e.len,
                });
            }
            shards.push(Shard {
                path,
                name: name.clone(),
                len,
                metadata: header.metadata,
                file,
            });
        }
        if let Some(map) = &weight_map {
            for (tensor, shard) in map {
                if !by_name.contains_key(tensor) {
                    return Err(FormatError::IndexMissingTensor {
                        index: index_path,
                        tensor: tensor.clone(),
                        shard: shard.clone(),
                    });
                }
            }
        }
        Ok(Checkpoint {
            dir,
            config,
            generation_config,
            shards,
            tensors,
            by_name,
            renamed: false,
            packed: None,
            gguf: None,
            rope_rows: HashMap::new(),
        })
    }

    /// The directory (for a GGUF model, the path of its first file).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `config.json`, parsed.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// `generation_config.json`, parsed, when present.
    pub fn generation_config(&self) -> Option<&Value> {
        self.generation_config.as_ref()
    }

    /// The shards, in index order (file-name order for an index).
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Every tensor, grouped by shard, each shard's tensors in file-offset order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Gives tensors the names a model asks for them by: each tensor whose stored name `rename`
    /// maps is found under the new name instead (its [`TensorInfo::name`], which errors and
    /// packs use, stays the stored one). Mistral's own checkpoints name their tensors as
    /// Mistral's code does, and transformers renames them as it loads them; so does a family
    /// here. Two tensors renamed to one name are refused, naming both.
    pub fn rename(&mut self, rename: impl Fn(&str) -> Option<String>) -> Result<(), FormatError> {
        let mut by_name = HashMap::with_capacity(self.tensors.len());
        for (i, t) in self.tensors.iter().enumerate() {
            let name = rename(&t.name).unwrap_or_else(|| t.name.clone());
            if let Some(prev) = by_name.insert(name.clone(), i) {
                return Err(FormatError::SameName {
                    dir: self.dir.clone(),
                    name,
                    first: self.tensors[prev].name.clone(),
                    second: t.name.clone(),
                });
            }
        }
        self.by_name = by_name;
        self.renamed = true;
        Ok(())
    }

    /// The names tensors are found by ([`Checkpoint::get`]), in no particular order: their
    /// stored names unless [`Checkpoint::rename`] gave them others.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The tensor of that name, if any.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor of that name, or an error naming it.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, FormatError> {
        self.get(name).ok_or_else(|| FormatError::TensorNotFound {
            dir: self.dir.clone(),
            tensor: name.to_owned(),
            note: if self.renamed {
                " (its tensors are read under the names transformers gives them on load)"
            } else {
                ""
            },
        })
    }

    /// Reads a tensor's bytes into `buf` (whose length must equal the tensor's) with buffered I/O.
    pub fn read_into(&self, t: &TensorInfo, buf: &mut [u8]) -> Result<(), FormatError> {
        let shard = &self.shards[t.shard];
        let err = |source| FormatError::Read {
            path: shard.path.clone(),
            tensor: t.name.clone(),
            offset: t.offset,
            end: t.offset + t.len,
            source,
        };
        if buf.len() as u64 != t.len {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("buffer of {} bytes for a {}-byte tensor", buf.len(), t.len),
            )));
        }
        shard.file.read_exact_at(buf, t.offset).map_err(err)
    }

    /// Reads a tensor's bytes into a new vector.
    pub fn read(&self, t: &TensorInfo) -> Result<Vec<u8>, FormatError> {
        let mut buf = vec![0u8; t.len as usize];
        self.read_into(t, &mut buf)?;
        Ok(buf)
    }

    /// Reads the named tensor's bytes into a new vector.
    pub fn read_named(&self, name: &str) -> Result<(&TensorInfo, Vec<u8>), FormatError> {
        let t = self.tensor(name)?;
        Ok((t, self.read(t)?))
    }
}

/// The GGUF file to open for `path`: `path` itself when it is a `.gguf` file; in a directory
/// without `config.json`, its one `.gguf` file or the first part of its one split set (more
/// than one model there is refused, naming them). `None` otherwise.
pub fn gguf_in(path: &Path) -> Result<Option<PathBuf>, FormatError> {
    let is_gguf = |p: &Path| {
        p.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    };
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => return Ok(is_gguf(path).then(|| path.to_path_buf())),
        Ok(m) if m.is_dir() => {}
        _ => return Ok(None),
    }
    if crate::file::present(&path.join("config.json")) {
        return Ok(None);
    }
    let Ok(rd) = std::fs::read_dir(path) else {
        return Ok(None);
    };
    let mut models: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && is_gguf(p))
        .filter(|p| {
            // One entry per split set: its first part.
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            crate::gguf::split_name(n).is_none_or(|(_, no, _)| no == 1)
        })
        .collect();
    models.sort();
    match models.len() {
        0 => Ok(None),
        1 => Ok(models.pop()),
        _ => Err(FormatError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(format!(
                "holds {} GGUF models ({}); name the file to run",
                models.len(),
                models
                    .iter()
                    .filter_map(|p| p.file_name()?.to_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }),
    }
}

/// A parsed shard index (`model.safetensors.index.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardIndex {
    /// The shard file names, sorted and without repeats; never empty, each a plain file name.
    pub shards: Vec<String>,
    /// Tensor name → shard file name; every shard named here is in `shards`.
    pub weight_map: BTreeMap<String, String>,
}

/// Parses and validates the bytes of a shard index: JSON whose `weight_map` is a non-empty
/// object mapping tensor names to plain file names (no `/`, `\`, NUL, `.` or `..`). `path`
/// names the file in errors. Nothing here panics on any input.
pub fn parse_index(bytes: &[u8], path: &Path) -> Result<ShardIndex, FormatError> {
    let bad = |msg: &str| FormatError::IndexJson {
        path: path.to_path_buf(),
        msg: msg.to_owned(),
    };
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| bad(&format!("not valid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("`weight_map` missing or not an object"))?;
    let mut weight_map = BTreeMap::new();
    let mut names = Vec::new();
    for (tensor, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(&format!("shard for tensor `{tensor}` is not a string")))?;
        if shard.is_empty()
            || shard.contains('/')
            || shard.contains('\\')
            || shard == "."
            || shard == ".."
            || shard.contains('\0')
        {
            return Err(bad(&format!(
                "shard `{shard}` for tensor `{tensor}` is not a plain file name"
            )));
        }
        names.push(shard.to_owned());
        weight_map.insert(tensor.clone(), shard.to_owned());
    }
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err(bad("`weight_map` is empty"));
    }
    Ok(ShardIndex {
        shards: names,
        weight_map,
    })
}

/// Reads `model.safetensors.index.json` (at most [`MAX_INDEX_LEN`] bytes) and parses it.
fn read_index(path: &Path) -> Result<ShardIndex, FormatError> {
    let bytes = crate::file::read_capped(path, MAX_INDEX_LEN)?;
    parse_index(&bytes, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors::serialize;

    fn write(dir: &Path, name: &str, bytes: &[u8]) {
        std::fs::write(dir.join(name), bytes).unwrap();
    }

    fn shard(tensors: &[(&str, usize)]) -> Vec<u8> {
        let data: Vec<Vec<u8>> = tensors.iter().map(|(_, n)| vec![7u8; n * 4]).collect();
        let shapes: Vec<[usize; 1]> = tensors.iter().map(|(_, n)| [*n]).collect();
        let entries: Vec<(&str, Dtype, &[usize], &[u8])> = tensors
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (*name, Dtype::F32, &shapes[i][..], &data[i][..]))
            .collect();
        serialize(&entries, None)
    }

    fn sharded_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "config.json", br#"{"model_type":"x"}"#);
        write(
            d.path(),
            "model-00001-of-00002.safetensors",
            &shard(&[("a", 2), ("b", 3)]),
        );
        write(
            d.path(),
            "model-00002-of-00002.safetensors",
            &shard(&[("c", 1)]),
        );
        write(
            d.path(),
            INDEX_FILE,
            br#"{"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors",
                "b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}"#,
        );
        d
    }

    #[test]
    fn opens_sharded() {
        let d = sharded_dir();
        let ck = Checkpoint::open(d.path()).unwrap();
        assert_eq!(ck.shards().len(), 2);
        let c = ck.tensor("c").unwrap();
        assert_eq!(c.shard, 1);
        assert_eq!(ck.read(c).unwrap(), vec![7u8; 4]);
        assert!(matches!(
            ck.tensor("zz"),
            Err(FormatError::TensorNotFound { .. })
        ));
        assert_eq!(ck.config()["model_type"], "x");
        assert!(ck.generation_config().is_none());
    }

    #[test]
    fn renamed_tensors_are_found_by_their_new_names_only() {
        let d = sharded_dir();
        let mut ck = Checkpoint::open(d.path()).unwrap();
        ck.rename(|n| (n != "b").then(|| format!("m.{n}"))).unwrap();
        let c = ck.tensor("m.c").unwrap();
        assert_eq!(c.name, "c", "the stored name stays");
        assert_eq!(ck.read(c).unwrap(), vec![7u8; 4]);
        assert!(ck.get("c").is_none() && ck.get("b").is_some());
        let mut names: Vec<&str> = ck.names().collect();
        names.sort_unstable();
        assert_eq!(names, ["b", "m.a", "m.c"]);
        // Two tensors under one name are refused, naming both.
        let e = ck.rename(|_| Some("x".into())).unwrap_err().to_string();
        assert!(e.contains("are both read as `x`"), "{e}");
        assert!(
            ck.get("m.a").is_some(),
            "a refused renaming changes nothing"
        );
    }

    #[test]
    fn missing_shard() {
        let d = sharded_dir();
        std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
        match Checkpoint::open(d.path()).unwrap_err() {
            FormatError::IndexMissingShard { shard, tensor, .. } => {
                assert_eq!(shard, "model-00002-of-00002.safetensors");
                assert_eq!(tensor, "c");
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn index_names_missing_tensor() {
        let d = sharded_dir();
        write(
            d.path(),
            INDEX_FILE,
            br#"{"weight_map":{"a":"model-00001-of-00002.safetensors",
                "b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors",
                "d":"model-00002-of-00002.safetensors"}}"#,
        );
        match Checkpoint::open(d.path()).unwrap_err() {
            FormatError::IndexMissingTensor { tensor, shard, .. } => {
                assert_eq!(tensor, "d");
                assert_eq!(shard, "model-00002-of-00002.safetensors");
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn shard_tensor_not_in_index() {
        let d = sharded_dir();
        write(
            d.path(),
            INDEX_FILE,
            br#"{"weight_map":{"a":"model-00001-of-00002.safetensors",
                "c":"model-00002-of-00002.safetensors"}}"#,
        );
        assert!(matches!(
            Checkpoint::open(d.path()).unwrap_err(),
            FormatError::NotInIndex { tensor, .. } if tensor == "b"
        ));
    }

    #[test]
    fn index_path_traversal_refused() {
        let d = sharded_dir();
        write(
            d.path(),
            INDEX_FILE,
            br#"{"weight_map":{"a":"../model-00001-of-00002.safetensors"}}"#,
        );
        assert!(matches!(
            Checkpoint::open(d.path()).unwrap_err(),
            FormatError::IndexJson { .. }
        ));
    }

    #[test]
    fn truncated_shard_at_open_and_after() {
        let d = sharded_dir();
        let p = d.path().join("model-00001-of-00002.safetensors");
        let full = std::fs::read(&p).unwrap();
        std::fs::write(&p, &full[..full.len() - 3]).unwrap();
        match Checkpoint::open(d.path()).unwrap_err() {
            FormatError::OutOfBounds { tensor, path, .. } => {
                assert_eq!(tensor, "b");
                assert_eq!(path, p);
            }
            e => panic!("{e}"),
        }
        // Truncated after open: the read reports the tensor and an unexpected EOF.
        std::fs::write(&p, &full).unwrap();
        let ck = Checkpoint::open(d.path()).unwrap();
        std::fs::write(&p, &full[..full.len() - 3]).unwrap();
        match ck.read(ck.tensor("b").unwrap()).unwrap_err() {
            FormatError::Read { tensor, source, .. } => {
                assert_eq!(tensor, "b");
                assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn duplicate_across_shards() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "config.json", b"{}");
        write(d.path(), "s1.safetensors", &shard(&[("a", 1)]));
        write(d.path(), "s2.safetensors", &shard(&[("a", 1)]));
        write(
            d.path(),
            INDEX_FILE,
            br#"{"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}}"#,
        );
        // s2 holds `a`, which the index maps to s1.
        assert!(matches!(
            Checkpoint::open(d.path()).unwrap_err(),
            FormatError::NotInIndex { .. }
        ));
    }

    #[test]
    fn missing_pieces() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            Checkpoint::open(d.path().join("nope")).unwrap_err(),
            FormatError::MissingFile { .. }
        ));
        assert!(matches!(
            Checkpoint::open(d.path()).unwrap_err(),
            FormatError::MissingFile { path } if path.ends_with("config.json")
        ));
        write(d.path(), "config.json", b"{\"a\":");
        assert!(matches!(
            Checkpoint::open(d.path()).unwrap_err(),
            FormatError::ConfigJson { .. }
        ));
        write(d.path(), "config.json", b"{}");
        assert!(matches!(
            Checkpoint::open(d.path()).unwrap_err(),
            FormatError::NoCheckpoint { .. }
        ));
        write(d.path(), SINGLE_FILE, &shard(&[("w", 4)]));
        let ck = Checkpoint::open(d.path()).unwrap();
        assert_eq!(ck.tensor("w").unwrap().numel(), 4);
    }
}
