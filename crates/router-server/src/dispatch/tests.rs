//! A plain dispatch on in-process scripted engines: the head check (a 5xx is the engine's
//! failure with its words, a refused credential is never passed on as the client's, any other
//! 4xx is the client's answer), reading a whole answer (success, several frames, a stall, too
//! large, a body that breaks off), a stream, and what each tells the circuit breaker and the
//! failure counter, with the in-flight guard released at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use router_buckets::BucketPick;
use router_policies::{Pick, PickReason};
use router_workers::{ModelId, Worker, WorkerId};

use super::{Dispatch, EngineRequest, Exchange, WHOLE_ANSWER_LIMIT};
use router_test_support::nothing_listens;

use crate::app::AppContext;
use crate::error::{ApiError, EngineError};
use crate::forward::{Outcome, OutcomeSink as _};
use crate::tests::{context, metric, one_model, prepared, serve, text};
use router_prepare::Endpoint;

const JSON: &str = r#"{"choices":[{"message":{"content":"hi"}}]}"#;

/// What a scripted engine does with a chat request.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// This status with this body.
    Answer(u16, &'static str),
    /// 200, the body in these frames.
    Frames(&'static [&'static str]),
    /// 200 SSE: two events and `[DONE]`.
    Stream,
    /// 200 promising 1000 bytes, then the connection closes after a few (a raw socket: an
    /// axum engine cannot be made to send half its body on purpose).
    Breaks,
    /// 200 with a body one MiB over what the router buffers.
    Huge,
    /// This status, then a body that never comes.
    Stalls(u16),
    /// 200, then one byte a second, forever.
    Trickles,
    /// Nothing listens.
    Down,
}

async fn respond(script: Script) -> Response {
    let stream = |frames: Vec<Result<Bytes, std::io::Error>>| {
        Body::from_stream(futures::stream::iter(frames))
    };
    match script {
        Script::Answer(status, body) => {
            let status = StatusCode::from_u16(status).expect("status");
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Script::Frames(frames) => {
            stream(frames.iter().map(|f| Ok(Bytes::from_static(f.as_bytes()))).collect())
                .into_response()
        }
        Script::Stream => {
            let events = ["data: {\"n\":1}\n\n", "data: {\"n\":2}\n\n", "data: [DONE]\n\n"];
            let frames = events.iter().map(|e| Ok(Bytes::from_static(e.as_bytes()))).collect();
            ([(header::CONTENT_TYPE, "text/event-stream")], stream(frames)).into_response()
        }
        Script::Huge => {
            let mib = Bytes::from(vec![b'x'; 1 << 20]);
            let frames = std::iter::repeat_n(mib, (WHOLE_ANSWER_LIMIT >> 20) + 1);
            Body::from_stream(futures::stream::iter(frames.map(Ok::<_, std::io::Error>)))
                .into_response()
        }
        Script::Stalls(status) => {
            let status = StatusCode::from_u16(status).expect("status");
            let never = futures::stream::pending::<Result<Bytes, std::io::Error>>();
            (status, Body::from_stream(never)).into_response()
        }
        Script::Trickles => {
            let bytes = futures::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Some((Ok::<_, std::io::Error>(Bytes::from_static(b" ")), ()))
            });
            (StatusCode::OK, Body::from_stream(bytes)).into_response()
        }
        Script::Down | Script::Breaks => unreachable!("not an axum engine"),
    }
}

/// An engine that reads one request, sends a head promising 1000 bytes and 11 of them, and
/// closes the connection.
async fn breaking_engine() -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        // The head, then as many body bytes as it declares.
        let body_start = loop {
            let read = socket.read(&mut buffer).await.expect("read");
            request.extend_from_slice(&buffer[..read]);
            if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
        };
        let head = String::from_utf8_lossy(&request[..body_start]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0);
        while request.len() < body_start + length {
            let read = socket.read(&mut buffer).await.expect("read");
            request.extend_from_slice(&buffer[..read]);
        }
        let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                      content-length: 1000\r\n\r\n{\"choices\":";
        socket.write_all(answer.as_bytes()).await.expect("write");
        socket.shutdown().await.expect("shutdown");
    });
    format!("http://{address}")
}

