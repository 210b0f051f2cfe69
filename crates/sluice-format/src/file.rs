//! Opening the files of a model directory safely: only regular files (after following
//! symlinks), and small files read only up to a cap. A FIFO, a device such as `/dev/zero` or a
//! symlink loop in place of `config.json` or a shard is an error naming the file, not a hang or
//! a read until memory runs out.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::FormatError;

/// What kind of file `t` is, for an error message.
fn kind(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Whether a directory entry named `path` exists at all (a dangling symlink or a symlink loop
/// counts: opening it then says what is wrong, rather than the file being taken as absent).
pub fn present(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}

/// Opens `path` for reading if it is a regular file once symlinks are followed. The open
/// does not block (a FIFO without a writer would otherwise hang it); the type is checked on
/// the opened descriptor, so a file swapped after a check cannot slip through.
pub fn open_regular(path: &Path) -> Result<File, FormatError> {
    let io = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::NotFound {
            FormatError::MissingFile {
                path: path.to_path_buf(),
            }
        } else {
            FormatError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(io)?;
    let t = f.metadata().map_err(io)?.file_type();
    if !t.is_file() {
        return Err(FormatError::NotRegular {
            path: path.to_path_buf(),
            kind: kind(t),
        });
    }
    Ok(f)
}

/// Reads the whole of the regular file `path`, refusing one longer than `cap` bytes (checked
/// before reading and while reading, so a file that grows cannot get past it).
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, FormatError> {
    let f = open_regular(path)?;
    let io = |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = f.metadata().map_err(io)?.len();
    let too_large = |len: u64| FormatError::TooLarge {
        path: path.to_path_buf(),
        len,
        cap,
    };
    if len > cap {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(cap + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > cap {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_naming_them() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("config.json");
        let ok = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(ok.success());
        let e = read_capped(&fifo, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("FIFO"), "{e}");
        let e = read_capped(Path::new("/dev/zero"), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/dev/zero") && e.contains("character device"),
            "{e}"
        );
        let a = d.path().join("a.json");
        let b = d.path().join("b.json");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert!(present(&a) && !a.exists());
        let e = read_capped(&a, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("a.json"), "{e}");
        let e = open_regular(d.path()).unwrap_err().to_string();
        assert!(e.contains("directory"), "{e}");
        let big = d.path().join("big.json");
        std::fs::write(&big, vec![b' '; 100]).unwrap();
        let e = read_capped(&big, 99).unwrap_err().to_string();
        assert!(e.contains("big.json") && e.contains("100 bytes"), "{e}");
        assert_eq!(read_capped(&big, 100).unwrap().len(), 100);
    }
}
