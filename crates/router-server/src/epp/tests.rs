//! Protocol tests: a tonic client plays Envoy against a real [`EppServer`] on loopback, over
//! every body mode, subset hints, local replies, chunking, fallbacks, PD, the in-flight guard's
//! life and gRPC health. A reset by Envoy (its client gone) is tested end to end with a real
//! Envoy (`tests/tests/epp.rs`): a tonic client cannot reset a call whose request stream it
//! still holds. The engines are never called (Envoy would), so their URLs need not
//! answer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use router_proto::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use router_proto::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use router_proto::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use router_proto::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration, body_mutation, processing_request::Request,
    processing_response::Response,
};
use router_test_support::eventually;
use router_workers::WorkerId;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::endpoints::{DESTINATION_HEADER, PREFILLER_HEADER, SUBSET_KEY, SUBSET_NAMESPACE};
use super::reply::MAX_CHUNK;
use super::{EppServer, EppSettings};
use crate::app::AppContext;
use crate::tests::{context, metric};

/// Three plain engines `a`, `b`, `c` at 10.0.0.1-3:8000 of model `m`, one bucket, `policy`.
fn three_engines(policy: &str) -> String {
    format!(
        "models:\n  - id: m\n    workers:\n      - {{id: a, url: \"http://10.0.0.1:8000\"}}\n      \
         - {{id: b, url: \"http://10.0.0.2:8000\"}}\n      - {{id: c, url: \"http://10.0.0.3:8000\"}}\n    \
         buckets:\n      - {{id: all, groups: {{plain: {{policy: {policy}}}}}}}\n"
    )
}

struct Picker {
    ctx: Arc<AppContext>,
    server: Option<EppServer>,
    url: String,
}

impl Picker {
    async fn start(yaml: &str, fallbacks: usize) -> Self {
        let ctx = context(yaml);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let server = EppServer::start(Arc::clone(&ctx), listener, EppSettings { fallbacks })
            .expect("started");
        let url = format!("http://{}", server.addr);
        Self { ctx, server: Some(server), url }
    }

    async fn open(&self, request_mode: BodySendMode, body_first: bool) -> Stream {
        let mut client = ExternalProcessorClient::connect(self.url.clone()).await.expect("dial");
        let (tx, rx) = mpsc::channel(16);
        let responses = client.process(ReceiverStream::new(rx)).await.expect("stream").into_inner();
        Stream {
            tx,
            responses,
            config: Some(ProtocolConfiguration {
                request_body_mode: request_mode as i32,
                response_body_mode: BodySendMode::FullDuplexStreamed as i32,
                send_body_without_waiting_for_header_response: body_first,
            }),
            subset: None,
        }
    }

    fn inflight(&self, worker: &str) -> u64 {
        self.ctx.inflight().count(&WorkerId::new(worker).expect("id"))
    }

    async fn health(&self, service: &str) -> ServingStatus {
        let channel = tonic::transport::Endpoint::from_shared(self.url.clone())
            .expect("url")
            .connect()
            .await
            .expect("dial");
        let mut client = HealthClient::new(channel);
        let request = HealthCheckRequest { service: service.to_owned() };
        let status = client.check(request).await.expect("health").into_inner().status;
        ServingStatus::try_from(status).expect("a status")
    }
}

impl Drop for Picker {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            drop(tokio::spawn(server.stop(Duration::ZERO)));
        }
    }
}

/// Envoy's side of one stream.
struct Stream {
    tx: mpsc::Sender<ProcessingRequest>,
    responses: Streaming<ProcessingResponse>,
    /// Sent with the first message only.
    config: Option<ProtocolConfiguration>,
    /// Sent with the request headers.
    subset: Option<Kind>,
}

impl Stream {
    async fn send(&mut self, request: Request) {
        let metadata_context = match (&request, self.subset.take()) {
            (Request::RequestHeaders(_), Some(hint)) => Some(subset_metadata(hint)),
            _ => None,
        };
        let message = ProcessingRequest {
            request: Some(request),
            protocol_config: self.config.take(),
            metadata_context,
            ..ProcessingRequest::default()
        };
        self.tx.send(message).await.expect("the picker reads");
    }

    async fn headers(&mut self, path: &str, extra: &[(&str, &str)], end_of_stream: bool) {
        let mut headers =
            vec![(":method", "POST"), (":path", path), ("content-type", "application/json")];
        headers.extend_from_slice(extra);
        let headers = header_map(&headers);
        self.send(Request::RequestHeaders(HttpHeaders {
            headers: Some(headers),
            end_of_stream,
            ..HttpHeaders::default()
        }))
        .await;
    }

