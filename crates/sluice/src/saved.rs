//! Sessions on disk: a session's tokens and its state (KV cache — MLA's latent form as it is
//! cached — and recurrent state), so that a later run resumes where it stopped.
//!
//! The file, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 16 | magic `SLUICE-SESSION\0\0` |
//! | 4 | format version (2) |
//! | 16 | the model's fingerprint ([`fingerprint`]) |
//! | 1 | the numeric mode the state was computed in (0 exact, 1 int8; absent in format 1, whose files are exact) |
//! | 8 + 4n | the number of tokens, then the tokens |
//! | 8 + m | the length of the state, then the state (`sluice_model::State::to_bytes`) |
//! | 8 + k | the length of the caller's extra bytes (a chat's messages as JSON), then them |
//! | 8 | XXH3-64 of everything before it |
//!
//! It is written to a temporary file beside the target and renamed over it, so a reader sees
//! the old file or the new one, never half of one. A file that is not one, is of another
//! version, another model or another numeric mode, is cut short or fails its checksum is
//! refused with one line naming it, and never used.

use std::io::Write;
use std::path::Path;

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::Error;

const MAGIC: &[u8; 16] = b"SLUICE-SESSION\0\0";
const VERSION: u32 = 2;

/// The most bytes of a safetensors header hashed for the fingerprint.
const MAX_HEADER: u64 = 100 << 20;

/// The model's identity, from what it is made of whatever its format: for a checkpoint
/// directory its `config.json`, a pack's manifest, and every safetensors shard's name, size and
/// header (the tensor names, shapes, types and offsets); for a GGUF model (a `.gguf` file, or
/// a directory holding one) every part's name, size and header (its metadata — tokenizer and
/// chat template included — and tensor infos). A session is only ever resumed on a model with
/// the same fingerprint.
pub(crate) fn fingerprint(dir: &Path) -> Result<[u8; 16], Error> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    if let Some(first) = sluice_format::gguf_in(dir)? {
        return gguf_fingerprint(&first);
    }
    let mut h = Xxh3::new();
    for name in ["config.json", sluice_format::packed::MANIFEST] {
        let p = dir.join(name);
        if p.is_file() {
            h.update(name.as_bytes());
            h.update(&std::fs::read(&p).map_err(io(&p))?);
        }
    }
    let mut shards: Vec<_> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    shards.sort();
    for p in shards {
        use std::io::Read;
        let mut f = std::fs::File::open(&p).map_err(io(&p))?;
        let size = f.metadata().map_err(io(&p))?.len();
        let mut len = [0u8; 8];
        let n = f.read(&mut len).map_err(io(&p))?;
        let header_len = if n == 8 { u64::from_le_bytes(len) } else { 0 };
        let mut header = Vec::new();
        f.take(header_len.min(MAX_HEADER))
            .read_to_end(&mut header)
            .map_err(io(&p))?;
        h.update(p.file_name().map_or(&[][..], |n| n.as_encoded_bytes()));
        h.update(&size.to_le_bytes());
        h.update(&header);
    }
    Ok(h.digest128().to_le_bytes())
}

/// [`fingerprint`] of a GGUF model whose (first) file is `first`.
fn gguf_fingerprint(first: &Path) -> Result<[u8; 16], Error> {
    use std::io::Read;
    let set = sluice_format::gguf::GgufSet::open(first)?;
    let mut h = Xxh3::new();
    h.update(b"gguf");
    for part in &set.parts {
        let g = &part.header;
        let io = |source| Error::Io {
            path: g.path.clone(),
            source,
        };
        let mut header = Vec::new();
        sluice_format::file::open_regular(&g.path)?
            .take(g.data_start)
            .read_to_end(&mut header)
            .map_err(io)?;
        h.update(g.path.file_name().map_or(&[][..], |n| n.as_encoded_bytes()));
        h.update(&g.file_len.to_le_bytes());
        h.update(&(header.len() as u64).to_le_bytes());
        h.update(&header);
    }
    Ok(h.digest128().to_le_bytes())
}

/// What a session file holds.
pub(crate) struct Saved {
    /// The numeric mode its state was computed in.
    pub(crate) numerics: sluice_kernels::Numerics,
    pub(crate) tokens: Vec<u32>,
    pub(crate) state: Vec<u8>,
    pub(crate) extra: Vec<u8>,
}