/// A context serving model `model` from one scripted engine `id`, whose breaker opens at two
/// failures and has one on record already (see [`heard`]).
async fn engine(model: &str, id: &str, script: Script) -> (Arc<AppContext>, Arc<Worker>) {
    let url = match script {
        Script::Down => nothing_listens(),
        Script::Breaks => breaking_engine().await,
        _ => {
            let chat = axum::routing::post(move || respond(script));
            serve(axum::Router::new().route("/v1/chat/completions", chat)).await
        }
    };
    let yaml = one_model(
        "server: {engine_idle_timeout_secs: 5, answer_timeout_secs: 8}\nhealth: {breaker_failures: 2}",
        model,
        &format!("[{{id: {id}, url: \"{url}\"}}]"),
        "{type: round_robin}",
    );
    let ctx = context(&yaml);
    let worker = ctx.registry().get(&WorkerId::new(id).expect("id")).expect("registered");
    ctx.health().record(&worker, Outcome::Failure);
    (ctx, worker)
}

/// What the circuit breaker heard of the dispatch, read off its state: the engine had one
/// failure on record and the breaker opens at two, so a failure opens it, an unreachable
/// engine is unhealthy with the breaker closed, a success forgets the earlier failure (one
/// more does not open it) and silence keeps it (one more does).
fn heard(ctx: &AppContext, worker: &Worker) -> Option<Outcome> {
    use crate::health::BreakerState;
    if ctx.health().breaker(worker.id()) == BreakerState::Open {
        return Some(Outcome::Failure);
    }
    if !worker.is_healthy() {
        return Some(Outcome::Unreachable);
    }
    ctx.health().record(worker, Outcome::Failure);
    match ctx.health().breaker(worker.id()) {
        BreakerState::Open => None,
        _ => Some(Outcome::Success),
    }
}

/// An engine request with an empty JSON body, no rank and no edit.
fn empty_request() -> EngineRequest {
    EngineRequest { body: Bytes::from_static(b"{}"), rank_header: None, edit: Default::default() }
}

fn exchange<'a>(ctx: &'a Arc<AppContext>, stream: bool) -> Exchange<'a> {
    static REQUEST_ID: HeaderValue = HeaderValue::from_static("test");
    static TRACE: crate::telemetry::RequestTrace = crate::telemetry::RequestTrace::none();
    Exchange {
        ctx,
        request_id: &REQUEST_ID,
        path: Endpoint::Chat.path(),
        streamed: stream,
        trace: &TRACE,
    }
}

async fn dispatch(
    ctx: &Arc<AppContext>,
    model: &str,
    pick: Pick,
    stream: bool,
) -> Result<Response, ApiError> {
    let prepared = prepared(model, stream);
    let model = ModelId::new(model);
    let d = Dispatch {
        exchange: exchange(ctx, stream),
        prepared: &prepared,
        model: &model,
        bucket: &HeaderValue::from_static("all"),
        started: Instant::now(),
    };
    d.run(BucketPick::Plain(pick)).await
}

/// What the client hears: a status and the body, or for an error its message.
#[derive(Debug, PartialEq)]
enum Client {
    Answer(u16, String),
    Error(u16, String),
}

/// One row: the engine's script, whether the client streams, what it hears, what the breaker
/// hears, and the failure counted (`router_engine_failures_total{kind}`).
type Row = (&'static str, Script, bool, Client, Option<Outcome>, Option<&'static str>);