    async fn body(&mut self, bytes: &[u8], end_of_stream: bool) {
        self.send(Request::RequestBody(HttpBody { body: bytes.to_vec(), end_of_stream })).await;
    }

    async fn next(&mut self) -> Response {
        let message = tokio::time::timeout(Duration::from_secs(5), self.responses.message())
            .await
            .expect("an answer in time")
            .expect("no stream error")
            .expect("the stream is open");
        message.response.expect("a response")
    }

    /// The next answer with its dynamic metadata.
    async fn next_message(&mut self) -> ProcessingResponse {
        tokio::time::timeout(Duration::from_secs(5), self.responses.message())
            .await
            .expect("an answer in time")
            .expect("no stream error")
            .expect("the stream is open")
    }

    /// Streamed request body answers until one ends the stream; their bytes.
    async fn streamed_body(&mut self, request_side: bool) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let response = self.next().await;
            let common = match (&response, request_side) {
                (Response::RequestBody(b), true) | (Response::ResponseBody(b), false) => {
                    b.response.clone().expect("common")
                }
                other => panic!("expected a body answer, got {other:?}"),
            };
            let Some(body_mutation::Mutation::StreamedResponse(chunk)) =
                common.body_mutation.and_then(|m| m.mutation)
            else {
                panic!("expected a streamed chunk");
            };
            assert!(chunk.body.len() <= MAX_CHUNK, "a chunk of {} bytes", chunk.body.len());
            body.extend_from_slice(&chunk.body);
            if chunk.end_of_stream {
                return body;
            }
        }
    }
}

fn header_map(headers: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: headers
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).to_owned(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

fn subset_metadata(hint: Kind) -> Metadata {
    let fields = BTreeMap::from([(SUBSET_KEY.to_owned(), Value { kind: Some(hint) })]);
    Metadata {
        filter_metadata: [(SUBSET_NAMESPACE.to_owned(), Struct { fields })].into(),
        ..Metadata::default()
    }
}

fn endpoints(items: &[&str]) -> Kind {
    let values =
        items.iter().map(|s| Value { kind: Some(Kind::StringValue((*s).to_owned())) }).collect();
    Kind::ListValue(ListValue { values })
}

fn chat(text: &str) -> Vec<u8> {
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]})
        .to_string()
        .into_bytes()
}

/// The pick a headers or body answer carries: the destination header's value, checked against
/// the `envoy.lb` metadata, the route cache cleared and the client's header removed.
fn pick_of(message: &ProcessingResponse) -> String {
    let common: &CommonResponse = match message.response.as_ref().expect("response") {
        Response::RequestHeaders(h) => h.response.as_ref().expect("common"),
        Response::RequestBody(b) => b.response.as_ref().expect("common"),
        other => panic!("expected a routed answer, got {other:?}"),
    };
    assert!(common.clear_route_cache, "the route cache is cleared");
    let mutation = common.header_mutation.as_ref().expect("header changes");
    assert!(mutation.remove_headers.contains(&DESTINATION_HEADER.to_owned()));
    let header = set_header(common, DESTINATION_HEADER).expect("the destination header");
    let metadata = message.dynamic_metadata.as_ref().expect("dynamic metadata");
    let Some(Kind::StructValue(lb)) = &metadata.fields["envoy.lb"].kind else {
        panic!("envoy.lb is a struct: {metadata:?}")
    };
    let Some(Kind::StringValue(value)) = &lb.fields[DESTINATION_HEADER].kind else {
        panic!("the metadata's destination is a string: {lb:?}")
    };
    assert_eq!(&header, value, "header and metadata agree");
    header
}

fn set_header(common: &CommonResponse, name: &str) -> Option<String> {
    let mutation = common.header_mutation.as_ref()?;
    mutation.set_headers.iter().find_map(|option| {
        let header = option.header.as_ref()?;
        (header.key == name).then(|| String::from_utf8_lossy(&header.raw_value).into_owned())
    })
}

/// The status and JSON body of a local reply.
fn immediate_of(response: Response) -> (i32, serde_json::Value) {
    let Response::ImmediateResponse(reply) = response else {
        panic!("expected a local reply, got {response:?}")
    };
    let body = serde_json::from_slice(&reply.body).expect("a JSON body");
    (reply.status.expect("status").code, body)
}

