//! Helpers shared by the CLI's integration tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// The bundled demo model.
pub fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

/// What a solo greedy `sluice run` of `prompt` (raw, `max` tokens) gives.
pub fn solo(model: &Path, prompt: &str, max: usize) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "--model"])
        .arg(model)
        .args([
            prompt,
            "--max-tokens",
            &max.to_string(),
            "--temperature",
            "0",
            "--json",
            "--raw",
        ])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["text"].as_str().unwrap().to_owned()
}

/// A scratch copy of the files of a model directory.
pub fn copy_model(src: &Path) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, d.path().join(p.file_name().unwrap())).unwrap();
    }
    d
}

/// The demo model plus a ChatML chat template, so the chat endpoint has something to render.
pub fn chat_model() -> tempfile::TempDir {
    let d = copy_model(&demo());
    let cfg = d.path().join("tokenizer_config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    c["chat_template"] = "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}".into();
    std::fs::write(&cfg, serde_json::to_vec(&c).unwrap()).unwrap();
    d
}

/// The demo model with a template that renders `tools` and calls in the Hermes syntax.
pub fn tool_model() -> tempfile::TempDir {
    let d = chat_model();
    let cfg = d.path().join("tokenizer_config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    c["chat_template"] = concat!(
        "{% if tools %}<|system|>\nTools: {{ tools | tojson }}\n{% endif %}",
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}",
        "{% if m.tool_calls %}{% for t in m.tool_calls %}<tool_call>{{ t.function | tojson }}</tool_call>{% endfor %}{% endif %}\n",
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    .into();
    std::fs::write(&cfg, serde_json::to_vec(&c).unwrap()).unwrap();
    d
}

pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(model: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "serve",
            "--model",
            model.to_str().unwrap(),
            "--port",
            "0",
            "--threads",
            "2",
        ])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let port = line
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
    });
    Server { child, port }
}

pub fn url(s: &Server, path: &str) -> String {
    format!("http://127.0.0.1:{}{path}", s.port)
}

/// POSTs JSON; returns (status, body).
pub fn post(s: &Server, path: &str, body: &str) -> (u16, String) {
    post_to(s.port, path, body)
}

/// POSTs JSON to the server on `port` (from any thread); returns (status, body).
pub fn post_to(port: u16, path: &str, body: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent
        .post(&format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/json")
        .send(body)
        .unwrap();
    let status = r.status().as_u16();
    (status, r.body_mut().read_to_string().unwrap())
}

/// The `data:` payloads of a server-sent-event body.
pub fn events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// `GET /health`, its JSON.
pub fn health(s: &Server) -> Value {
    ureq::Agent::new_with_defaults()
        .get(&url(s, "/health"))
        .call()
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap()
}

/// Runs the Python client `tests/clients/SCRIPT` against a server on the tool model (started
/// with `server_args`; the script's arguments from `argv`), when a Python with `modules` is at
/// hand: `SLUICE_PYTHON`, else `python3`. Without one the test says so on stderr and checks
/// nothing more (the HTTP tests are the floor) — unless `SLUICE_REQUIRE_CLIENTS` is set, as
/// `.ci/run` sets it, when that is a failure.
pub fn python_client(
    test: &str,
    script: &str,
    modules: &str,
    server_args: &[&str],
    argv: impl Fn(&Server) -> Vec<String>,
) {
    let python = std::env::var("SLUICE_PYTHON").unwrap_or_else(|_| "python3".into());
    let has = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        assert!(
            std::env::var_os("SLUICE_REQUIRE_CLIENTS").is_none(),
            "{test}: `{python}` cannot import {modules}, and SLUICE_REQUIRE_CLIENTS is set"
        );
        eprintln!("SKIPPED {test}: `{python}` cannot import {modules} (set SLUICE_PYTHON)");
        return;
    }
    let d = tool_model();
    let s = start(d.path(), server_args);
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/clients")
        .join(script);
    let out = Command::new(&python)
        .arg(script)
        .args(argv(&s))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "{text}");
}
