//! Issue 59, the third reliability pass, as processes: what the commands do with a closed pipe,
//! hostile flags, GGUF sessions, session links, damaged files, big ids and a memory cgroup.
//! Each test failed before its fix.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit 2 and one `error: ` line (no panic); the line.
fn one_line_error(o: &Output) -> String {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.starts_with("error: "), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    assert!(!e.contains("panicked"), "{e}");
    e
}

fn gguf_model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/gguf/models")
        .join(name)
        .join("model.gguf")
}

/// A private directory holding `model.gguf`, a copy of the fixture `name`.
fn gguf_dir(name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(gguf_model(name), d.path().join("model.gguf")).unwrap();
    d
}

fn run_ids(model: &Path, extra: &[&str]) -> Output {
    bin()
        .args(["run", "--model"])
        .arg(model)
        .args(["--prompt-ids", "1,2,3", "--max-tokens", "3", "--json"])
        .args(extra)
        .output()
        .unwrap()
}

fn ids(o: &Output) -> Vec<u64> {
    assert!(o.status.success(), "{}", stderr(o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// `inspect | head -1` used to panic on the closed pipe (exit 101, a backtrace).
#[test]
fn a_closed_stdout_ends_quietly() {
    for json in [false, true] {
        let mut c = bin();
        c.arg("inspect").arg(common::demo());
        if json {
            c.arg("--json");
        }
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before anything is written.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}

/// The top-level help named six of the nine commands.
#[test]
fn the_help_names_every_command() {
    let o = bin().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let first = text.lines().next().unwrap();
    let commands: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 9, "{text}");
    for c in commands {
        assert!(first.contains(c), "`{c}` missing from {first:?}");
    }
}

/// Runs a one-rung bench of the demo model with `TMPDIR` set to `tmp`, after putting `plant`
/// where the old code made its directory (`$TMPDIR/sluice-bench-<pid>`) once the child's pid is
/// known: the child measures for a while before it makes a directory.
fn bench_with_tmpdir(tmp: &Path, plant: impl FnOnce(&Path)) {
    let child = bin()
        .env("TMPDIR", tmp)
        .args(["bench", "--model"])
        .arg(common::demo())
        .args([
            "--ladder",
            "unlimited",
            "--policies",
            "lfu",
            "--prefetch",
            "on",
            "--prompt-tokens",
            "4",
            "--max-tokens",
            "2",
            "--disk-seconds",
            "0.3",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    plant(&tmp.join(format!("sluice-bench-{}", child.id())));
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `bench` used `$TMPDIR/sluice-bench-<pid>` and removed it whole at the end: a directory of
/// the user's at that path was deleted, and a symlink there sent its trace elsewhere.
#[test]
fn bench_never_touches_a_directory_it_did_not_make() {
    let tmp = tempfile::tempdir().unwrap();
    let mut mine = PathBuf::new();
    bench_with_tmpdir(tmp.path(), |p| {
        std::fs::create_dir(p).unwrap();
        std::fs::write(p.join("keep.txt"), "the user's").unwrap();
        mine = p.to_path_buf();
    });
    assert_eq!(
        std::fs::read_to_string(mine.join("keep.txt")).unwrap(),
        "the user's"
    );
    // Nothing of bench's own is left.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);

    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    bench_with_tmpdir(tmp.path(), |p| {
        std::os::unix::fs::symlink(elsewhere.path(), p).unwrap();
    });
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}

/// Bad bench flags were found by the first child run, after minutes of measuring (or, for
/// `--threads 100000`, aborted the process with a backtrace).
#[test]
fn bench_flags_are_checked_before_measuring() {
    for (flag, value, says) in [
        ("--threads", "100000", "100000"),
        ("--threads", "0", "--threads 0"),
        ("--temperature", "nan", "--temperature"),
        ("--temperature", "-1", "--temperature"),
        ("--disk-seconds", "inf", "--disk-seconds"),
        ("--max-tokens", "1000000000000", "--max-tokens"),
        ("--ladder", "-5%", "-5%"),
    ] {
        let t0 = Instant::now();
        let o = bin()
            .args(["bench", "--model"])
            .arg(common::demo())
            .arg(format!("{flag}={value}"))
            .output()
            .unwrap();
        let e = one_line_error(&o);
        assert!(e.contains(says), "{flag} {value}: {e}");
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{flag}: measured first"
        );
    }
}

/// `doctor --seconds nan` never finished; bad `--blocks` failed after writing the scratch file;
/// SIGTERM left the 2 GiB scratch file behind.
#[test]
fn doctor_refuses_bad_flags_first_and_leaves_nothing_behind() {
    let d = tempfile::tempdir().unwrap();
    for args in [
        &["--seconds", "nan"][..],
        &["--seconds", "inf"],
        &["--seconds", "1e30"],
        &["--seconds", "0"],
        &["--blocks", "3GiB", "--file-size", "16MiB"],
        &["--depths", "0"],
    ] {
        let o = bin()
            .arg("doctor")
            .arg("--dir")
            .arg(d.path())
            .args(args)
            .output()
            .unwrap();
        one_line_error(&o);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "{args:?}");
    }
    let mut child = bin()
        .arg("doctor")
        .arg("--dir")
        .arg(d.path())
        .args(["--file-size", "1GiB", "--no-uring"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed while the scratch file is written or read.
    let mut err = child.stderr.take().unwrap();
    let mut seen = String::new();
    let t0 = Instant::now();
    while !seen.contains("writing the scratch file") && t0.elapsed() < Duration::from_secs(60) {
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut err, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.contains("writing the scratch file"), "{seen}");
    std::thread::sleep(Duration::from_millis(300));
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
}

/// `--session` with a GGUF model ran and then failed to save ("Not a directory"); a session
/// written with one GGUF in a directory was resumed by another GGUF there.
#[test]
fn gguf_sessions_save_resume_and_refuse_another_model() {
    let s = tempfile::tempdir().unwrap();
    let session = s.path().join("s.bin");
    let file = gguf_model("qwen3_moe-q5_k_m");
    let cold = ids(&run_ids(&file, &[]));
    let first = run_ids(&file, &["--session", session.to_str().unwrap()]);
    assert_eq!(ids(&first), cold);
    assert!(session.is_file());
    // Resumed: the saved context and more give what a cold run of it gives.
    let longer = |session: Option<&Path>| {
        let mut c = bin();
        c.args(["run", "--model"]).arg(&file).args([
            "--prompt-ids",
            "1,2,3,5",
            "--max-tokens",
            "2",
            "--json",
        ]);
        if let Some(s) = session {
            c.arg("--session").arg(s);
        }
        c.output().unwrap()
    };
    assert_eq!(ids(&longer(Some(&session))), ids(&longer(None)));

    // Two directories holding different GGUF models.
    let a = gguf_dir("qwen3_moe-q5_k_m");
    let b = gguf_dir("qwen3-iq4_xs");
    let sa = s.path().join("a.bin");
    assert!(
        run_ids(a.path(), &["--session", sa.to_str().unwrap()])
            .status
            .success()
    );
    let bytes = std::fs::read(&sa).unwrap();
    let o = run_ids(b.path(), &["--session", sa.to_str().unwrap()]);
    let e = one_line_error(&o);
    assert!(e.contains("another model"), "{e}");
    assert_eq!(
        std::fs::read(&sa).unwrap(),
        bytes,
        "the session was changed"
    );
}

/// A save replaced a symlinked session with a file, and turned a 0644 file into 0600.
#[test]
fn a_session_save_keeps_links_and_modes() {
    let d = tempfile::tempdir().unwrap();
    let real = d.path().join("real.bin");
    let link = d.path().join("link.bin");
    let demo = common::demo();
    let o = run_ids(&demo, &["--session", real.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink("real.bin", &link).unwrap();
    let before = std::fs::read(&real).unwrap();
    let o = bin()
        .args(["run", "--model"])
        .arg(&demo)
        .args(["--prompt-ids", "1,2,3,9", "--max-tokens", "2", "--json"])
        .args(["--session", link.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let m = std::fs::symlink_metadata(&link).unwrap();
    assert!(m.file_type().is_symlink(), "the link became a file");
    assert_ne!(
        std::fs::read(&real).unwrap(),
        before,
        "the target was not saved"
    );
    let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    // Nothing else was left beside it.
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
}

/// A session whose saved KV cache holds a NaN blamed the checkpoint ("layer 0 produced NaN or
/// infinite values: the checkpoint's weights ... are corrupt").
#[test]
fn a_session_with_a_nan_names_the_session_file() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("s.bin");
    let demo = common::demo();
    assert!(
        run_ids(&demo, &["--session", p.to_str().unwrap()])
            .status
            .success()
    );
    let mut b = std::fs::read(&p).unwrap();
    // magic, version, fingerprint; the tokens; the state's length; its position and layer
    // count; layer 0's kind, buffer count and first buffer's length: then its first value.
    let le = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    let tokens = le(&b, 36);
    let state = 36 + 8 + 4 * tokens + 8;
    let first = state + 8 + 4 + 1 + 4 + 8;
    b[first..first + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let body = b.len() - 8;
    let sum = xxhash_rust::xxh3::xxh3_64(&b[..body]);
    b[body..].copy_from_slice(&sum.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let o = run_ids(&demo, &["--session", p.to_str().unwrap()]);
    let e = one_line_error(&o);
    assert!(e.contains("s.bin") && e.contains("NaN"), "{e}");
    assert!(!e.contains("checkpoint"), "{e}");
}

/// A GGUF whose tensor shape disagrees with its metadata exited 1, as a failure while running.
#[test]
fn a_gguf_shape_against_its_metadata_is_exit_2() {
    let d = gguf_dir("llama-q8_0");
    let p = d.path().join("model.gguf");
    let mut b = std::fs::read(&p).unwrap();
    // The key, then its type (uint32 = 4) and value: 256 becomes 512.
    let key = b"llama.feed_forward_length";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    assert_eq!(u32::from_le_bytes(b[at..at + 4].try_into().unwrap()), 4);
    assert_eq!(
        u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap()),
        256
    );
    b[at + 4..at + 8].copy_from_slice(&512u32.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let e = one_line_error(&run_ids(&p, &[]));
    assert!(e.contains("ffn_gate") && e.contains("model.gguf"), "{e}");
}

/// `pack` of a directory holding a GGUF reported success and wrote a pack that could not run.
#[test]
fn pack_refuses_a_directory_holding_a_gguf() {
    let src = gguf_dir("llama-q8_0");
    let out = tempfile::tempdir().unwrap();
    let dst = out.path().join("packed");
    let o = bin()
        .arg("pack")
        .arg(src.path())
        .arg(&dst)
        .output()
        .unwrap();
    let e = one_line_error(&o);
    assert!(e.contains("GGUF"), "{e}");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

/// A damaged MTP layer refused the whole model, though it is loaded only with `--draft mtp`.
#[test]
fn a_damaged_mtp_layer_is_a_warning_unless_drafting_with_it() {
    let demo = common::demo();
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&demo).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "mtp.safetensors" {
            std::os::unix::fs::symlink(e.path(), d.path().join(e.file_name())).unwrap();
        }
    }
    // The same bytes under a header that gives `eh_proj` its dimensions swapped.
    let mut b = std::fs::read(demo.join("mtp.safetensors")).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(b[8..8 + n].to_vec()).unwrap();
    let at = header.find("\"model.layers.6.eh_proj.weight\"").unwrap();
    let shape = at + header[at..].find("[256,512]").unwrap();
    b[8 + shape..8 + shape + 9].copy_from_slice(b"[512,256]");
    std::fs::write(d.path().join("mtp.safetensors"), &b).unwrap();

    let healthy = run_ids(&demo, &[]);
    let o = run_ids(d.path(), &[]);
    assert_eq!(ids(&o), ids(&healthy));
    let e = stderr(&o);
    assert!(e.starts_with("warning: ") && e.contains("eh_proj"), "{e}");
    let e = one_line_error(&run_ids(d.path(), &["--draft", "mtp"]));
    assert!(e.contains("eh_proj"), "{e}");
}

/// Batch ids past a float's exact range were rewritten (`1.1805916207174113e21`), so the
/// result never matched its job and every run redid it.
#[test]
fn batch_ids_come_back_as_written() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let output = d.path().join("out.jsonl");
    std::fs::write(
        &input,
        "{\"id\": 1180591620717411303424, \"prompt\": \"Hello\", \"max_tokens\": 2}\n\
         {\"id\": 1180591620717411303425, \"prompt\": \"Hi\", \"max_tokens\": 2}\n",
    )
    .unwrap();
    let batch = || {
        bin()
            .args(["batch", "--model"])
            .arg(common::demo())
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(&output)
            .output()
            .unwrap()
    };
    let o = batch();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = std::fs::read_to_string(&output).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("{\"id\":1180591620717411303424,"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("{\"id\":1180591620717411303425,"),
        "{out}"
    );
    // A second run finds both done.
    let o = batch();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("2 ids already done"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&output).unwrap(), out);
}

/// A 20 KB control token took 25 s to load, a 60 MB one over 6 GB.
#[test]
fn an_overlong_added_token_is_refused_before_building() {
    let demo = common::demo();
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&demo).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "tokenizer.json" {
            std::os::unix::fs::symlink(e.path(), d.path().join(e.file_name())).unwrap();
        }
    }
    let mut t: serde_json::Value =
        serde_json::from_slice(&std::fs::read(demo.join("tokenizer.json")).unwrap()).unwrap();
    t["added_tokens"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "id": 4095, "content": format!("<{}>", "x".repeat(200_000)), "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true
        }));
    std::fs::write(d.path().join("tokenizer.json"), t.to_string()).unwrap();
    let t0 = Instant::now();
    let o = bin()
        .args(["run", "--model"])
        .arg(d.path())
        .args(["Hello", "--max-tokens", "1"])
        .output()
        .unwrap();
    let e = one_line_error(&o);
    assert!(
        e.contains("tokenizer.json") && e.contains("added token 4095") && e.contains("1024"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
}

/// `--memory auto` planned from the host's MemAvailable: in a container limited to 200 MiB on a
/// 24 GB host it planned 20 GiB and was killed. Run in a real memory cgroup (v1 or v2), which
/// needs root: without one the test says so.
#[test]
fn memory_auto_plans_within_the_memory_cgroup() {
    let Some(cg) = Cgroup::new(200 << 20) else {
        eprintln!(
            "SKIPPED memory_auto_plans_within_the_memory_cgroup: cannot make a memory cgroup here (needs root and a cgroup v1 or v2 memory controller)"
        );
        return;
    };
    let script = format!(
        "echo $$ > {} && exec \"$0\" inspect \"$1\" --memory auto --json",
        cg.procs.display()
    );
    let o = Command::new("sh")
        .args(["-c", &script, env!("CARGO_BIN_EXE_sluice")])
        .arg(common::demo())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let budget = v["plan"]["budget"].as_u64().unwrap();
    assert!(budget > 0 && budget <= 200 << 20, "planned {budget} bytes");
    let o = bin()
        .arg("inspect")
        .arg(common::demo())
        .args(["--memory", "auto", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let outside = v["plan"]["budget"].as_u64().unwrap();
    assert!(
        outside > budget,
        "{outside} outside the cgroup, {budget} in it"
    );
}

/// A child memory cgroup of this process's own, limited to `limit` bytes, removed when dropped.
struct Cgroup {
    dir: PathBuf,
    procs: PathBuf,
}

impl Cgroup {
    fn new(limit: u64) -> Option<Cgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        // v1: "N:memory:/path" under the memory controller's mount; v2: "0::/path".
        let mut found = None;
        for line in own.lines() {
            let mut f = line.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            let path = path.trim_start_matches('/');
            if controllers.split(',').any(|c| c == "memory") {
                found = Some((
                    Path::new("/sys/fs/cgroup/memory").join(path),
                    "memory.limit_in_bytes",
                ));
                break;
            }
            if controllers.is_empty() {
                found = Some((Path::new("/sys/fs/cgroup").join(path), "memory.max"));
            }
        }
        let (base, file) = found?;
        let dir = base.join(format!("sluice-test-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let cg = Cgroup {
            procs: dir.join("cgroup.procs"),
            dir,
        };
        std::fs::write(cg.dir.join(file), limit.to_string()).ok()?;
        Some(cg)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Its process has exited; an empty cgroup is removed with rmdir.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The demo model with `template` as its `chat_template.jinja`.
fn with_template(template: &str) -> tempfile::TempDir {
    let demo = common::demo();
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&demo).unwrap() {
        let e = e.unwrap();
        std::os::unix::fs::symlink(e.path(), d.path().join(e.file_name())).unwrap();
    }
    std::fs::write(d.path().join("chat_template.jinja"), template).unwrap();
    d
}

/// Hostile templates of issue 59: a loop that never ends, a string doubled until the process
/// aborted (6 GB, then SIGABRT), 56 MB of output at `--memory 16MiB`.
const HOSTILE_TEMPLATES: [&str; 3] = [
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{% for i in range(100000) %}{{ messages[0].content * 200 }}{% endfor %}",
];

#[test]
fn hostile_chat_templates_are_refused_in_one_line() {
    for t in HOSTILE_TEMPLATES {
        let d = with_template(t);
        let t0 = Instant::now();
        let o = bin()
            .args(["run", "--model"])
            .arg(d.path())
            .args(["Hello there", "--max-tokens", "2", "--memory", "16MiB"])
            .output()
            .unwrap();
        let e = one_line_error(&o);
        assert!(e.contains("chat_template.jinja"), "{t}: {e}");
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{t}: {:?}",
            t0.elapsed()
        );
    }
}

/// In `serve`, two such requests stopped `/health` from answering and Ctrl-C from stopping it.
#[test]
fn serve_stays_responsive_under_hostile_templates_and_stops_on_ctrl_c() {
    let d = with_template(HOSTILE_TEMPLATES[0]);
    let mut s = common::start(d.path(), &[]);
    let port = s.port;
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    let t0 = Instant::now();
    let clients: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let (status, text) = common::post_to(port, "/v1/chat/completions", body);
                (status, text, t0.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(common::health(&s)["status"], "ok");
    let answered = t0.elapsed();
    for c in clients {
        let (status, text, done) = c.join().unwrap();
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("fuel"), "{text}");
        assert!(
            answered < done,
            "/health at {answered:?}, a render ended at {done:?}"
        );
    }
    // Ctrl-C stops it.
    Command::new("kill")
        .args(["-INT", &s.child.id().to_string()])
        .status()
        .unwrap();
    let t0 = Instant::now();
    loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "Ctrl-C did not stop the server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
