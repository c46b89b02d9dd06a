//! Telemetry end to end: the per-engine answer histograms and token counters after whole and
//! streamed answers (OpenAI and SGLang `/generate`), the selection counter, and the W3C trace
//! context: passed to the engine unchanged with export off, and with export on the router's
//! spans reaching a test OTLP receiver (a tonic TraceService) with the engine's `traceparent`
//! naming the router's dispatch span as its parent.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use router_e2e::{Engine, Http, Router, chat_body, pd_router_yaml};
use tokio::sync::Mutex;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const STREAM_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{CLIENT_SPAN}-01")
}

fn plain_config(engine: &Engine, telemetry: &str) -> String {
    format!(
        "server: {{port: 0}}\n{telemetry}models:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\"}}\n    \
         buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    )
}

/// The value of the series `name` whose labels include `labels`, in a `/metrics` text.
fn series(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (labelled, value) = rest.rsplit_once(' ')?;
        if !labelled.is_empty() && !labelled.starts_with('{') {
            return None; // a longer name
        }
        let all = labels.iter().all(|(k, v)| labelled.contains(&format!("{k}=\"{v}\"")));
        all.then(|| value.parse().ok()).flatten()
    })
}

/// A stream's final usage chunk (the last event with a `usage` object).
fn stream_usage(body: &str) -> serde_json::Value {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<serde_json::Value>(data).ok())
        .filter(|chunk| chunk["usage"].is_object())
        .last()
        .map(|chunk| chunk["usage"].clone())
        .unwrap_or_else(|| panic!("no usage chunk in {body}"))
}

#[tokio::test]
async fn answers_are_measured_per_model_and_engine_whole_and_streamed() {
    let engine = Engine::start("m", &["--decode-tokens-per-sec", "200"]);
    let router = Router::with_config(&plain_config(&engine, ""));
    let http = Http::default();

    // A whole answer: its usage is counted, no first-token time.
    let whole = http.chat(&router.url, &chat_body("m", "hello there", 4), &[]).await;
    assert_eq!(whole.status, 200, "{}", whole.body);
    let whole_usage = whole.json()["usage"].clone();
    // A stream with the final usage chunk asked for.
    let mut streamed = chat_body("m", "hello again", 5);
    streamed["stream"] = true.into();
    streamed["stream_options"] = serde_json::json!({"include_usage": true});
    let with_usage = http.chat(&router.url, &streamed, &[]).await;
    assert_eq!(with_usage.status, 200, "{}", with_usage.body);
    let stream_usage = stream_usage(&with_usage.body);
    assert_eq!(stream_usage["completion_tokens"], 5);
    // A stream without usage: timed, not counted.
    let mut bare = chat_body("m", "and again", 3);
    bare["stream"] = true.into();
    let bare = http.chat(&router.url, &bare, &[]).await;
    assert_eq!(bare.status, 200, "{}", bare.body);
    assert!(bare.body.contains("data: [DONE]"), "{}", bare.body);

    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    let labels = [("model", "m"), ("worker", "e1")];
    let value = |name: &str| series(&metrics, name, &labels);
    assert_eq!(value("router_e2e_latency_seconds_count"), Some(3.0), "{metrics}");
    assert_eq!(value("router_time_to_first_token_seconds_count"), Some(2.0), "streams only");
    assert_eq!(value("router_inter_token_latency_seconds_count"), Some(1.0), "streams with usage");
    // Five tokens at 200 per second: gaps of about 5 ms, well under a second.
    let itl = value("router_inter_token_latency_seconds_sum").expect("itl sum");
    assert!(itl > 0.0 && itl < 1.0, "mean inter-token gap {itl}");
    let ttft = value("router_time_to_first_token_seconds_sum").expect("ttft sum");
    let e2e = value("router_e2e_latency_seconds_sum").expect("e2e sum");
    assert!(ttft > 0.0 && ttft < e2e, "ttft {ttft} within e2e {e2e}");
    let tokens = |field: &str| {
        let of = |usage: &serde_json::Value| usage[field].as_f64().expect("a count");
        of(&whole_usage) + of(&stream_usage)
    };
    assert_eq!(value("router_completion_tokens_total"), Some(9.0));
    assert_eq!(value("router_prompt_tokens_total"), Some(tokens("prompt_tokens")));
    let cached = |usage: &serde_json::Value| {
        usage["prompt_tokens_details"]["cached_tokens"].as_f64().unwrap_or(0.0)
    };
    let expected_cached = cached(&whole_usage) + cached(&stream_usage);
    assert_eq!(value("router_cached_tokens_total"), Some(expected_cached));
    let selections = [("worker", "e1"), ("stage", "plain")];
    assert_eq!(series(&metrics, "router_engine_selections_total", &selections), Some(3.0));
    assert!(metrics.contains("# TYPE router_e2e_latency_seconds histogram"), "{metrics}");
}

