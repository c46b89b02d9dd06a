//! The PD decision table, on in-process scripted engines: which failure the client hears (and
//! from which engine), whether the answer streams, what a prefill failure does to a decode
//! answer already under way, and that no in-flight guard outlives the dispatch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::BodyExt;
use router_buckets::BucketPick;
use router_policies::{Pick, PickReason};
use router_workers::{ModelId, WorkerId};

use crate::app::AppContext;
use crate::dispatch::{Dispatch, Exchange};
use crate::error::ApiError;
use router_config::ConfigFile;
use router_prepare::{Endpoint, parse_request, prepare};

/// What a scripted engine does with a chat request.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// 200 with a JSON answer.
    Answer,
    /// 200 with an SSE stream of two events and `[DONE]`.
    Stream,
    /// 200 SSE: one event, then the rest after this many ms.
    SlowStream(u64),
    /// A JSON answer whose head comes after this many ms.
    LateAnswer(u64),
    /// A JSON answer whose head comes at once and its body after this many ms.
    SlowBody(u64),
    /// 500 after this many ms.
    Fail(u64),
    /// 400 at once.
    Refuse,
    /// Nothing listens.
    Down,
}

async fn respond(script: Script) -> Response {
    let sleep = |ms| tokio::time::sleep(Duration::from_millis(ms));
    let json = r#"{"choices":[{"message":{"content":"hi"}}]}"#;
    let sse = |chunks: Vec<&'static str>, pause: u64| {
        let events =
            futures::stream::iter(chunks.into_iter().enumerate()).then(move |(i, c)| async move {
                if i == 1 {
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                Ok::<_, std::convert::Infallible>(Bytes::from(c))
            });
        ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(events)).into_response()
    };
    match script {
        Script::Answer => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Script::Stream => {
            sse(vec!["data: {\"n\":1}\n\n", "data: {\"n\":2}\n\n", "data: [DONE]\n\n"], 0)
        }
        Script::SlowStream(ms) => sse(vec!["data: {\"n\":1}\n\n", "data: [DONE]\n\n"], ms),
        Script::LateAnswer(ms) => {
            sleep(ms).await;
            ([(header::CONTENT_TYPE, "application/json")], json).into_response()
        }
        Script::SlowBody(ms) => {
            let body = futures::stream::once(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok::<_, std::convert::Infallible>(Bytes::from(json))
            });
            ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(body)).into_response()
        }
        Script::Fail(ms) => {
            sleep(ms).await;
            (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response()
        }
        Script::Refuse => (StatusCode::BAD_REQUEST, "bad request").into_response(),
        Script::Down => unreachable!("nothing listens"),
    }
}