#[tokio::test]
async fn full_duplex_routes_once_the_body_is_in_and_streams_it_back_in_bounded_chunks() {
    let picker = Picker::start(&three_engines("{type: round_robin}"), 0).await;
    let mut stream = picker.open(BodySendMode::FullDuplexStreamed, true).await;
    // A client's own destination is never honoured.
    stream.headers("/v1/chat/completions", &[(DESTINATION_HEADER, "6.6.6.6:1")], false).await;
    let body = chat(&"x".repeat(200_000));
    let (first, rest) = body.split_at(1000);
    stream.body(first, false).await;
    stream.body(rest, true).await;
    let routed = stream.next_message().await;
    let destination = pick_of(&routed);
    assert!(destination.starts_with("10.0.0."), "{destination}");
    assert_eq!(stream.streamed_body(true).await, body, "the body comes back whole");
    let engine = match destination.as_str() {
        "10.0.0.1:8000" => "a",
        "10.0.0.2:8000" => "b",
        _ => "c",
    };
    assert_eq!(picker.inflight(engine), 1, "the stream holds its engine's in-flight count");

    // The response: its headers gain the engine, its body is echoed chunk by chunk.
    let status = header_map(&[(":status", "200")]);
    stream
        .send(Request::ResponseHeaders(HttpHeaders {
            headers: Some(status),
            end_of_stream: false,
            ..HttpHeaders::default()
        }))
        .await;
    let Response::ResponseHeaders(answer) = stream.next().await else { panic!("headers answer") };
    let common = answer.response.expect("common");
    assert_eq!(set_header(&common, "x-router-engine").as_deref(), Some(engine));
    assert_eq!(set_header(&common, "x-router-bucket").as_deref(), Some("all"));
    let answer_body = vec![b'y'; 70_000];
    stream
        .send(Request::ResponseBody(HttpBody { body: answer_body.clone(), end_of_stream: true }))
        .await;
    assert_eq!(stream.streamed_body(false).await, answer_body);
    assert_eq!(picker.inflight(engine), 1, "held until the stream ends");
    drop(stream);
    eventually("the guard released when Envoy closes the stream", async || {
        picker.inflight(engine) == 0
    })
    .await;
}

#[tokio::test]
async fn trailers_end_a_full_duplex_body_and_are_answered_after_it() {
    let picker = Picker::start(&three_engines("{type: round_robin}"), 0).await;
    let mut stream = picker.open(BodySendMode::FullDuplexStreamed, true).await;
    stream.headers("/v1/chat/completions", &[], false).await;
    let body = chat("hello");
    stream.body(&body, false).await;
    stream.send(Request::RequestTrailers(HttpTrailers { trailers: Some(header_map(&[])) })).await;
    pick_of(&stream.next_message().await);
    let Response::RequestBody(chunk) = stream.next().await else { panic!("a body chunk") };
    let mutation = chunk.response.and_then(|c| c.body_mutation).and_then(|m| m.mutation);
    let Some(body_mutation::Mutation::StreamedResponse(chunk)) = mutation else {
        panic!("streamed")
    };
    assert_eq!((chunk.body, chunk.end_of_stream), (body, false), "the trailers end the body");
    assert!(matches!(stream.next().await, Response::RequestTrailers(_)));
}

#[tokio::test]
async fn buffered_answers_the_headers_at_once_and_routes_on_the_body() {
    let picker = Picker::start(&three_engines("{type: round_robin}"), 0).await;
    let mut stream = picker.open(BodySendMode::Buffered, false).await;
    stream.headers("/v1/chat/completions", &[(DESTINATION_HEADER, "6.6.6.6:1")], false).await;
    let Response::RequestHeaders(answer) = stream.next().await else { panic!("headers answer") };
    let common = answer.response.expect("common");
    assert!(set_header(&common, DESTINATION_HEADER).is_none(), "no pick before the body");
    let removed = &common.header_mutation.expect("changes").remove_headers;
    assert!(removed.contains(&DESTINATION_HEADER.to_owned()), "the client's header is removed");
    stream.body(&chat("hello"), true).await;
    let routed = stream.next_message().await;
    assert!(matches!(routed.response, Some(Response::RequestBody(_))));
    assert!(pick_of(&routed).starts_with("10.0.0."));

    // A body with a router-owned field is replaced, with its new length.
    let mut stream = picker.open(BodySendMode::Buffered, false).await;
    stream.headers("/v1/chat/completions", &[], false).await;
    stream.next().await;
    let body = serde_json::json!({"model": "m", "bootstrap_room": 7, "messages": [{"role": "user", "content": "x"}]});
    stream.body(body.to_string().as_bytes(), true).await;
    let Response::RequestBody(answer) = stream.next().await else { panic!("body answer") };
    let common = answer.response.expect("common");
    let Some(body_mutation::Mutation::Body(replaced)) =
        common.body_mutation.clone().and_then(|m| m.mutation)
    else {
        panic!("the body is replaced")
    };
    let forwarded: serde_json::Value = serde_json::from_slice(&replaced).expect("json");
    assert!(forwarded.get("bootstrap_room").is_none(), "{forwarded}");
    assert_eq!(set_header(&common, "content-length"), Some(replaced.len().to_string()));
}

