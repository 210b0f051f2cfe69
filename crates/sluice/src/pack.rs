//! `sluice pack`: the trunk of a checkpoint copied layer by layer into one file, each layer's
//! run aligned to 4096 bytes at both ends, with a manifest of offsets, dtypes, shapes and a
//! checksum per run. Routed experts are referenced in the original shards, never copied.
//!
//! The pack is written under a temporary name beside the output and renamed at the end: an
//! interrupted pack leaves the output untouched (and a `.<name>.sluice-partial` directory that
//! the next run removes).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use sluice_format::Checkpoint;
use sluice_format::packed::{
    ALIGN, FORMAT, MANIFEST, Manifest, PackedPart, PackedTensor, SourceShard, TRUNK_FILE, VERSION,
};
use sluice_model::ModelConfig;
use sluice_model::weights::{PartLayout, WeightLayout};

use crate::Error;

/// Small files a pack directory keeps copies of, so it can stand in for the source directory.
pub const COPIED_FILES: [&str; 7] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tiktoken.model",
    "chat_template.jinja",
];

/// What a pack wrote.
#[derive(Clone, Debug)]
pub struct PackReport {
    /// The pack directory.
    pub out: PathBuf,
    /// Bytes of trunk tensors copied.
    pub trunk_bytes: u64,
    /// Runs written (embeddings, layers, head).
    pub parts: usize,
    /// Seconds taken.
    pub seconds: f64,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The part layouts in file order with their names.
fn parts(layout: &WeightLayout) -> Vec<(String, &PartLayout)> {
    let mut v = vec![("embed".to_owned(), &layout.embed)];
    v.extend(
        layout
            .layers
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("layer.{i}"), p)),
    );
    v.push(("head".to_owned(), &layout.head));
    v
}

/// Total bytes a pack of `src` copies.
pub fn pack_size(src: &Path) -> Result<u64, Error> {
    let ck = Checkpoint::open(src)?;
    let cfg = ModelConfig::from_json(ck.config(), &src.join("config.json"))?;
    Ok(WeightLayout::new(&ck, &cfg)?.trunk_bytes())
}

/// Packs the trunk of the Hugging Face checkpoint `src` into the directory `out`.
///
/// Refuses when `out` exists (unless `force`, which replaces it only once the new pack is
/// complete), when `out` lies inside `src` (nothing is ever written into a model directory), and
/// when the source does not validate. `progress(done, total)` is called as bytes are copied.
pub fn pack(
    src: &Path,
    out: &Path,
    force: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PackReport, Error> {
    let t0 = Instant::now();
    if !src.is_dir() {
        return Err(Error::Usage(format!(
            "model directory {} does not exist",
            src.display()
        )));
    }
    let src = src.canonicalize().map_err(io(src))?;
    if src.join(MANIFEST).exists() {
        return Err(Error::Usage(format!(
            "{} is already a pack; pack its source instead",
            src.display()
        )));
    }
    let out_parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let out_parent = out_parent.canonicalize().map_err(io(&out_parent))?;
    let name = out
        .file_name()
        .ok_or_else(|| Error::Usage(format!("{}: not a directory name", out.display())))?;
    let out = out_parent.join(name);
    if out.starts_with(&src) {
        return Err(Error::Usage(format!(
            "{}: the pack must not go inside the model directory {}",
            out.display(),
            src.display()
        )));
    }
    if out.exists() && !force {
        return Err(Error::Usage(format!(
            "{} exists; pass --force to replace it",
            out.display()
        )));
    }

    // Validate the source completely before writing anything.
    let ck = Checkpoint::open(&src)?;
    let cfg = ModelConfig::from_json(ck.config(), &src.join("config.json"))?;
    let layout = WeightLayout::new(&ck, &cfg)?;
    let total = layout.trunk_bytes();

    let tmp = out_parent.join(format!(".{}.sluice-partial", name.to_string_lossy()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io(&tmp))?;
    let tpath = tmp.join(TRUNK_FILE);
    let mut f = File::create(&tpath).map_err(io(&tpath))?;
    let mut pos = 0u64;
    let mut done = 0u64;
    let mut buf = vec![0u8; 16 << 20];
    let mut records = Vec::new();
    let zeros = [0u8; ALIGN as usize];
    for (pname, part) in parts(&layout) {
        let pad = pos.next_multiple_of(ALIGN) - pos;
        f.write_all(&zeros[..pad as usize]).map_err(io(&tpath))?;
        pos += pad;
        let start = pos;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut tensors = Vec::new();
        for tname in part.names() {
            let t = ck.tensor(tname)?;
            let shard = &ck.shards()[t.shard];
            let mut off = 0u64;
            while off < t.len {
                let n = ((t.len - off) as usize).min(buf.len());
                shard
                    .file()
                    .read_exact_at(&mut buf[..n], t.offset + off)
                    .map_err(io(&shard.path))?;
                f.write_all(&buf[..n]).map_err(io(&tpath))?;
                hasher.update(&buf[..n]);
                off += n as u64;
                done += n as u64;
                progress(done, total);
            }
            tensors.push(PackedTensor {
                name: t.name.clone(),
                dtype: t.dtype.safetensors_name().to_owned(),
                shape: t.shape.clone(),
                offset: pos,
                len: t.len,
            });
            pos += t.len;
        }
        records.push(PackedPart {
            name: pname,
            offset: start,
            len: pos - start,
            xxh3: format!("{:016x}", hasher.digest()),
            tensors,
        });
    }
    let pad = pos.next_multiple_of(ALIGN) - pos;
    f.write_all(&zeros[..pad as usize]).map_err(io(&tpath))?;
    pos += pad;
    f.sync_all().map_err(io(&tpath))?;
    drop(f);

    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        source: src.display().to_string(),
        source_shards: ck
            .shards()
            .iter()
            .map(|s| SourceShard {
                name: s.name.clone(),
                len: s.len,
            })
            .collect(),
        file: TRUNK_FILE.into(),
        file_len: pos,
        parts: records,
    };
    let mpath = tmp.join(MANIFEST);
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::Usage(e.to_string()))?;
    std::fs::write(&mpath, json).map_err(io(&mpath))?;
    for file in COPIED_FILES {
        let from = src.join(file);
        if from.is_file() {
            let to = tmp.join(file);
            std::fs::copy(&from, &to).map_err(io(&to))?;
        }
    }
    File::open(&tmp)
        .and_then(|d| d.sync_all())
        .map_err(io(&tmp))?;

    // Swap into place; an existing pack goes only once the new one is complete.
    if out.exists() {
        let old = out_parent.join(format!(".{}.sluice-old", name.to_string_lossy()));
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(io(&old))?;
        }
        std::fs::rename(&out, &old).map_err(io(&out))?;
        std::fs::rename(&tmp, &out).map_err(io(&out))?;
        std::fs::remove_dir_all(&old).map_err(io(&old))?;
    } else {
        std::fs::rename(&tmp, &out).map_err(io(&out))?;
    }
    Ok(PackReport {
        out,
        trunk_bytes: total,
        parts: manifest.parts.len(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}