/// A scripted engine on loopback; its URL.
async fn engine(script: Script) -> String {
    if matches!(script, Script::Down) {
        return router_test_support::nothing_listens();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(move || respond(script)));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

async fn context(prefill: Script, decode: Script) -> Arc<AppContext> {
    let (p, d) = (engine(prefill).await, engine(decode).await);
    let yaml = format!(
        "server: {{engine_idle_timeout_secs: 5}}\nmodels:\n  - id: m\n    workers:\n      \
         - {{id: P1, url: \"{p}\", role: prefill}}\n      - {{id: D1, url: \"{d}\", role: decode}}\n    \
         buckets:\n      - id: pd\n        groups:\n          pd:\n            \
         prefill: {{policy: {{type: round_robin}}}}\n            decode: {{policy: {{type: round_robin}}}}\n"
    );
    let config = ConfigFile::parse(&yaml).expect("valid yaml");
    Arc::new(AppContext::build(&config).expect("valid configuration"))
}

/// What the client gets.
#[derive(Debug, PartialEq)]
enum Heard {
    /// A 200 whose body ends with this text.
    Answer(&'static str),
    /// A 200 stream whose last event is an error from this text on.
    StreamError(&'static str),
    /// An error: its status and the start of its message.
    Error(u16, &'static str),
}

async fn dispatch(ctx: &Arc<AppContext>, stream: bool) -> Result<Response, ApiError> {
    let body = serde_json::json!({
        "model": "m", "stream": stream, "messages": [{"role": "user", "content": "hello"}]
    });
    let body = Bytes::from(body.to_string());
    let chat = parse_request(Endpoint::Chat, &body, 4).expect("a valid request");
    let prepared = prepare(body, chat, None, None, None).expect("prepared");
    let model = ModelId::new("m");
    let pick = |id: &str| {
        let worker = ctx.registry().get(&WorkerId::new(id).expect("id")).expect("registered");
        Pick::new(worker, PickReason::RoundRobin)
    };
    let request_id = HeaderValue::from_static("test");
    let path = Endpoint::Chat.path();
    let trace = crate::telemetry::RequestTrace::none();
    let exchange = Exchange { ctx, request_id: &request_id, path, streamed: stream, trace: &trace };
    let d = Dispatch {
        exchange,
        prepared: &prepared,
        model: &model,
        bucket: &HeaderValue::from_static("pd"),
        started: Instant::now(),
    };
    d.run(BucketPick::Pd { prefill: pick("P1"), decode: pick("D1") }).await
}

async fn heard(result: Result<Response, ApiError>) -> Heard {
    let response = match result {
        Ok(response) => response,
        Err(err) => {
            let message = err.body()["error"]["message"].as_str().unwrap_or_default().to_owned();
            return Heard::Error(err.status().as_u16(), leak(message));
        }
    };
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-router-prefill-engine"], "P1");
    assert_eq!(response.headers()["x-router-decode-engine"], "D1");
    let body = response.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    match text.rsplit("data: ").next().filter(|last| last.contains("\"error\"")) {
        Some(event) => {
            let event: serde_json::Value = serde_json::from_str(event.trim()).expect("json");
            Heard::StreamError(leak(event["error"]["message"].as_str().unwrap_or_default().into()))
        }
        None => Heard::Answer(leak(text)),
    }
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

#[tokio::test]
async fn the_pd_decision_table() {
    use Script::*;
    #[rustfmt::skip]
    let cases: [(&str, Script, Script, bool, Heard); 11] = [
        ("both answer", Answer, Answer, false, Heard::Answer(r#"{"choices":[{"message":{"content":"hi"}}]}"#)),
        ("both stream", Answer, Stream, true, Heard::Answer("data: {\"n\":2}\n\ndata: [DONE]\n\n")),
        ("prefill 5xx before the decode head", Fail(0), LateAnswer(500), false,
            Heard::Error(502, "prefill engine P1 failed: engine P1 answered 500: boom")),
        ("prefill refuses", Refuse, LateAnswer(500), false,
            Heard::Error(502, "prefill engine P1 failed: engine P1 refused the request (400): bad request")),
        ("prefill down", Down, LateAnswer(500), false, Heard::Error(502, "prefill engine P1 failed: engine P1 unreachable")),
        ("a decode 5xx explained by its prefill", Fail(200), Fail(0), false,
            Heard::Error(502, "prefill engine P1 failed: engine P1 answered 500")),
        ("a decode 5xx of its own", Answer, Fail(0), false, Heard::Error(502, "decode engine D1 failed: engine D1 answered 500")),
        ("decode down", Answer, Down, false, Heard::Error(502, "decode engine D1 failed: engine D1 unreachable")),
        ("prefill fails mid-stream", Fail(200), SlowStream(800), true,
            Heard::StreamError("prefill engine P1 failed: engine P1 answered 500")),
        ("prefill fails while the whole answer is read", Fail(200), SlowBody(800), false,
            Heard::Error(502, "prefill engine P1 failed: engine P1 answered 500")),
        ("a slow decode answer after a good prefill", Answer, SlowBody(300), false,
            Heard::Answer(r#"{"choices":[{"message":{"content":"hi"}}]}"#)),
    ];
    for (name, prefill, decode, stream, expected) in cases {
        let ctx = context(prefill, decode).await;
        let got = heard(dispatch(&ctx, stream).await).await;
        match (&got, &expected) {
            (Heard::Error(status, message), Heard::Error(want_status, want)) => {
                assert_eq!(status, want_status, "{name}: {message}");
                assert!(message.starts_with(want), "{name}: {message}");
            }
            (Heard::StreamError(message), Heard::StreamError(want)) => {
                assert!(message.starts_with(want), "{name}: {message}");
            }
            (Heard::Answer(body), Heard::Answer(want)) => {
                assert!(body.ends_with(want), "{name}: {body}");
            }
            _ => panic!("{name}: heard {got:?}, expected {expected:?}"),
        }
        // The prefill task may still be winding down after a decode failure: it is aborted,
        // and its guard goes with it.
        for id in ["P1", "D1"] {
            let id = WorkerId::new(id).expect("id");
            let released = async {
                while ctx.inflight().count(&id) > 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(5), released)
                .await
                .unwrap_or_else(|_| panic!("{name}: {id} still in flight"));
        }
    }
}

#[tokio::test]
async fn a_pd_failure_is_never_retried() {
    for (prefill, decode) in
        [(Script::Down, Script::LateAnswer(300)), (Script::Answer, Script::Down)]
    {
        let ctx = context(prefill, decode).await;
        let err = dispatch(&ctx, false).await.expect_err("fails");
        assert!(!err.is_retryable(), "{err:?}");
        assert_eq!(err.kind().1, "engine_unreachable");
    }
}
