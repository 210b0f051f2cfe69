//! An HTTP server that speaks the APIs clients and coding agents use, over one request core
//! (`core`): OpenAI's chat completions, completions and Responses (`openai`, `responses`),
//! Anthropic's Messages (`anthropic`), and Ollama's (`ollama`); plus `/health`. Every
//! dialect's requests decode together through one [`Batcher`]; a client that disconnects
//! frees its slot. With an API key, every endpoint but `/health` and `/` asks for it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::batch::Batcher;
use crate::{Engine, Error};

mod anthropic;
mod core;
mod ollama;
mod openai;
mod responses;

use self::core::{ApiError, Dialect, bad};

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Address to bind (127.0.0.1 unless told otherwise).
    pub addr: SocketAddr,
    /// Sequences decoded together.
    pub batch_size: usize,
    /// The largest `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// The model name reported by `/v1/models` and in responses.
    pub model_name: String,
    /// How long a client has to send a request's headers, and then its body (30 s by default
    /// in `sluice serve`): a connection that sends half a request is closed after it.
    pub read_timeout: Duration,
    /// Speculative decoding for every request ([`crate::Draft`]).
    pub draft: crate::Draft,
    /// When set, every endpoint but `/health` and `/` asks for this key, as `Authorization: Bearer
    /// KEY` or `x-api-key: KEY` (401 in the endpoint's API's error shape otherwise).
    pub api_key: Option<String>,
}

/// How long, after Ctrl-C, requests being answered get to finish before every connection is
/// dropped (idle and half-read ones are closed at once).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

struct App {
    batcher: Batcher,
    opts: ServerOptions,
    next_id: AtomicU64,
}

/// Reads a request body: only `application/json` (a web page can send a form or `text/plain`
/// to a local server without the browser asking first; it cannot send JSON that way), at most
/// `max_body_bytes` (413 otherwise), within the read timeout (408).
async fn read_body(app: &App, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    read_body_from(app, headers, body, false).await
}

/// [`read_body`], but for Ollama's API, whose users post with `curl -d` (a form's content
/// type): a body of any type is taken when no browser sent it (a browser names the page's
/// `Origin` on every POST; curl and the API clients name none).
async fn read_ollama_body(app: &App, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    read_body_from(app, headers, body, !headers.contains_key(header::ORIGIN)).await
}

async fn read_body_from(
    app: &App,
    headers: &HeaderMap,
    body: Body,
    any_type: bool,
) -> Result<Bytes, ApiError> {
    let json_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json_type && !any_type {
        return Err(ApiError(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json".into(),
        ));
    }
    let max = app.opts.max_body_bytes;
    let too_large = || {
        ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over this server's limit of {max} bytes (--max-body)"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(app.opts.read_timeout, axum::body::to_bytes(body, max)).await {
        Err(_) => Err(ApiError(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                app.opts.read_timeout.as_secs_f64()
            ),
        )),
        Ok(Err(e)) => {
            let e = e.into_inner();
            if e.is::<http_body_util::LengthLimitError>() {
                Err(too_large())
            } else {
                Err(bad(format!("reading the request body: {e}")))
            }
        }
        Ok(Ok(b)) => Ok(b),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad(format!("bad request body: {e}")))
}

/// Liveness plus the batcher's counters (sequences active, queued, finished, cancelled,
/// failed, rejected).
async fn health(State(app): State<Arc<App>>) -> impl IntoResponse {
    let s = app.batcher.stats();
    axum::Json(json!({
        "status": "ok",
        "active": s.active,
        "queued": s.queued,
        "finished": s.finished,
        "cancelled": s.cancelled,
        "failed": s.failed,
        "rejected": s.rejected,
        "max_batch": app.batcher.max_batch(),
    }))
}

/// `GET /` (and `HEAD /`): a plain answer that the server is up, which Ollama's CLI and some
/// of its clients ask before anything else. Like `/health`, it needs no key.
async fn root() -> &'static str {
    "sluice is running\n"
}

/// Whether `given` is `key`, in time that does not depend on where they differ.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

/// With an API key set, every endpoint but `/health` and `/` asks for it: `Authorization:
/// Bearer KEY` (OpenAI's and Ollama's clients) or `x-api-key: KEY` (Anthropic's), compared in
/// constant time; a 401 in the endpoint's own error shape otherwise.
async fn authorize(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let Some(key) = &app.opts.api_key else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/health" || path == "/" {
        return next.run(req).await;
    }
    let h = req.headers();
    let bearer = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        });
    let x_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
    let ok = [bearer, x_key]
        .into_iter()
        .flatten()
        .any(|g| same_key(g.trim().as_bytes(), key.as_bytes()));
    if ok {
        return next.run(req).await;
    }
    let dialect = Dialect::of_path(path);
    ApiError(
        StatusCode::UNAUTHORIZED,
        "a missing or wrong API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`".into(),
    )
    .into_dialect(dialect)
}