#[tokio::test]
async fn what_the_client_and_the_breaker_hear_of_a_plain_dispatch() {
    use Client::{Answer, Error};
    use Outcome::{Failure, Success, Unreachable};
    let sse = "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n";
    let too_large = format!("engine {{id}} answered more than {WHOLE_ANSWER_LIMIT} bytes");
    #[rustfmt::skip]
    let rows: Vec<Row> = vec![
        ("a whole answer", Script::Answer(200, JSON), false, Answer(200, JSON.into()), Some(Success), None),
        ("an answer in frames", Script::Frames(&["{\"a\":", "1}"]), false, Answer(200, "{\"a\":1}".into()), Some(Success), None),
        ("a client error is the client's answer", Script::Answer(400, "bad field"), false,
            Answer(400, "bad field".into()), Some(Success), None),
        ("a rate limit declines the request, with the engine's status", Script::Answer(429, "slow down"), false,
            Error(429, "engine {id} declined the request (429): slow down".into()), None, Some("declined")),
        ("so does an overloaded engine, which counts against it", Script::Answer(503, "  overloaded here\n"), false,
            Error(503, "engine {id} declined the request (503): overloaded here".into()), Some(Failure), Some("declined")),
        ("another server error, in the engine's words", Script::Answer(500, "  broken here\n"), false,
            Error(502, "engine {id} answered 500: broken here".into()), Some(Failure), Some("status")),
        ("a refused credential is not the client's", Script::Answer(401, "bad key"), false,
            Error(502, "engine {id} refused the router's credentials (401); check the worker's api_key".into()),
            None, Some("credentials")),
        ("nor is a forbidden one", Script::Answer(403, "no"), false,
            Error(502, "engine {id} refused the router's credentials (403)".into()), None, Some("credentials")),
        ("a stream", Script::Stream, true, Answer(200, sse.into()), Some(Success), None),
        ("a stream refused with a client error comes whole", Script::Answer(400, "bad field"), true,
            Answer(400, "bad field".into()), Some(Success), None),
        ("a body that breaks off", Script::Breaks, false,
            Error(502, "engine {id} failed mid-response".into()), Some(Failure), Some("transport")),
        ("an answer too large to buffer", Script::Huge, false, Error(502, too_large), Some(Failure), Some("too_large")),
        ("nothing listens", Script::Down, false, Error(502, "engine {id} unreachable".into()), Some(Unreachable), Some("unreachable")),
    ];
    for (i, (name, script, stream, expected, outcome, failure)) in rows.into_iter().enumerate() {
        let id = format!("plain-{i}");
        let (ctx, worker) = engine("plain", &id, script).await;
        let pick = Pick::new(Arc::clone(&worker), PickReason::OnlyCandidate);
        let got = match dispatch(&ctx, "plain", pick, stream).await {
            Ok(response) => {
                assert_eq!(response.headers()["x-router-engine"], id.as_str(), "{name}");
                assert_eq!(response.headers()["x-router-bucket"], "all", "{name}");
                Answer(response.status().as_u16(), text(response).await)
            }
            Err(err) => {
                let message = err.body()["error"]["message"].as_str().unwrap_or_default().into();
                Error(err.status().as_u16(), message)
            }
        };
        match (&got, &expected) {
            (Error(status, message), Error(want_status, want)) => {
                assert_eq!(status, want_status, "{name}: {message}");
                let want = want.replace("{id}", &id);
                assert!(message.starts_with(&want), "{name}: {message:?}, expected {want:?}");
            }
            _ => assert_eq!(got, expected, "{name}"),
        }
        assert_eq!(ctx.inflight().count(worker.id()), 0, "{name}: the guard outlived the dispatch");
        assert_eq!(heard(&ctx, &worker), outcome, "{name}");
        let failures =
            |kind: &str| metric("router_engine_failures_total", &[("worker", &id), ("kind", kind)]);
        match failure {
            Some(kind) => assert_eq!(failures(kind), Some(1.0), "{name}"),
            None => assert_eq!(metric("router_engine_failures_total", &[("worker", &id)]), None),
        }
    }
}