/// Writes a session file (to a temporary file beside `path`, then renamed over it).
pub(crate) fn write(path: &Path, model: &[u8; 16], s: &Saved) -> Result<(), Error> {
    let mut out = Vec::with_capacity(64 + 4 * s.tokens.len() + s.state.len() + s.extra.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(model);
    out.push(match s.numerics {
        sluice_kernels::Numerics::Exact => 0,
        sluice_kernels::Numerics::Int8 => 1,
    });
    out.extend_from_slice(&(s.tokens.len() as u64).to_le_bytes());
    for t in &s.tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&(s.state.len() as u64).to_le_bytes());
    out.extend_from_slice(&s.state);
    out.extend_from_slice(&(s.extra.len() as u64).to_le_bytes());
    out.extend_from_slice(&s.extra);
    let sum = xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    let err = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    // A symlink stays a symlink: the file it points to is the one replaced.
    let target = resolve_links(path).map_err(err)?;
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // A new file gets the usual mode (0666 less the umask); a file replaced keeps its own.
    let mut tmp = tempfile::Builder::new()
        .prefix(".sluice-session-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(err)?;
    if let Ok(m) = std::fs::metadata(&target) {
        tmp.as_file()
            .set_permissions(m.permissions())
            .map_err(err)?;
    }
    tmp.write_all(&out).map_err(err)?;
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(&target).map_err(|e| err(e.error))?;
    Ok(())
}

/// The path a write to `path` lands on: `path`, or where its symlinks (a chain of them, each
/// relative to the directory holding it) end up. A loop is an error.
fn resolve_links(path: &Path) -> std::io::Result<std::path::PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(d) if to.is_relative() => d.join(to),
                    _ => to,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(std::io::Error::other("too many levels of symbolic links"))
}

/// Reads and checks a session file for the model `model`.
pub(crate) fn read(path: &Path, model: &[u8; 16]) -> Result<Saved, Error> {
    let refuse = |why: &str| Error::Usage(format!("{}: {why}", path.display()));
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    // The magic first: a file that is not a session is not read whole.
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(io)?;
    if !f.metadata().map_err(io)?.is_file() {
        return Err(refuse("not a regular file"));
    }
    let mut bytes = Vec::new();
    (&mut f).take(16).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() < 16 || &bytes[..16] != MAGIC {
        return Err(refuse("not a sluice session file"));
    }
    f.read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() < 16 + 4 + 16 + 8 * 4 {
        return Err(refuse("the session file is cut short"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    let u64_at = |b: &[u8]| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a)
    };
    if xxh3_64(body) != u64_at(sum) {
        return Err(refuse(
            "the session file is corrupt or cut short (its checksum does not match)",
        ));
    }
    let mut r = body;
    let mut take = |n: usize| -> Result<&[u8], Error> {
        if n > r.len() {
            return Err(refuse("the session file is cut short"));
        }
        let (h, t) = r.split_at(n);
        r = t;
        Ok(h)
    };
    take(16)?;
    let version = u32::from_le_bytes(take(4)?.try_into().unwrap_or_default());
    if version != VERSION && version != 1 {
        return Err(refuse(&format!(
            "session file format {version}; this sluice reads formats 1 and {VERSION}"
        )));
    }
    let stored_model = take(16)?.to_vec();
    let numerics = match version {
        1 => sluice_kernels::Numerics::Exact,
        _ => match take(1)?[0] {
            0 => sluice_kernels::Numerics::Exact,
            1 => sluice_kernels::Numerics::Int8,
            n => {
                return Err(refuse(&format!(
                    "the session file is corrupt (numeric mode {n})"
                )));
            }
        },
    };
    let n = u64_at(take(8)?) as usize;
    let tokens: Vec<u32> = take(n.checked_mul(4).ok_or_else(|| refuse("corrupt"))?)?
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let m = u64_at(take(8)?) as usize;
    let state = take(m)?.to_vec();
    let k = u64_at(take(8)?) as usize;
    let extra = take(k)?.to_vec();
    if !r.is_empty() {
        return Err(refuse("the session file is corrupt (bytes after its end)"));
    }
    if stored_model != model[..] {
        return Err(refuse(
            "the session file was written for another model (its config or shards differ)",
        ));
    }
    Ok(Saved {
        numerics,
        tokens,
        state,
        extra,
    })
}
