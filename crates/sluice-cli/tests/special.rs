//! Special files in a model directory (issue 18, class 3): a FIFO, a device or a symlink loop
//! in place of `config.json`, `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json` or the shard used to hang (a FIFO without a writer blocks the open)
//! or read until memory ran out (`/dev/zero`). Each is now one `error:` line naming the file,
//! exit 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

/// A model directory of symlinks to the demo model's files.
fn linked() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(demo()).unwrap() {
        let p = e.unwrap().path();
        std::os::unix::fs::symlink(&p, d.path().join(p.file_name().unwrap())).unwrap();
    }
    d
}

#[test]
fn special_files_in_a_model_directory_are_refused_naming_them() {
    for file in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "model.safetensors",
    ] {
        for special in ["fifo", "/dev/zero", "loop"] {
            let d = linked();
            let p = d.path().join(file);
            std::fs::remove_file(&p).unwrap();
            match special {
                "fifo" => {
                    let ok = Command::new("mkfifo").arg(&p).status().unwrap();
                    assert!(ok.success());
                }
                "loop" => {
                    let other = d.path().join("loop.json");
                    std::os::unix::fs::symlink(&other, &p).unwrap();
                    std::os::unix::fs::symlink(&p, &other).unwrap();
                }
                dev => std::os::unix::fs::symlink(dev, &p).unwrap(),
            }
            let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
                .args(["run", "--model"])
                .arg(d.path())
                .args(["It is", "--max-tokens", "2", "--memory", "64MiB"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // Not a timing assertion: a guard so that a hang fails the test instead of
            // blocking it forever (the refusal itself takes milliseconds).
            let deadline = Instant::now() + Duration::from_secs(120);
            while child.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    child.kill().unwrap();
                    panic!("{file} as {special}: still running after 120 s (hung)");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let o = child.wait_with_output().unwrap();
            let e = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{file} as {special}: {e}");
            assert!(
                e.starts_with("error: ") && e.trim_end().lines().count() == 1,
                "{file} as {special}: {e}"
            );
            assert!(e.contains(file), "{file} as {special}: {e}");
            assert!(!e.contains("panicked"), "{e}");
        }
    }
}