#[tokio::test]
async fn sglang_generate_counts_come_from_meta_info() {
    let engine = Engine::start("m", &[]);
    let router = Router::with_config(&plain_config(&engine, ""));
    let http = Http::default();
    let json = [("content-type", "application/json")];
    let generate = format!("{}/generate", router.url);
    let body = serde_json::json!({"model": "m", "text": "hi there", "sampling_params": {"max_new_tokens": 3}});
    let whole = http.send("POST", &generate, &json, body.to_string()).await;
    assert_eq!(whole.status, 200, "{}", whole.body);
    let meta = whole.json()["meta_info"].clone();
    assert_eq!(meta["completion_tokens"], 3);
    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    streamed["sampling_params"]["max_new_tokens"] = 2.into();
    let stream = http.send("POST", &generate, &json, streamed.to_string()).await;
    assert_eq!(stream.status, 200, "{}", stream.body);
    assert!(stream.body.contains("meta_info"), "{}", stream.body);

    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    let labels = [("model", "m"), ("worker", "e1")];
    let value = |name: &str| series(&metrics, name, &labels);
    assert_eq!(value("router_completion_tokens_total"), Some(5.0), "{metrics}");
    let prompt = meta["prompt_tokens"].as_f64().expect("prompt tokens");
    // The same prompt twice.
    assert_eq!(value("router_prompt_tokens_total"), Some(2.0 * prompt));
    assert_eq!(value("router_time_to_first_token_seconds_count"), Some(1.0));
    assert_eq!(value("router_inter_token_latency_seconds_count"), Some(1.0));
    assert_eq!(value("router_e2e_latency_seconds_count"), Some(2.0));
}

#[tokio::test]
async fn a_pd_pair_counts_its_decode_engine_and_both_engines_get_the_trace_context() {
    let p = Engine::start("m", &["--role", "prefill", "--bootstrap-port", "0"]);
    let d = Engine::start("m", &["--role", "decode"]);
    let router = Router::with_config(&pd_router_yaml(&p, &d, "", "round_robin"));
    let http = Http::default();
    let parent = traceparent();
    let mut body = chat_body("m", "hello pd", 3);
    body["stream"] = true.into();
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let reply = http.chat(&router.url, &body, &[("traceparent", parent.as_str())]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let usage = stream_usage(&reply.body);
    for engine in [&p, &d] {
        assert_eq!(engine_trace_context(&http, engine).await, (parent.clone(), None));
    }
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    let decode = [("model", "m"), ("worker", "D1")];
    assert_eq!(series(&metrics, "router_time_to_first_token_seconds_count", &decode), Some(1.0));
    assert_eq!(series(&metrics, "router_completion_tokens_total", &decode), Some(3.0));
    let prompt = usage["prompt_tokens"].as_f64().expect("prompt tokens");
    assert_eq!(series(&metrics, "router_prompt_tokens_total", &decode), Some(prompt));
    let prefill = [("model", "m"), ("worker", "P1")];
    assert_eq!(series(&metrics, "router_e2e_latency_seconds_count", &prefill), None, "{metrics}");
    for (worker, stage) in [("P1", "prefill"), ("D1", "decode")] {
        let labels = [("worker", worker), ("stage", stage)];
        assert_eq!(series(&metrics, "router_engine_selections_total", &labels), Some(1.0));
    }
}

/// The trace context the engine last received, from its `GET /sim/state`.
async fn engine_trace_context(http: &Http, engine: &Engine) -> (String, Option<String>) {
    let state = http.get(&engine.url, "/sim/state", &[]).await.json();
    let parent = state["traceparent"].as_str().unwrap_or_else(|| panic!("no traceparent: {state}"));
    (parent.to_owned(), state["tracestate"].as_str().map(str::to_owned))
}

#[tokio::test]
async fn without_export_the_clients_trace_context_reaches_the_engine_unchanged() {
    let engine = Engine::start("m", &[]);
    let router = Router::with_config(&plain_config(&engine, ""));
    let http = Http::default();
    let parent = traceparent();
    let headers = [("traceparent", parent.as_str()), ("tracestate", "vendor=x,other=y")];
    let mut body = chat_body("m", "trace me", 2);
    let reply = http.chat(&router.url, &body, &headers).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        engine_trace_context(&http, &engine).await,
        (parent.clone(), Some("vendor=x,other=y".into()))
    );
    // A streamed request too, with an id of its own echoed back.
    body["stream"] = true.into();
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let reply = http
        .chat(&router.url, &body, &[("traceparent", other), ("x-request-id", "trace-req-1")])
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-request-id"), Some("trace-req-1"));
    assert_eq!(engine_trace_context(&http, &engine).await, (other.to_owned(), None));
}