#[tokio::test]
async fn an_engine_silent_after_its_head_is_a_timeout_and_its_failure() {
    let (ctx, worker) = engine("stall", "stalls-1", Script::Stalls(200)).await;
    let x = exchange(&ctx, false);
    let upstream = x.send(&worker, empty_request()).await.expect("a head");
    let (_, body) = x.checked(&worker, upstream).await.expect("a 200");
    tokio::time::pause();
    let started = tokio::time::Instant::now();
    let err = x.read_answer(&worker, body, std::time::Instant::now()).await.expect_err("stalls");
    assert!(started.elapsed() >= Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(
        matches!(&err, EngineError::Stalled { silence, .. } if *silence == Duration::from_secs(5)),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "engine stalls-1 sent nothing for 5 s");
    let err = ApiError::Engine(err);
    assert_eq!((err.status().as_u16(), err.kind().1), (504, "engine_timeout"));
    assert_eq!(heard(&ctx, &worker), Some(Outcome::Failure));
    let stalled = [("worker", "stalls-1"), ("kind", "stalled")];
    assert_eq!(metric("router_engine_failures_total", &stalled), Some(1.0));
}

/// Found attacking the router: an engine trickling a byte a second held a whole answer
/// forever (only the silence between bytes was bounded).
#[tokio::test]
async fn an_engine_trickling_its_answer_is_cut_off_at_the_answer_deadline() {
    let (ctx, worker) = engine("trickle", "trickles-1", Script::Trickles).await;
    let pick = Pick::new(Arc::clone(&worker), PickReason::OnlyCandidate);
    let started = std::time::Instant::now();
    let err = dispatch(&ctx, "trickle", pick, false).await.expect_err("overdue");
    let elapsed = started.elapsed();
    assert!(
        matches!(&err, ApiError::Engine(EngineError::Overdue { limit, .. }) if *limit == Duration::from_secs(8)),
        "{err:?} after {elapsed:?}"
    );
    assert_eq!((err.status().as_u16(), err.kind().1), (504, "engine_timeout"));
    let overdue = [("worker", "trickles-1"), ("kind", "overdue")];
    assert_eq!(metric("router_engine_failures_total", &overdue), Some(1.0));
}

#[tokio::test]
async fn a_server_error_whose_body_never_comes_is_still_reported() {
    let (ctx, worker) = engine("stall", "stalls-2", Script::Stalls(500)).await;
    let x = exchange(&ctx, false);
    let upstream = x.send(&worker, empty_request()).await.expect("a head");
    tokio::time::pause();
    let err = x.checked(&worker, upstream).await.expect_err("a 500");
    assert_eq!(err.to_string(), "engine stalls-2 answered 500: (no body)");
    assert_eq!(heard(&ctx, &worker), Some(Outcome::Failure));
}

#[tokio::test]
async fn a_long_error_body_is_cut_to_its_first_kibibyte() {
    static PAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let page = PAGE.get_or_init(|| format!("{}{}", "a".repeat(1024), "b".repeat(3000)));
    let (ctx, worker) = engine("long", "long-1", Script::Answer(500, page)).await;
    let pick = Pick::new(Arc::clone(&worker), PickReason::OnlyCandidate);
    let err = dispatch(&ctx, "long", pick, false).await.expect_err("a 500");
    let ApiError::Engine(EngineError::Status { text, status, .. }) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(text, &"a".repeat(1024), "the start of the engine's words, not none of them");
}

#[tokio::test]
async fn a_stream_holds_its_guard_and_reports_the_first_byte_beside_the_prediction() {
    let (ctx, worker) = engine("ttft", "ttft-1", Script::Stream).await;
    let pick =
        Pick::new(Arc::clone(&worker), PickReason::PredictedTtft).with_predicted_ttft_ms(250.0);
    let response = dispatch(&ctx, "ttft", pick, true).await.expect("a stream");
    let model = [("model", "ttft")];
    assert_eq!(ctx.inflight().count(worker.id()), 1, "the stream holds its guard");
    assert_eq!(metric("router_observed_ttft_seconds_count", &model), None, "no byte yet");
    assert!(text(response).await.ends_with("data: [DONE]\n\n"));
    assert_eq!(ctx.inflight().count(worker.id()), 0, "released at the end");
    assert_eq!(metric("router_predicted_ttft_seconds_sum", &model), Some(0.25));
    assert_eq!(metric("router_observed_ttft_seconds_count", &model), Some(1.0));
    assert_eq!(metric("router_ttft_observed_over_predicted_ratio_count", &model), Some(1.0));
    assert_eq!(metric("router_upstream_head_seconds_count", &model), Some(1.0));

    // A whole answer has no first byte to compare.
    let (ctx, worker) = engine("ttft-whole", "ttft-2", Script::Answer(200, JSON)).await;
    let pick =
        Pick::new(Arc::clone(&worker), PickReason::PredictedTtft).with_predicted_ttft_ms(250.0);
    let response = dispatch(&ctx, "ttft-whole", pick, false).await.expect("an answer");
    assert_eq!(text(response).await, JSON);
    assert_eq!(metric("router_predicted_ttft_seconds_count", &[("model", "ttft-whole")]), None);
}
