//! `sluice pack` as a process: a pack that fails part way (the disk full) exits non-zero and
//! leaves neither the output nor its `.NAME.sluice-partial` directory behind.

use std::path::Path;
use std::process::Command;

/// Issue 18 class 1: a failed pack used to leave `.NAME.sluice-partial` behind. The file-size
/// limit (`ulimit -f`, with SIGXFSZ ignored so writes fail with EFBIG as on a full disk) stops
/// the trunk file after 64 KiB.
#[test]
fn a_pack_that_runs_out_of_space_leaves_nothing_behind() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/deepseek_v3-fp32");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p");
    let o = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 128; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args(["pack", src.to_str().unwrap(), out.to_str().unwrap()])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.starts_with("error: ") && e.contains("trunk.bin"), "{e}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