#[tokio::test]
async fn streamed_routes_on_the_body_when_it_comes_first_else_on_the_headers() {
    let picker = Picker::start(&three_engines("{type: round_robin}"), 0).await;
    let mut stream = picker.open(BodySendMode::Streamed, true).await;
    stream.headers("/v1/chat/completions", &[], false).await;
    let body = chat("hello there");
    let (first, rest) = body.split_at(10);
    stream.body(first, false).await;
    stream.body(rest, true).await;
    pick_of(&stream.next_message().await);
    for _ in 0..2 {
        let Response::RequestBody(answer) = stream.next().await else { panic!("one per chunk") };
        assert!(answer.response.and_then(|c| c.body_mutation).is_none(), "chunks pass as they are");
    }

    let mut stream = picker.open(BodySendMode::Streamed, false).await;
    stream.headers("/v1/chat/completions", &[], false).await;
    pick_of(&stream.next_message().await);
    stream.body(&body, true).await;
    assert!(matches!(stream.next().await, Response::RequestBody(_)));
}

#[tokio::test]
async fn a_request_without_a_body_or_on_another_path_is_routed_from_its_headers() {
    let picker = Picker::start(&three_engines("{type: round_robin}"), 0).await;
    let mut stream = picker.open(BodySendMode::FullDuplexStreamed, true).await;
    stream.headers("/v1/models", &[], true).await;
    assert!(pick_of(&stream.next_message().await).starts_with("10.0.0."));

    let mut stream = picker.open(BodySendMode::FullDuplexStreamed, true).await;
    stream.headers("/v1/audio/transcriptions", &[], false).await;
    pick_of(&stream.next_message().await);
    stream.body(b"not json at all", true).await;
    assert_eq!(stream.streamed_body(true).await, b"not json at all", "echoed as it came");
}

#[tokio::test]
async fn the_subset_hint_limits_the_pick_and_an_empty_or_unknown_subset_is_503() {
    let picker = Picker::start(&three_engines("{type: round_robin}"), 2).await;
    for _ in 0..4 {
        let mut stream = picker.open(BodySendMode::FullDuplexStreamed, true).await;
        stream.subset = Some(endpoints(&["10.0.0.2:8000", "10.0.0.3:8000"]));
        stream.headers("/v1/chat/completions", &[], false).await;
        stream.body(&chat("hi"), true).await;
        let destination = pick_of(&stream.next_message().await);
        let named: Vec<&str> = destination.split(',').collect();
        assert_eq!(named.len(), 2, "the pick and one fallback: the subset has two: {destination}");
        assert!(!named.contains(&"10.0.0.1:8000"), "{destination}");
    }
    for hint in [endpoints(&[]), endpoints(&["10.9.9.9:1"])] {
        let mut stream = picker.open(BodySendMode::FullDuplexStreamed, true).await;
        stream.subset = Some(hint);
        stream.headers("/v1/chat/completions", &[], false).await;
        stream.body(&chat("hi"), true).await;
        let (status, body) = immediate_of(stream.next().await);
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "no_candidates", "{body}");
    }
    assert!(
        metric("router_epp_immediate_responses_total", &[("status", "503")]).unwrap_or(0.0) >= 2.0
    );
}

