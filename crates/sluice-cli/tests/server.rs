//! `sluice serve` driven by a real HTTP client: non-streaming and streaming completions and chat
//! completions, malformed requests, a disconnect mid-stream, and concurrent requests that batch
//! together yet each get exactly what a solo run gives.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

mod common;
use common::{
    Server, chat_model, copy_model, demo, events, health, post, python_client, solo, start,
    tool_model, url,
};
use serde_json::{Value, json};

#[test]
fn completions_stream_and_not() {
    let s = start(&demo(), &[]);
    let agent = ureq::Agent::new_with_defaults();
    let h: Value = agent
        .get(&url(&s, "/health"))
        .call()
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["active"], 0);
    let m: Value = agent
        .get(&url(&s, "/v1/models"))
        .call()
        .unwrap()
        .body_mut()
        .read_json()
        .unwrap();
    assert_eq!(m["data"][0]["id"], "demo");

    let want = solo(&demo(), "It is a truth universally acknowledged", 16);
    let (st, body) = post(
        &s,
        "/v1/completions",
        r#"{"model":"demo","prompt":"It is a truth universally acknowledged","max_tokens":16,"temperature":0}"#,
    );
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["text"], want.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 16);

    let (st, body) = post(
        &s,
        "/v1/completions",
        r#"{"prompt":"It is a truth universally acknowledged","max_tokens":16,"temperature":0,"stream":true}"#,
    );
    assert_eq!(st, 200);
    let ev = events(&body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let text: String = ev[..ev.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(text, want);
}

#[test]
fn chat_completions_with_a_template() {
    let d = chat_model();
    let s = start(d.path(), &[]);
    let req = json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me of Elizabeth."}], "max_tokens": 12, "temperature": 0});
    let (st, body) = post(&s, "/v1/chat/completions", &req.to_string());
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let full = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(!full.is_empty());

    let mut req = req;
    req["stream"] = true.into();
    let (st, body) = post(&s, "/v1/chat/completions", &req.to_string());
    assert_eq!(st, 200);
    let ev = events(&body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, full);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[test]
fn malformed_requests_get_clear_4xx() {
    let s = start(&demo(), &["--max-tokens-limit", "64", "--max-body", "2000"]);
    for (body, path, want) in [
        ("{not json", "/v1/completions", 400),
        (r#"{"prompt":"x","frobnicate":1}"#, "/v1/completions", 400),
        (
            r#"{"prompt":"x","max_tokens":100000}"#,
            "/v1/completions",
            400,
        ),
        (r#"{"prompt":"x","top_p":7}"#, "/v1/completions", 400),
        (r#"{"prompt":"x","n":0}"#, "/v1/completions", 400),
        (r#"{"prompt":"x","n":17}"#, "/v1/completions", 400),
        (r#"{"prompt":"x","model":"gpt-9"}"#, "/v1/completions", 404),
        (r#"{"prompt":["a","b"]}"#, "/v1/completions", 400),
        (r#"{"messages":[]}"#, "/v1/chat/completions", 400),
        (
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
            "/v1/chat/completions",
            400,
        ),
    ] {
        let (st, b) = post(&s, path, body);
        assert_eq!(st, want, "{body}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap_or_else(|_| panic!("{body}: not JSON: {b}"));
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{b}"
        );
    }
    // Issue 18 class 7: a 413 is an OpenAI-style JSON error too (it was plain text).
    let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(5000));
    let (st, b) = post(&s, "/v1/completions", &big);
    assert_eq!(st, 413, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap_or_else(|_| panic!("413 not JSON: {b}"));
    assert_eq!(v["error"]["type"], "invalid_request_error", "{b}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("2000"),
        "{b}"
    );
    // The server is fine afterwards.
    assert_eq!(
        post(
            &s,
            "/v1/completions",
            r#"{"prompt":"The weather","max_tokens":3}"#
        )
        .0,
        200
    );
}

#[test]
fn a_disconnect_mid_stream_frees_the_slot() {
    // One slot: the next request can only run once the abandoned one has left.
    let s = start(&demo(), &["--batch-size", "1"]);
    let body = r#"{"prompt":"It is a truth universally acknowledged","max_tokens":480,"stream":true,"temperature":0.8}"#;
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut buf = [0u8; 2048];
    let mut got = Vec::new();
    // The headers and a few events.
    while got.len() < 600 {
        let n = c.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    drop(c);
    // The server notices at its next write and drops the sequence: it is counted as
    // cancelled, not finished.
    let agent = ureq::Agent::new_with_defaults();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let h = loop {
        let h: Value = agent
            .get(&url(&s, "/health"))
            .call()
            .unwrap()
            .body_mut()
            .read_json()
            .unwrap();
        if (h["cancelled"] == 1 && h["active"] == 0) || h["finished"] != 0 {
            break h;
        }
        assert!(std::time::Instant::now() < deadline, "no cancellation: {h}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(h["cancelled"], 1, "{h}");
    assert_eq!(h["finished"], 0, "{h}");
    assert_eq!(h["active"], 0, "{h}");
    // The slot is free for the next request.
    let (st, b) = post(
        &s,
        "/v1/completions",
        r#"{"prompt":"The weather","max_tokens":5,"temperature":0}"#,
    );
    assert_eq!(st, 200, "{b}");
}

/// The greedy completions of `prompts` (`max` tokens each), all requested at once.
fn concurrent_completions(s: &Server, prompts: &[&str], max: usize) -> Vec<String> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                sc.spawn(move || {
                    let (st, b) = post(
                        s,
                        "/v1/completions",
                        &json!({"prompt": p, "max_tokens": max, "temperature": 0}).to_string(),
                    );
                    assert_eq!(st, 200, "{b}");
                    serde_json::from_str::<Value>(&b).unwrap()["choices"][0]["text"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn concurrent_requests_each_get_their_solo_output() {
    let s = start(&demo(), &["--batch-size", "4"]);
    let prompts = [
        "The weather",
        "Mr. Darcy said",
        "In the morning",
        "It is a truth",
    ];
    let want: Vec<String> = prompts.iter().map(|p| solo(&demo(), p, 20)).collect();
    let got = concurrent_completions(&s, &prompts, 20);
    assert_eq!(got, want);
}

/// `serve` on a GGUF file (the demo converted by llama.cpp, Q4_K_M), its vocabulary read from the
/// file, under a budget that streams from it: concurrent requests each get what a solo `run` of
/// the file gives.
#[test]
fn serve_takes_a_gguf_file_streaming_from_it() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/gguf_converted/demo-q4_k_m.gguf");
    let s = start(&gguf, &["--batch-size", "3", "--memory", "16MiB"]);
    let prompts = ["The weather", "Mr. Darcy said", "It is a truth"];
    let want: Vec<String> = prompts.iter().map(|p| solo(&gguf, p, 20)).collect();
    let got = concurrent_completions(&s, &prompts, 20);
    assert_eq!(got, want);
    assert!(want.iter().all(|t| !t.is_empty()), "{want:?}");
}

/// POSTs `body` with the given Content-Type (or none); returns (status, body).
fn post_typed(s: &Server, path: &str, content_type: Option<&str>, body: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent.post(&url(s, path));
    if let Some(t) = content_type {
        r = r.header("content-type", t);
    }
    let mut r = r.send(body).unwrap();
    let status = r.status().as_u16();
    (status, r.body_mut().read_to_string().unwrap())
}

/// Issue 18 class 7: only `application/json` bodies are taken (a web page in the user's
/// browser can POST a form or `text/plain` to a local server without asking; it must not be
/// able to make it generate), and ids outside the vocabulary count as rejected, not failed.
#[test]
fn non_json_content_types_are_refused_and_bad_ids_are_rejected_not_failed() {
    let s = start(&demo(), &[]);
    let body = r#"{"prompt":"The weather","max_tokens":2}"#;
    for t in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
    ] {
        let (st, b) = post_typed(&s, "/v1/completions", t, body);
        assert_eq!(st, 415, "{t:?}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("application/json")
        );
    }
    for t in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
    ] {
        assert_eq!(
            post_typed(&s, "/v1/completions", Some(t), body).0,
            200,
            "{t}"
        );
    }
    let (st, b) = post(
        &s,
        "/v1/completions",
        r#"{"prompt":[5, 99999999],"max_tokens":2}"#,
    );
    assert_eq!(st, 400, "{b}");
    assert!(b.contains("vocabulary"), "{b}");
    let h = health(&s);
    assert_eq!(h["rejected"], 1, "{h}");
    assert_eq!(h["failed"], 0, "{h}");
    assert_eq!(h["finished"], 3, "{h}");
}

/// Reads from `c` until the server closes it; returns what it sent. The socket's read timeout
/// is a guard so that a server that never closes fails the test instead of hanging it.
fn read_until_closed(c: &mut TcpStream) -> String {
    c.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server kept the connection open: {e} (got {got:?})"),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Issue 18 class 7: a client that sends half a request used to hold its connection forever
/// and block Ctrl-C. Half-sent headers are closed after `--read-timeout`, a half-sent body
/// gets a 408 JSON error, and Ctrl-C stops the server with idle and half-read connections open.
#[test]
fn half_sent_requests_time_out_and_ctrl_c_drops_them() {
    let s = start(&demo(), &["--read-timeout", "1"]);
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n").unwrap();
    read_until_closed(&mut c);
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\nConnection: close\r\n\r\n{{\"prompt\":"
    )
    .unwrap();
    let got = read_until_closed(&mut c);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("invalid_request_error"), "{got}");
    // Still serving.
    assert_eq!(health(&s)["status"], "ok");
    drop(s);

    // Ctrl-C with a half-read, a half-sent-body and an idle keep-alive connection open (the
    // read timeout is the default 30 s, so it is the shutdown that drops them).
    let mut s = start(&demo(), &[]);
    let mut half = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(half, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n").unwrap();
    let mut body = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(
        body,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{"
    )
    .unwrap();
    let mut idle = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(idle, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 512];
    assert!(idle.read(&mut buf).unwrap() > 0);
    std::thread::sleep(std::time::Duration::from_millis(200)); // the server has read them
    let ok = Command::new("kill")
        .args(["-INT", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    // A guard, not a timing assertion: 25 s is less than the 30 s read timeout, so only the
    // shutdown itself can close these connections in time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(25);
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Ctrl-C did not stop the server while half-read connections were open"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    drop((half, body, idle));
}

/// The `logprobs` entries of a chat response or of a chat stream's chunks, in order.
fn chat_entries(choices: &[&Value]) -> Vec<Value> {
    choices
        .iter()
        .filter_map(|c| c["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect()
}

#[test]
fn logprobs_for_chat_and_completions_stream_or_not_at_any_budget() {
    let d = chat_model();
    let full = start(d.path(), &[]);
    let small = start(d.path(), &["--memory", "24MiB", "--batch-size", "1"]);
    let req = json!({"messages": [{"role": "user", "content": "Tell me of Elizabeth."}],
        "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let (st, body) = post(&full, "/v1/chat/completions", &req.to_string());
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let entries = chat_entries(&[&v["choices"][0]]);
    assert_eq!(
        entries.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let mut text = String::new();
    for e in &entries {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        // Greedy: the chosen token is the most likely one, with its log-probability.
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert_eq!(top[0]["logprob"], e["logprob"], "{e}");
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]) && lps[0] <= 0.0, "{e}");
        assert_eq!(
            e["bytes"].as_array().unwrap().len(),
            e["token"].as_str().unwrap().len()
        );
        text.push_str(e["token"].as_str().unwrap());
    }
    assert_eq!(
        text,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // Streamed, and at a budget that streams the model: the same entries, bit for bit.
    let mut sreq = req.clone();
    sreq["stream"] = true.into();
    for (server, r) in [(&full, &sreq), (&small, &req), (&small, &sreq)] {
        let (st, body) = post(server, "/v1/chat/completions", &r.to_string());
        assert_eq!(st, 200, "{body}");
        let got = if r["stream"] == true {
            let ev = events(&body);
            let chunks: Vec<Value> = ev[..ev.len() - 1]
                .iter()
                .map(|e| serde_json::from_str(e).unwrap())
                .collect();
            chat_entries(&chunks.iter().map(|c| &c["choices"][0]).collect::<Vec<_>>())
        } else {
            let v: Value = serde_json::from_str(&body).unwrap();
            chat_entries(&[&v["choices"][0]])
        };
        assert_eq!(got, entries, "stream {}", r["stream"]);
    }

    // Completions: `logprobs: N`.
    let creq = json!({"prompt": "It is a truth universally acknowledged", "max_tokens": 6,
        "temperature": 0, "logprobs": 2});
    let (st, body) = post(&full, "/v1/completions", &creq.to_string());
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6, "{lp}");
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 6);
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    for (t, m) in tokens.iter().zip(lp["top_logprobs"].as_array().unwrap()) {
        let m = m.as_object().unwrap();
        assert!(!m.is_empty() && m.len() <= 2, "{m:?}");
        assert!(
            m.contains_key(t.as_str().unwrap()),
            "greedy token among the top: {m:?}"
        );
    }
    let (_, body2) = post(&small, "/v1/completions", &creq.to_string());
    let v2: Value = serde_json::from_str(&body2).unwrap();
    assert_eq!(v2["choices"][0]["logprobs"], *lp);
    // Without the field: null, as before.
    let (_, body) = post(
        &full,
        "/v1/completions",
        r#"{"prompt":"The weather","max_tokens":2}"#,
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["choices"][0]["logprobs"].is_null());

    // Bad combinations are 400s naming the field.
    for (path, body) in [
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"top_logprobs":2}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"logprobs":3}"#,
        ),
        ("/v1/completions", r#"{"prompt":"x","logprobs":"many"}"#),
        (
            "/v1/completions",
            r#"{"prompt":"x","logprobs":1,"top_logprobs":1}"#,
        ),
    ] {
        let (st, b) = post(&full, path, body);
        assert_eq!(st, 400, "{body}: {b}");
        assert!(b.contains("logprobs"), "{body}: {b}");
    }
}

#[test]
fn several_choices_are_the_seeds_in_turn_stream_or_not() {
    let d = chat_model();
    let s = start(d.path(), &[]);
    let text = |v: &Value, i: usize| v["choices"][i]["text"].as_str().unwrap().to_owned();
    let one = |seed: u64| {
        let (st, b) = post(
            &s,
            "/v1/completions",
            &json!({"prompt": "It is a truth", "max_tokens": 10, "temperature": 0.9, "seed": seed})
                .to_string(),
        );
        assert_eq!(st, 200, "{b}");
        text(&serde_json::from_str(&b).unwrap(), 0)
    };
    let req =
        json!({"prompt": "It is a truth", "max_tokens": 10, "temperature": 0.9, "seed": 5, "n": 3});
    let (st, b) = post(&s, "/v1/completions", &req.to_string());
    assert_eq!(st, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    // Choice i samples with seed + i: choice 0 is what n: 1 gives.
    let got: Vec<String> = (0..3).map(|i| text(&v, i)).collect();
    assert_eq!(got, vec![one(5), one(6), one(7)]);
    assert!(
        got[0] != got[1] || got[1] != got[2],
        "three samples all alike: {got:?}"
    );
    let per: u64 = (0..3)
        .map(|i| v["choices"][i]["index"].as_u64().unwrap())
        .sum();
    assert_eq!(per, 3);
    assert_eq!(v["usage"]["completion_tokens"], 30);
    assert_eq!(
        v["usage"]["total_tokens"].as_u64().unwrap(),
        30 + v["usage"]["prompt_tokens"].as_u64().unwrap()
    );

    // Streamed: the chunks of each choice make its text; one usage chunk after all.
    let mut sreq = req.clone();
    sreq["stream"] = true.into();
    sreq["stream_options"] = json!({"include_usage": true});
    let (st, b) = post(&s, "/v1/completions", &sreq.to_string());
    assert_eq!(st, 200, "{b}");
    let ev = events(&b);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let mut streamed = vec![String::new(); 3];
    let mut finishes = 0;
    for c in &chunks {
        if let Some(ch) = c["choices"].as_array().and_then(|a| a.first()) {
            let i = ch["index"].as_u64().unwrap() as usize;
            streamed[i].push_str(ch["text"].as_str().unwrap_or(""));
            finishes += usize::from(!ch["finish_reason"].is_null());
        }
    }
    assert_eq!(streamed, got);
    assert_eq!(finishes, 3);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 30);

    // Chat: one assistant message per choice, a role chunk per choice when streaming.
    let creq = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6,
        "temperature": 0.9, "seed": 1, "n": 2});
    let (st, b) = post(&s, "/v1/chat/completions", &creq.to_string());
    assert_eq!(st, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    let msgs: Vec<String> = (0..2)
        .map(|i| {
            v["choices"][i]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let mut sreq = creq;
    sreq["stream"] = true.into();
    let (_, b) = post(&s, "/v1/chat/completions", &sreq.to_string());
    let ev = events(&b);
    let mut streamed = vec![String::new(); 2];
    let mut roles = 0;
    for e in &ev[..ev.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        let ch = &c["choices"][0];
        let i = ch["index"].as_u64().unwrap() as usize;
        roles += usize::from(ch["delta"]["role"] == "assistant");
        streamed[i].push_str(ch["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(roles, 2);
    assert_eq!(streamed, msgs);
}

#[test]
fn tools_reach_the_template_and_tool_messages_render() {
    let d = tool_model();
    let s = start(d.path(), &[]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let user = json!({"role": "user", "content": "What is the weather in Bath?"});
    let ask = |body: Value| {
        let (st, b) = post(&s, "/v1/chat/completions", &body.to_string());
        (
            st,
            serde_json::from_str::<Value>(&b).unwrap_or(Value::Null),
            b,
        )
    };
    let prompt_tokens = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
    let base = json!({"messages": [user], "max_tokens": 8, "temperature": 0});
    let (st, plain, b) = ask(base.clone());
    assert_eq!(st, 200, "{b}");
    let mut with = base.clone();
    with["tools"] = tools.clone();
    let (st, v, b) = ask(with.clone());
    assert_eq!(st, 200, "{b}");
    // The tools were rendered into the prompt.
    assert!(prompt_tokens(&v) > prompt_tokens(&plain), "{v} vs {plain}");
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant");
    assert!(["length", "stop", "tool_calls"].contains(&c["finish_reason"].as_str().unwrap()));
    // Streamed: the same content.
    let mut sw = with.clone();
    sw["stream"] = true.into();
    let (st, body) = post(&s, "/v1/chat/completions", &sw.to_string());
    assert_eq!(st, 200, "{body}");
    let ev = events(&body);
    let streamed: String = ev[..ev.len() - 1]
        .iter()
        .filter_map(|e| {
            serde_json::from_str::<Value>(e).ok()?["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(streamed, c["message"]["content"].as_str().unwrap_or(""));
    // `tool_choice: none` is the request without tools.
    let mut none = with.clone();
    none["tool_choice"] = "none".into();
    let (_, v_none, _) = ask(none);
    assert_eq!(prompt_tokens(&v_none), prompt_tokens(&plain));
    assert_eq!(
        v_none["choices"][0]["message"],
        plain["choices"][0]["message"]
    );
    // A history with a call and the tool's answer renders and is answered.
    let mut hist = with.clone();
    hist["messages"] = json!([user,
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Bath\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Rain, 12 degrees."}]);
    let (st, vh, b) = ask(hist);
    assert_eq!(st, 200, "{b}");
    assert!(prompt_tokens(&vh) > prompt_tokens(&v));
}

/// Checks `v` against the subset of JSON Schema the tests below use (type, properties,
/// required, additionalProperties: false, enum, const, anyOf, items, minItems / maxItems,
/// maxLength, minimum / maximum); returns what is wrong.
fn invalid(v: &Value, s: &Value) -> Option<String> {
    let fail = |why: &str| Some(format!("{v} fails {s}: {why}"));
    if let Some(alts) = s["anyOf"].as_array() {
        return if alts.iter().any(|a| invalid(v, a).is_none()) {
            None
        } else {
            fail("no alternative of anyOf")
        };
    }
    if let Some(e) = s["enum"].as_array()
        && !e.contains(v)
    {
        return fail("enum");
    }
    if !s["const"].is_null() && s["const"] != *v {
        return fail("const");
    }
    match s["type"].as_str() {
        Some("object") => {
            let Some(o) = v.as_object() else {
                return fail("not an object");
            };
            let props = s["properties"].as_object().cloned().unwrap_or_default();
            for r in s["required"].as_array().into_iter().flatten() {
                if !o.contains_key(r.as_str().unwrap()) {
                    return fail("a required field is missing");
                }
            }
            for (k, x) in o {
                match props.get(k) {
                    Some(ps) => {
                        if let Some(e) = invalid(x, ps) {
                            return Some(e);
                        }
                    }
                    None if s["additionalProperties"] == false => return fail("extra field"),
                    None => {}
                }
            }
        }
        Some("array") => {
            let Some(a) = v.as_array() else {
                return fail("not an array");
            };
            let n = a.len() as u64;
            if s["minItems"].as_u64().is_some_and(|m| n < m)
                || s["maxItems"].as_u64().is_some_and(|m| n > m)
            {
                return fail("item count");
            }
            for x in a {
                if let Some(e) = invalid(x, &s["items"]) {
                    return Some(e);
                }
            }
        }
        Some("string") => {
            let Some(t) = v.as_str() else {
                return fail("not a string");
            };
            if s["maxLength"]
                .as_u64()
                .is_some_and(|m| t.chars().count() as u64 > m)
            {
                return fail("maxLength");
            }
        }
        Some("integer") => {
            let Some(i) = v.as_i64() else {
                return fail("not an integer");
            };
            if s["minimum"].as_i64().is_some_and(|m| i < m)
                || s["maximum"].as_i64().is_some_and(|m| i > m)
            {
                return fail("bounds");
            }
        }
        Some(t) => panic!("the checker does not know type {t}"),
        None => {}
    }
    None
}

#[test]
fn the_schema_checker_can_fail() {
    let s = json!({"type": "object", "properties": {"a": {"enum": [1, 2]},
        "b": {"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 1}},
        "required": ["a"], "additionalProperties": false});
    assert_eq!(invalid(&json!({"a": 1, "b": ["xy"]}), &s), None);
    for bad in [
        json!({"a": 3}),
        json!({"b": []}),
        json!({"a": 1, "c": 0}),
        json!({"a": 1, "b": ["xyz"]}),
        json!({"a": 1, "b": ["x", "y"]}),
        json!([1]),
    ] {
        assert!(invalid(&bad, &s).is_some(), "{bad}");
    }
}

/// A person: nested objects, arrays, enums, bounded strings and numbers, required fields.
fn person_schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "calm"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "zip": {"type": "integer", "minimum": 10000, "maximum": 99999}},
            "required": ["city", "zip"], "additionalProperties": false}},
        "required": ["name", "age", "mood", "tags", "address"], "additionalProperties": false})
}

/// The content of a chat reply, streamed or not.
fn chat_content(body: &str, stream: bool) -> (String, String) {
    if !stream {
        let v: Value = serde_json::from_str(body).unwrap();
        let c = &v["choices"][0];
        return (
            c["message"]["content"].as_str().unwrap_or("").to_owned(),
            c["finish_reason"].as_str().unwrap().to_owned(),
        );
    }
    let ev = events(body);
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str())
        .unwrap()
        .to_owned();
    (text, finish)
}

#[test]
fn response_formats_are_enforced_at_any_budget_stream_or_not() {
    let d = chat_model();
    let full = start(d.path(), &[]);
    let small = start(d.path(), &["--memory", "24MiB", "--batch-size", "1"]);
    let schema = person_schema();
    let user = json!([{"role": "user", "content": "Describe a person in Bath."}]);
    for (sampling, rf) in [
        (
            json!({"temperature": 0}),
            json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": schema}}),
        ),
        (
            json!({"temperature": 0.9, "seed": 7}),
            json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}),
        ),
        (json!({"temperature": 0}), json!({"type": "json_object"})),
        (
            json!({"temperature": 1.0, "seed": 3}),
            json!({"type": "json_object"}),
        ),
    ] {
        let mut req = json!({"messages": user, "max_tokens": 160, "response_format": rf});
        for (k, v) in sampling.as_object().unwrap() {
            req[k] = v.clone();
        }
        let (st, body) = post(&full, "/v1/chat/completions", &req.to_string());
        assert_eq!(st, 200, "{body}");
        let (text, finish) = chat_content(&body, false);
        if rf["type"] == "json_schema" {
            // The demo model has never seen JSON, yet the reply is complete and validates.
            assert_eq!(finish, "stop", "{text}");
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert_eq!(invalid(&v, &schema), None);
        } else {
            // Any object: nothing bounds its strings or its keys, and this model never writes
            // a closing brace. Near `max_tokens` the constraint keeps only the tokens that let
            // the object still be closed in time, so it parses; the reply says it was cut.
            assert_eq!(finish, "length", "{text}");
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(
                v.is_object() && !v.as_object().unwrap().is_empty(),
                "{text}"
            );
        }
        // Streamed, and with the experts streaming under a small budget: the same text.
        let mut sreq = req.clone();
        sreq["stream"] = true.into();
        for (server, r) in [(&full, &sreq), (&small, &req), (&small, &sreq)] {
            let (st, body) = post(server, "/v1/chat/completions", &r.to_string());
            assert_eq!(st, 200, "{body}");
            let got = chat_content(&body, r["stream"] == true);
            assert_eq!(
                got,
                (text.clone(), finish.clone()),
                "stream {}",
                r["stream"]
            );
        }
    }
    // `text` is no constraint: the reply is the plain one.
    let plain = json!({"messages": user, "max_tokens": 12, "temperature": 0});
    let mut text = plain.clone();
    text["response_format"] = json!({"type": "text"});
    let (_, a) = post(&full, "/v1/chat/completions", &plain.to_string());
    let (_, b) = post(&full, "/v1/chat/completions", &text.to_string());
    assert_eq!(chat_content(&a, false), chat_content(&b, false));
    // Bad formats and schemas are 400s naming what is wrong.
    for (rf, says) in [
        (json!({"type": "yaml"}), "`yaml`"),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            "schema` is missing",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "no-such-type"}}}),
            "json_schema",
        ),
    ] {
        let mut r = plain.clone();
        r["response_format"] = rf;
        let (st, b) = post(&full, "/v1/chat/completions", &r.to_string());
        assert_eq!(st, 400, "{b}");
        assert!(b.contains(says), "{b}");
    }
}

#[test]
fn forced_tool_calls_validate_against_the_tools_at_any_budget() {
    let d = tool_model();
    let full = start(d.path(), &[]);
    let small = start(d.path(), &["--memory", "24MiB", "--batch-size", "1"]);
    let weather = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit", "days"], "additionalProperties": false});
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": weather}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
            "additionalProperties": false}}}]);
    let schema_of = |name: &str| {
        tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == name)
            .map(|t| t["function"]["parameters"].clone())
            .unwrap_or_else(|| panic!("called `{name}`, not a tool"))
    };
    let calls_of = |body: &str| -> (Vec<Value>, String) {
        let v: Value = serde_json::from_str(body).unwrap();
        let c = &v["choices"][0];
        (
            c["message"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            c["finish_reason"].as_str().unwrap().to_owned(),
        )
    };
    let streamed_calls = |body: &str| -> Vec<Value> {
        let ev = events(body);
        ev[..ev.len() - 1]
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
            .flatten()
            .collect()
    };
    for (choice, parallel) in [
        (
            json!({"type": "function", "function": {"name": "get_weather"}}),
            true,
        ),
        (json!("required"), false),
    ] {
        let req = json!({"messages": [{"role": "user", "content": "What is the weather in Bath?"}],
            "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel,
            "max_tokens": 120, "temperature": 0});
        let (st, body) = post(&full, "/v1/chat/completions", &req.to_string());
        assert_eq!(st, 200, "{body}");
        let (calls, finish) = calls_of(&body);
        assert_eq!(finish, "tool_calls", "{body}");
        assert!(!calls.is_empty(), "{body}");
        if !parallel {
            assert_eq!(calls.len(), 1, "{body}");
        }
        for c in &calls {
            let name = c["function"]["name"].as_str().unwrap();
            if choice.is_object() {
                assert_eq!(name, "get_weather");
            }
            let args: Value =
                serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(invalid(&args, &schema_of(name)), None);
            assert!(c["id"].as_str().unwrap().starts_with("call_"));
        }
        // The same calls streamed, and under a budget that streams the experts.
        let mut sreq = req.clone();
        sreq["stream"] = true.into();
        let strip =
            |v: &[Value]| -> Vec<Value> { v.iter().map(|c| c["function"].clone()).collect() };
        let (_, b) = post(&full, "/v1/chat/completions", &sreq.to_string());
        assert_eq!(strip(&streamed_calls(&b)), strip(&calls));
        let (_, b) = post(&small, "/v1/chat/completions", &req.to_string());
        assert_eq!(strip(&calls_of(&b).0), strip(&calls));
        let (_, b) = post(&small, "/v1/chat/completions", &sreq.to_string());
        assert_eq!(strip(&streamed_calls(&b)), strip(&calls));
    }
    // A name that is not a tool, or `required` without tools: 400s that say so.
    for (choice, tools, says) in [
        (
            json!({"type": "function", "function": {"name": "nope"}}),
            tools.clone(),
            "`nope`",
        ),
        (json!("required"), json!([]), "needs `tools`"),
        (json!({"type": "function"}), tools.clone(), "tool_choice"),
    ] {
        let req = json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools,
            "tool_choice": choice});
        let (st, b) = post(&full, "/v1/chat/completions", &req.to_string());
        assert_eq!(st, 400, "{b}");
        assert!(b.contains(says), "{b}");
    }
}

/// The official `openai` Python client (tests/clients/openai_client.py): chat, streams,
/// logprobs, choices, tools, the structured-output helper and a tool round trip.
#[test]
fn the_official_openai_client_works_unchanged() {
    python_client(
        "the_official_openai_client_works_unchanged",
        "openai_client.py",
        "openai, pydantic",
        &[],
        |s| vec![url(s, "/v1")],
    );
}

/// LangChain's `ChatOpenAI` (tests/clients/langchain_client.py): replies, streams, structured
/// output both ways, and an agent step with a forced tool call.
#[test]
fn langchain_works_unchanged() {
    python_client(
        "langchain_works_unchanged",
        "langchain_client.py",
        "langchain_openai, pydantic",
        &[],
        |s| vec![url(s, "/v1")],
    );
}

#[test]
fn serve_draft_ngram_changes_no_text_and_reports_drafts_in_usage() {
    let d = chat_model();
    let plain = start(d.path(), &[]);
    let drafted = start(d.path(), &["--draft", "ngram", "--draft-tokens", "3"]);
    let req = json!({"messages": [{"role": "user", "content": "Tell me of Elizabeth."}],
        "max_tokens": 64, "temperature": 0});
    let (_, a) = post(&plain, "/v1/chat/completions", &req.to_string());
    let (st, b) = post(&drafted, "/v1/chat/completions", &req.to_string());
    assert_eq!(st, 200, "{b}");
    let (a, b): (Value, Value) = (
        serde_json::from_str(&a).unwrap(),
        serde_json::from_str(&b).unwrap(),
    );
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    assert!(a["usage"].get("draft_proposed").is_none());
    let p = b["usage"]["draft_proposed"].as_u64().unwrap();
    assert!(
        p > 0 && b["usage"]["draft_accepted"].as_u64().unwrap() <= p,
        "{}",
        b["usage"]
    );
    // Streamed: the same text.
    let mut s = req.clone();
    s["stream"] = true.into();
    let (_, body) = post(&drafted, "/v1/chat/completions", &s.to_string());
    assert_eq!(
        chat_content(&body, true).0,
        a["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

/// Posts a chat request to a server without the prefix cache and to one with it: the same
/// message must come back (and no cached tokens from the first). Returns the second's
/// response and its `usage.prompt_tokens_details.cached_tokens`.
fn cold_and_warm(cold: &Server, warm: &Server, body: &str) -> (Value, u64) {
    let (_, a) = post(cold, "/v1/chat/completions", body);
    let (st, b) = post(warm, "/v1/chat/completions", body);
    assert_eq!(st, 200, "{b}");
    let (a, b): (Value, Value) = (
        serde_json::from_str(&a).unwrap(),
        serde_json::from_str(&b).unwrap(),
    );
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    (b, cached)
}

#[test]
fn a_shared_system_prompt_is_reported_cached_and_changes_no_text() {
    let d = chat_model();
    let cold = start(d.path(), &["--prefix-cache", "off"]);
    let warm = start(d.path(), &[]);
    let system = "You are a careful assistant who answers questions about old novels. ".repeat(4);
    let req = |q: &str| {
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "max_tokens": 12, "temperature": 0})
        .to_string()
    };
    let mut first_prompt = 0;
    for (k, q) in ["Tell me of Elizabeth.", "Who is Darcy?"]
        .iter()
        .enumerate()
    {
        let (b, cached) = cold_and_warm(&cold, &warm, &req(q));
        if k == 0 {
            assert_eq!(cached, 0, "{}", b["usage"]);
            first_prompt = b["usage"]["prompt_tokens"].as_u64().unwrap();
        } else {
            // The system prompt and the template around it, not the question.
            assert!(
                cached > first_prompt / 2 && cached < first_prompt,
                "{}",
                b["usage"]
            );
        }
    }
    // Streamed, with usage: the same figure.
    let mut r: Value = serde_json::from_str(&req("Who is Darcy?")).unwrap();
    r["stream"] = true.into();
    r["stream_options"] = json!({"include_usage": true});
    let (_, body) = post(&warm, "/v1/chat/completions", &r.to_string());
    let ev = events(&body);
    let u: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    let p = u["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        u["usage"]["prompt_tokens_details"]["cached_tokens"], p,
        "{u}"
    );
}

/// A recurrent fixture (gated DeltaNet) with the byte-level tokenizer and a chat template.
fn recurrent_chat_model() -> tempfile::TempDir {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let d = copy_model(&data.join("models/qwen3_next-fp32"));
    std::fs::copy(
        data.join("byte-tokenizer/tokenizer.json"),
        d.path().join("tokenizer.json"),
    )
    .unwrap();
    let tpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    std::fs::write(
        d.path().join("tokenizer_config.json"),
        json!({"chat_template": tpl}).to_string(),
    )
    .unwrap();
    d
}

#[test]
fn a_recurrent_model_shares_a_system_prompt_with_and_without_tools() {
    let d = recurrent_chat_model();
    let cold = start(d.path(), &["--prefix-cache", "off"]);
    let warm = start(d.path(), &[]);
    let tools = json!([{"type": "function", "function": {"name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]);
    for with_tools in [false, true] {
        // A system prompt of each round's own, so that the second round (with tools, through
        // the template's tools path) finds nothing from the first.
        let system = if with_tools {
            "You use the tools when they help, and say so."
        } else {
            "You are terse and exact."
        };
        let req = |q: &str| {
            let mut r = json!({"messages": [{"role": "system", "content": system},
                {"role": "user", "content": q}], "max_tokens": 6, "temperature": 0});
            if with_tools {
                r["tools"] = tools.clone();
            }
            r.to_string()
        };
        let mut cached = Vec::new();
        for q in ["First question?", "Second one?"] {
            cached.push(cold_and_warm(&cold, &warm, &req(q)).1);
        }
        // `<system>` + the text + a newline, one token per byte, computed by the first request.
        let head = ("<system>".len() + system.len() + 1) as u64;
        assert_eq!(cached, vec![0, head], "tools: {with_tools}");
    }
}

#[test]
fn the_next_turn_of_a_conversation_reuses_the_reply() {
    let d = chat_model();
    let cold = start(d.path(), &["--prefix-cache", "off"]);
    let warm = start(d.path(), &[]);
    let first = json!({"messages": [{"role": "user", "content": "Tell me of Elizabeth."}],
        "max_tokens": 16, "temperature": 0});
    let (_, a) = post(&warm, "/v1/chat/completions", &first.to_string());
    let a: Value = serde_json::from_str(&a).unwrap();
    let reply = a["choices"][0]["message"]["content"].as_str().unwrap();
    let prompt1 = a["usage"]["prompt_tokens"].as_u64().unwrap();
    let second = json!({"messages": [{"role": "user", "content": "Tell me of Elizabeth."},
        {"role": "assistant", "content": reply}, {"role": "user", "content": "And of Jane?"}],
        "max_tokens": 8, "temperature": 0});
    // Beyond the first prompt: the reply's tokens too, as the template renders them back.
    let (b, cached) = cold_and_warm(&cold, &warm, &second.to_string());
    assert!(
        cached > prompt1 + 4,
        "{cached} of {}: {}",
        prompt1,
        b["usage"]
    );
}
