//! Scratch directories shared by the tests of one test binary.
//!
//! A `TempDir` kept in a `static` is never dropped (Rust runs no destructors for statics), so
//! every run of a binary that kept one left its directory behind: hundreds of megabytes of
//! synthetic model per run, until the disk filled. These directories are removed when the
//! binary exits (an `atexit` handler, which runs whether the tests pass or fail), and the
//! directories of a run that was killed are removed by the next run: each name carries the
//! process id that made it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;

static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> i32;
}

extern "C" fn remove_all() {
    if let Ok(dirs) = DIRS.lock() {
        for d in dirs.iter() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A new directory `<root>/<prefix><pid>-<random>`, removed when this process exits.
pub fn shared_dir(root: &Path, prefix: &str) -> PathBuf {
    sweep(root, prefix);
    let dir = tempfile::Builder::new()
        .prefix(&format!("{prefix}{}-", std::process::id()))
        .tempdir_in(root)
        .unwrap()
        .keep();
    let mut dirs = DIRS.lock().unwrap();
    if dirs.is_empty() {
        // SAFETY: `remove_all` is a plain `extern "C" fn()` that lives as long as the process.
        let rc = unsafe { atexit(remove_all) };
        assert_eq!(rc, 0, "atexit refused the scratch cleanup");
    }
    dirs.push(dir.clone());
    dir
}

/// Removes `<root>/<prefix><pid>-*` left by processes that no longer run.
fn sweep(root: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