#[tokio::test]
async fn fallbacks_follow_the_pick_in_turn_without_disturbing_the_rotation() {
    let picker = Picker::start(&three_engines("{type: round_robin}"), 2).await;
    let mut primaries = Vec::new();
    for _ in 0..3 {
        let mut stream = picker.open(BodySendMode::FullDuplexStreamed, true).await;
        stream.headers("/v1/chat/completions", &[], false).await;
        stream.body(&chat("hi"), true).await;
        let destination = pick_of(&stream.next_message().await);
        let mut named: Vec<&str> = destination.split(',').collect();
        primaries.push(named[0].to_owned());
        named.sort_unstable();
        assert_eq!(named, ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"], "{destination}");
    }
    primaries.sort();
    primaries.dedup();
    assert_eq!(primaries.len(), 3, "the rotation visits every engine first: {primaries:?}");
}

#[tokio::test]
async fn a_bad_request_is_400_and_admission_rejecting_everything_is_429() {
    let picker = Picker::start(&three_engines("{type: round_robin}"), 0).await;
    let mut stream = picker.open(BodySendMode::FullDuplexStreamed, true).await;
    stream.headers("/v1/chat/completions", &[], false).await;
    stream.body(b"{\"model\": \"m\", \"messages\": 3}", true).await;
    let (status, body) = immediate_of(stream.next().await);
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(body["error"]["param"], "messages", "{body}");

    let capped = three_engines("{type: round_robin, admission: {max_inflight_requests: 0}}");
    let picker = Picker::start(&capped, 0).await;
    let mut stream = picker.open(BodySendMode::FullDuplexStreamed, true).await;
    stream.headers("/v1/chat/completions", &[], false).await;
    stream.body(&chat("hi"), true).await;
    let (status, body) = immediate_of(stream.next().await);
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "no_admissible_engine", "{body}");
}

#[tokio::test]
async fn a_pd_pair_routes_to_decode_and_names_prefill_for_the_sidecar() {
    let yaml = "models:\n  - id: m\n    workers:\n      \
        - {id: p, url: \"http://10.0.1.1:8000\", role: prefill, bootstrap_port: 8998}\n      \
        - {id: d, url: \"http://10.0.2.1:8000\", role: decode}\n    buckets:\n      \
        - {id: pd, groups: {pd: {prefill: {policy: {type: round_robin}}, decode: {policy: {type: round_robin}}}}}\n";
    let picker = Picker::start(yaml, 1).await;
    let mut stream = picker.open(BodySendMode::FullDuplexStreamed, true).await;
    stream.headers("/v1/chat/completions", &[(PREFILLER_HEADER, "6.6.6.6:1")], false).await;
    stream.body(&chat("hi"), true).await;
    let routed = stream.next_message().await;
    assert_eq!(pick_of(&routed), "10.0.2.1:8000", "decode is routed; no other decode engine");
    let Some(Response::RequestHeaders(answer)) = routed.response else { panic!("headers") };
    let common = answer.response.expect("common");
    assert_eq!(set_header(&common, PREFILLER_HEADER).as_deref(), Some("10.0.1.1:8000"));
    assert_eq!((picker.inflight("p"), picker.inflight("d")), (1, 1), "both engines count it");
    drop(stream);
    eventually("both guards released", async || picker.inflight("p") + picker.inflight("d") == 0)
        .await;
}

#[tokio::test]
async fn health_serves_liveness_and_readiness_follows_the_candidates() {
    let picker = Picker::start(&three_engines("{type: round_robin}"), 0).await;
    assert_eq!(picker.health("liveness").await, ServingStatus::Serving);
    for service in ["readiness", "envoy.service.ext_proc.v3.ExternalProcessor"] {
        eventually("ready with candidates", async || {
            picker.health(service).await == ServingStatus::Serving
        })
        .await;
    }
    let none = "models:\n  - id: m\n    workers: [{id: a, url: \"http://10.0.0.1:8000\"}]\n    \
        buckets:\n      - {id: all, groups: {plain: {worker_ids: []}}}\n";
    let unready = Picker::start(none, 0).await;
    assert_eq!(unready.health("liveness").await, ServingStatus::Serving);
    // The rule the reporter re-evaluates every check holds no candidates unready, so the status
    // it started with stands (no wait for an evaluation that changes nothing).
    let mut heard = std::collections::HashSet::new();
    assert!(!super::health::is_ready(&unready.ctx, &mut heard), "no candidates, never ready");
    assert_eq!(unready.health("readiness").await, ServingStatus::NotServing);
    assert_eq!(
        unready.health("envoy.service.ext_proc.v3.ExternalProcessor").await,
        ServingStatus::NotServing
    );
}