/// A test OTLP collector: keeps every span exported to it, with its resource's service name.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().await;
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(name) => Some(name.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                spans.extend(scope.spans.into_iter().map(|span| (service.clone(), span)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A span's string (or integer, as text) attribute.
fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()?;
    match value {
        Value::StringValue(text) => Some(text.clone()),
        Value::IntValue(n) => Some(n.to_string()),
        _ => None,
    }
}

#[tokio::test]
async fn with_export_the_routers_spans_reach_the_collector_and_parent_the_engines() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let collector = listener.local_addr().expect("address");
    let receiver = Receiver::default();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(receiver.clone()))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let server = tokio::spawn(server);

    let engine = Engine::start("m", &["--decode-tokens-per-sec", "50"]);
    let telemetry = format!(
        "telemetry: {{otlp_endpoint: \"http://{collector}\", sample_ratio: 1.0, service_name: e2e-router}}\n"
    );
    let router = Router::with_config(&plain_config(&engine, &telemetry));
    let http = Http::default();
    let parent = traceparent();
    let headers = [("traceparent", parent.as_str()), ("tracestate", "vendor=x")];
    let reply = http.chat(&router.url, &chat_body("m", "trace me", 2), &headers).await;
    assert_eq!(reply.status, 200, "{}", reply.body);

    // The engine sees the same trace, below a span of the router's, sampled, tracestate kept.
    let (sent, state) = engine_trace_context(&http, &engine).await;
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(parts.len(), 4, "{sent}");
    assert_eq!((parts[0], parts[1], parts[3]), ("00", TRACE_ID, "01"), "{sent}");
    let dispatch_id = parts[2].to_owned();
    assert_ne!(dispatch_id, CLIENT_SPAN, "the router's span is the engine's parent");
    assert_eq!(state.as_deref(), Some("vendor=x"));

    // A stream of its own trace: 10 tokens at 50 per second.
    let streamed_parent = format!("00-{STREAM_TRACE_ID}-{CLIENT_SPAN}-01");
    let mut streamed = chat_body("m", "stream me", 10);
    streamed["stream"] = true.into();
    let reply =
        http.chat(&router.url, &streamed, &[("traceparent", streamed_parent.as_str())]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);

    // The spans arrive within a few export intervals.
    let mut spans = Vec::new();
    for _ in 0..100 {
        spans = receiver.spans.lock().await.clone();
        let names: Vec<(&str, String)> =
            spans.iter().map(|(_, s)| (s.name.as_str(), hex(&s.trace_id))).collect();
        let all =
            ["/v1/chat/completions", "preparation", "selection", "dispatch"].iter().all(|n| {
                [TRACE_ID, STREAM_TRACE_ID].iter().all(|t| names.contains(&(*n, (*t).to_owned())))
            });
        if all {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let of_trace = |trace: &str, name: &str| {
        spans
            .iter()
            .find(|(_, s)| s.name == name && hex(&s.trace_id) == trace)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| panic!("no {name} span of {trace} among {spans:?}"))
    };
    // The streamed request's span lasts until the stream's end, past its dispatch (which ends
    // at the engine's response head) by most of the 200 ms of decoding.
    let duration = |span: &Span| span.end_time_unix_nano.saturating_sub(span.start_time_unix_nano);
    let stream_request = of_trace(STREAM_TRACE_ID, "/v1/chat/completions");
    let stream_dispatch = of_trace(STREAM_TRACE_ID, "dispatch");
    assert!(
        stream_request.end_time_unix_nano >= stream_dispatch.end_time_unix_nano + 100_000_000,
        "request {} ns, dispatch {} ns",
        duration(&stream_request),
        duration(&stream_dispatch)
    );
    let find = |name: &str| {
        spans
            .iter()
            .filter(|(_, s)| hex(&s.trace_id) == TRACE_ID)
            .find(|(_, s)| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span among {spans:?}"))
    };
    let (service, request) = find("/v1/chat/completions");
    assert_eq!(service, "e2e-router");
    assert_eq!(hex(&request.trace_id), TRACE_ID);
    assert_eq!(hex(&request.parent_span_id), CLIENT_SPAN, "a child of the client's span");
    assert_eq!(attribute(request, "http.response.status_code").as_deref(), Some("200"));
    let request_id = hex(&request.span_id);
    for name in ["preparation", "selection", "dispatch"] {
        let (_, child) = find(name);
        assert_eq!(hex(&child.trace_id), TRACE_ID, "{name}");
        assert_eq!(hex(&child.parent_span_id), request_id, "{name} is the request's child");
    }
    let (_, selection) = find("selection");
    assert_eq!(attribute(selection, "router.bucket").as_deref(), Some("all"));
    assert_eq!(attribute(selection, "router.plain.policy").as_deref(), Some("round_robin"));
    // One engine: the policy had a single candidate.
    assert_eq!(attribute(selection, "router.plain.reason").as_deref(), Some("only_candidate"));
    assert_eq!(attribute(selection, "router.plain.engine").as_deref(), Some("e1"));
    let (_, dispatch) = find("dispatch");
    assert_eq!(hex(&dispatch.span_id), dispatch_id, "the engine's parent is the dispatch span");
    assert_eq!(attribute(dispatch, "router.engine").as_deref(), Some("e1"));
    assert_eq!(attribute(dispatch, "http.response.status_code").as_deref(), Some("200"));
    assert!(
        request.end_time_unix_nano >= dispatch.end_time_unix_nano,
        "the request span outlasts its dispatch: it ends once the answer was sent"
    );
    let (_, preparation) = find("preparation");
    assert_eq!(attribute(preparation, "router.model").as_deref(), Some("m"));
    server.abort();
}
