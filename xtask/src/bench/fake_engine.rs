//! The fast fake engine of the overhead benchmark: a canned OpenAI answer written at once, so
//! that what is measured is the router, not an engine. Non-streaming requests get a 64-token
//! `chat.completion`; streaming ones the same 64 tokens as SSE chunk events of a set number of
//! tokens each, `[DONE]` included, in one write. Any GET (the router's health checks) gets 200.

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

/// Tokens in every canned answer.
const TOKENS: usize = 64;

/// A running fake engine; stops when dropped.
pub(crate) struct FakeEngine {
    pub(crate) url: String,
    _stop: oneshot::Sender<()>,
}

impl FakeEngine {
    /// Starts the fake engine on its own thread and loopback port, streaming
    /// `tokens_per_event` tokens in each SSE event.
    pub(crate) fn start(tokens_per_event: usize) -> Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding")?;
        listener.set_nonblocking(true).context("non-blocking")?;
        let addr: SocketAddr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("fake-engine".into()).spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                let (json, sse) =
                    (Bytes::from(json_answer()), Bytes::from(sse_answer(tokens_per_event)));
                let serve = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else { continue };
                        let _ = tcp.set_nodelay(true);
                        let (json, sse) = (json.clone(), sse.clone());
                        tokio::spawn(async move {
                            let service = service_fn(move |request| {
                                answer(request, json.clone(), sse.clone())
                            });
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(tcp), service)
                                .await;
                        });
                    }
                };
                tokio::select! {
                    () = serve => {}
                    _ = stopped => {}
                }
            });
        })?;
        Ok(Self { url: format!("http://{addr}"), _stop: stop })
    }
}

async fn answer(
    request: Request<hyper::body::Incoming>,
    json: Bytes,
    sse: Bytes,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.method() == http::Method::GET {
        return Ok(Response::new(Full::new(Bytes::from_static(b"ok"))));
    }
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let streaming = body.windows(13).any(|w| w == b"\"stream\":true");
    let (content_type, payload) =
        if streaming { ("text/event-stream", sse) } else { ("application/json", json) };
    let mut response = Response::new(Full::new(payload));
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    Ok(response)
}

fn json_answer() -> String {
    serde_json::json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "length", "logprobs": null,
            "message": {"role": "assistant", "content": " tok".repeat(TOKENS)}}],
        "usage": {"prompt_tokens": 8, "completion_tokens": TOKENS, "total_tokens": TOKENS + 8},
    })
    .to_string()
}

fn sse_answer(tokens_per_event: usize) -> String {
    let event = |delta: serde_json::Value, finish: Option<&str>| {
        let chunk = serde_json::json!({
            "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        format!("data: {chunk}\n\n")
    };
    let per_event = tokens_per_event.clamp(1, TOKENS);
    let mut body = String::new();
    for first in (0..TOKENS).step_by(per_event) {
        let content = " tok".repeat(per_event.min(TOKENS - first));
        let delta = if first == 0 {
            serde_json::json!({"role": "assistant", "content": content})
        } else {
            serde_json::json!({"content": content})
        };
        body.push_str(&event(delta, None));
    }
    body.push_str(&event(serde_json::json!({}), Some("length")));
    body.push_str("data: [DONE]\n\n");
    body
}