/// An unknown path, answered in the error shape its prefix's API uses.
async fn not_found(req: Request) -> Response {
    let path = req.uri().path().to_owned();
    ApiError(StatusCode::NOT_FOUND, format!("no endpoint {path}"))
        .into_dialect(Dialect::of_path(&path))
}

/// The router, for embedding in another server. The engine must be planned for
/// `opts.batch_size` sequences ([`crate::EngineBuilder::sequences`]).
pub fn router(engine: Engine, opts: ServerOptions) -> Result<Router, Error> {
    let app = Arc::new(App {
        batcher: Batcher::new(engine, opts.batch_size)?,
        next_id: AtomicU64::new(1),
        opts: opts.clone(),
    });
    Ok(Router::new()
        .route("/health", get(health))
        .route("/", get(root))
        .route("/v1/models", get(openai::models))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/version", get(ollama::version))
        .route("/api/ps", get(ollama::ps))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), authorize))
        .with_state(app))
}

/// Serves until interrupted (Ctrl-C). Prints the address once listening.
pub fn serve(engine: Engine, opts: ServerOptions) -> Result<(), Error> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Io {
            path: "tokio runtime".into(),
            source: e,
        })?;
    let name = opts.model_name.clone();
    let batch = opts.batch_size;
    let app = router(engine, opts.clone())?;
    rt.block_on(async move {
        let addr = opts.addr;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Listen { addr, source })?;
        let local = listener.local_addr().map_err(|e| Error::Io {
            path: "socket".into(),
            source: e,
        })?;
        eprintln!("sluice serving `{name}` on http://{local} (batch {batch}); Ctrl-C stops");
        // hyper directly rather than axum::serve, for a header read timeout (which needs a
        // timer) and a shutdown that does not wait for connections that never finish a request.
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(opts.read_timeout);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut conns = tokio::task::JoinSet::new();
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                _ = &mut ctrl_c => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => {
                    let Ok((tcp, _)) = accepted else {
                        // Out of descriptors, say: back off rather than spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let svc = hyper_util::service::TowerToHyperService::new(app.clone());
                    let conn = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc);
                    let mut stop = stop_rx.clone();
                    conns.spawn(async move {
                        tokio::pin!(conn);
                        tokio::select! {
                            _ = conn.as_mut() => return,
                            _ = stop.changed() => conn.as_mut().graceful_shutdown(),
                        }
                        let _ = conn.await;
                    });
                }
            }
        }
        drop(listener);
        // Idle connections close at once; a request being answered gets SHUTDOWN_GRACE to
        // finish; anything still open then (a client that sent half a request) is dropped.
        let _ = stop_tx.send(true);
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        conns.abort_all();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// Words the dialects' requests are made of: field names, roles, block and item types.
    const WORDS: &[&str] = &[
        "model",
        "messages",
        "role",
        "content",
        "type",
        "text",
        "tool_use",
        "tool_result",
        "tool_use_id",
        "id",
        "name",
        "input",
        "input_schema",
        "tools",
        "tool_choice",
        "system",
        "max_tokens",
        "stream",
        "thinking",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "output_config",
        "format",
        "schema",
        "instructions",
        "function_call",
        "function_call_output",
        "call_id",
        "arguments",
        "output",
        "max_output_tokens",
        "previous_response_id",
        "reasoning",
        "effort",
        "options",
        "num_predict",
        "seed",
        "stop",
        "repeat_last_n",
        "think",
        "prompt",
        "raw",
        "context",
        "template",
        "suffix",
        "images",
        "tool_calls",
        "function",
        "tool_name",
        "parameters",
        "user",
        "assistant",
        "tool",
        "developer",
        "message",
        "auto",
        "any",
        "none",
        "required",
        "json",
        "json_schema",
        "json_object",
        "enabled",
        "disabled",
        "adaptive",
        "keep_alive",
        "logprobs",
        "n",
        "response_format",
        "tool_call_id",
        "parallel_tool_calls",
        "input_text",
        "image",
        "string",
        "object",
        "properties",
        "max_completion_tokens",
    ];

    fn any_json() -> impl Strategy<Value = Value> {
        let word = prop::sample::select(WORDS);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            word.prop_map(Value::from),
            ".{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((prop::sample::select(WORDS), inner), 0..7).prop_map(|kv| {
                    Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
            ]
        })
    }

    /// Valid requests of every dialect, to mutate: a change deep inside one reaches the
    /// checks that arbitrary JSON, refused at its top, never does.
    fn seeds() -> Vec<Value> {
        let tool =
            serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}});
        vec![
            serde_json::json!({"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "s"}],
                "messages": [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}],
                "tools": [{"name": "f", "input_schema": tool}], "tool_choice": {"type": "tool", "name": "f"},
                "thinking": {"type": "enabled", "budget_tokens": 1024}, "stop_sequences": ["x"],
                "output_config": {"format": {"type": "json_schema", "schema": tool}}}),
            serde_json::json!({"model": "m", "instructions": "i", "input": [
                    {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
                "tools": [{"type": "function", "name": "f", "parameters": tool}, {"type": "web_search"}],
                "tool_choice": {"type": "function", "name": "f"}, "max_output_tokens": 8,
                "text": {"format": {"type": "json_schema", "name": "x", "schema": tool}},
                "reasoning": {"effort": "low"}}),
            serde_json::json!({"model": "m", "stream": false, "think": true, "format": tool,
                "messages": [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
                    {"role": "tool", "content": "ok", "tool_name": "f"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": tool}}],
                "options": {"num_predict": 8, "temperature": 0.5, "stop": ["x"], "repeat_last_n": -1}}),
            serde_json::json!({"model": "m", "prompt": "Hi", "system": "s", "context": [1, 2],
                "format": "json", "options": {"seed": 3}}),
            serde_json::json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "f", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": tool}}],
                "tool_choice": "required", "response_format": {"type": "json_object"}}),
        ]
    }

    /// Every place in a JSON tree, as the path of keys and indexes to it.
    fn places(v: &Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(at.clone());
        match v {
            Value::Object(m) => m.iter().for_each(|(k, x)| {
                at.push(k.clone());
                places(x, at, out);
                at.pop();
            }),
            Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| {
                at.push(i.to_string());
                places(x, at, out);
                at.pop();
            }),
            _ => {}
        }
    }

    fn replace(v: &mut Value, path: &[String], with: Value) {
        match path.split_first() {
            None => *v = with,
            Some((k, rest)) => {
                let next = match v {
                    Value::Object(m) => m.get_mut(k),
                    Value::Array(a) => k.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
                    _ => None,
                };
                if let Some(n) = next {
                    replace(n, rest, with);
                }
            }
        }
    }

    /// Runs every dialect's request parser on `v`: none may panic, and each refusal is a 4xx
    /// with a message.
    fn every_parser(v: &Value) -> Result<(), TestCaseError> {
        let openai = serde_json::from_value::<openai::ChatRequest>(v.clone())
            .map_err(|e| core::bad(e.to_string()))
            .and_then(openai::chat_turn)
            .err();
        let errors = [
            anthropic::parse_request(v, false).err(),
            anthropic::parse_request(v, true).err(),
            responses::parse_request(v).err(),
            ollama::parse_chat(v).err(),
            ollama::parse_generate(v).err(),
            openai,
        ];
        for e in errors.into_iter().flatten() {
            prop_assert!(e.0.is_client_error(), "{}: {}", e.0, e.1);
            prop_assert!(!e.1.is_empty());
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn every_dialects_parser_takes_any_json(v in any_json()) {
            every_parser(&v)?;
        }

        #[test]
        fn every_dialects_parser_takes_any_change_to_a_valid_request(
            seed in 0..5usize,
            changes in prop::collection::vec((any::<prop::sample::Index>(), any_json()), 1..4),
        ) {
            let mut v = seeds()[seed].clone();
            for (at, with) in changes {
                let mut all = Vec::new();
                places(&v, &mut Vec::new(), &mut all);
                let path = at.get(&all).clone();
                replace(&mut v, &path, with);
            }
            every_parser(&v)?;
        }
    }

    #[test]
    fn the_seed_requests_are_valid() {
        let s = seeds();
        assert!(anthropic::parse_request(&s[0], false).is_ok());
        assert!(responses::parse_request(&s[1]).is_ok());
        assert!(ollama::parse_chat(&s[2]).is_ok());
        assert!(ollama::parse_generate(&s[3]).is_ok());
        let chat = serde_json::from_value::<openai::ChatRequest>(s[4].clone()).unwrap();
        assert!(openai::chat_turn(chat).is_ok());
    }

    #[test]
    fn keys_are_compared_whole() {
        assert!(same_key(b"secret", b"secret"));
        assert!(!same_key(b"secret", b"secreT"));
        assert!(!same_key(b"secre", b"secret"));
        assert!(!same_key(b"", b"secret"));
    }
}
