//! `sluice pack`: the trunk of a checkpoint copied layer by layer into one file, each layer's
//! run aligned to 4096 bytes at both ends, with a manifest of offsets, dtypes, shapes and a
//! checksum per run. Routed experts are referenced in the original shards, never copied.
//!
//! The pack is written under a temporary name beside the output and renamed at the end: an
//! interrupted pack leaves the output untouched. A pack that fails (disk full, a read error)
//! removes its `.<name>.sluice-partial` directory; one left by a killed process is removed by
//! the next run, but only when it holds nothing but the files a pack writes.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use sluice_format::packed::{
    ALIGN, FORMAT, MANIFEST, Manifest, PackedPart, PackedTensor, SourceShard, TRUNK_FILE, VERSION,
};
use sluice_model::Description;
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

/// The partial pack directory while it is being written: removed on drop unless disarmed
/// (`.0 = None`) once it has been renamed into place.
struct Partial(Option<PathBuf>);

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// Whether `name` is a file `pack` writes into a pack directory.
fn is_pack_file(name: &str) -> bool {
    name == TRUNK_FILE || name == MANIFEST || COPIED_FILES.contains(&name)
}

/// `Ok` when `dir` is a real directory (not a symlink) holding only regular files with the
/// names `pack` writes; otherwise why not.
fn check_only_pack_files(dir: &Path) -> Result<(), String> {
    let meta = dir
        .symlink_metadata()
        .map_err(|e| format!("cannot be read ({e})"))?;
    if !meta.is_dir() {
        return Err("is not a directory".into());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot be listed ({e})"))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot be listed ({e})"))?;
        let fname = entry.file_name();
        let ok_name = fname.to_str().is_some_and(is_pack_file);
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if !ok_name || !is_file {
            return Err(format!(
                "holds {}, which sluice pack does not write",
                fname.to_string_lossy()
            ));
        }
    }
    Ok(())
}

/// `--force` replaces only a pack: a directory with a valid sluice manifest and nothing but
/// the files a pack holds. Anything else at OUT is the user's, and is refused.
fn check_pack_written_by_sluice(out: &Path) -> Result<(), Error> {
    let refuse = |why: String| {
        Error::Usage(format!(
            "{} {why}; --force replaces only a pack sluice wrote, so it is left alone",
            out.display()
        ))
    };
    check_only_pack_files(out).map_err(refuse)?;
    if !out.join(MANIFEST).is_file() {
        return Err(refuse(format!("has no {MANIFEST}")));
    }
    Manifest::read(out).map_err(|e| refuse(format!("has no valid sluice manifest ({e})")))?;
    Ok(())
}

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
    Ok(Description::open(src)?.layout.trunk_bytes())
}

/// Packs the trunk of the Hugging Face checkpoint `src` into the directory `out`.
///
/// Refuses when `out` exists (unless `force` and `out` is a pack sluice wrote: it is then
/// replaced only once the new pack is complete), when `out` lies inside `src` (nothing is ever
/// written into a model directory) or `src` inside `out` (symlinks and `..` resolved), and when
/// the source does not validate. A failed pack removes its partial directory.
/// `progress(done, total)` is called as bytes are copied.
pub fn pack(
    src: &Path,
    out: &Path,
    force: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PackReport, Error> {
    let t0 = Instant::now();
    if crate::is_model_path(src) && !src.is_dir() {
        return Err(Error::Usage(format!(
            "{}: a GGUF file is run in place (pack takes a safetensors checkpoint directory)",
            src.display()
        )));
    }
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
    // Where OUT really is: an existing OUT (or a symlink) resolved, else its resolved parent.
    let exists = out.symlink_metadata().is_ok();
    let out_real = if exists {
        out.canonicalize().map_err(io(&out))?
    } else {
        out.clone()
    };
    if out_real.starts_with(&src) {
        return Err(Error::Usage(format!(
            "{}: the pack must not go inside the model directory {}",
            out.display(),
            src.display()
        )));
    }
    if src.starts_with(&out_real) {
        return Err(Error::Usage(format!(
            "the model directory {} lies inside the output {}; choose an output outside it",
            src.display(),
            out.display()
        )));
    }
    if exists {
        if !force {
            return Err(Error::Usage(format!(
                "{} exists; pass --force to replace it",
                out.display()
            )));
        }
        check_pack_written_by_sluice(&out)?;
    }
    let tmp = out_parent.join(format!(".{}.sluice-partial", name.to_string_lossy()));
    let old = out_parent.join(format!(".{}.sluice-old", name.to_string_lossy()));
    for leftover in [&tmp, &old] {
        if leftover.symlink_metadata().is_ok() {
            check_only_pack_files(leftover).map_err(|why| {
                Error::Usage(format!(
                    "{} exists and {why}; it is not a leftover of sluice pack, so it is not removed",
                    leftover.display()
                ))
            })?;
        }
    }

    // Validate the source completely before writing anything.
    let Description {
        checkpoint: ck,
        config: _,
        layout,
    } = Description::open(&src)?;
    if let Some(g) = ck.gguf() {
        // A pack copies safetensors tensors as they are stored; a GGUF's are block-quantized
        // under llama.cpp's names and run from the file itself.
        return Err(Error::Usage(format!(
            "{} holds a GGUF model ({}); a GGUF file is run in place (pack takes a safetensors checkpoint directory)",
            src.display(),
            g.header().path.display()
        )));
    }
    let total = layout.trunk_bytes();

    if tmp.exists() {
        // A pack interrupted before it could clean up (checked above: only files pack writes).
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io(&tmp))?;
    // From here on any error (disk full, a failed read) removes the partial pack again.
    let mut partial = Partial(Some(tmp.clone()));
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
    if out.symlink_metadata().is_ok() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(io(&old))?;
        }
        std::fs::rename(&out, &old).map_err(io(&out))?;
        if let Err(e) = std::fs::rename(&tmp, &out) {
            // Put the old pack back rather than leave nothing at OUT.
            let _ = std::fs::rename(&old, &out);
            return Err(io(&out)(e));
        }
        partial.0 = None;
        std::fs::remove_dir_all(&old).map_err(io(&old))?;
    } else {
        std::fs::rename(&tmp, &out).map_err(io(&out))?;
        partial.0 = None;
    }
    Ok(PackReport {
        out,
        trunk_bytes: total,
        parts: manifest.parts.len(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}
