//! The streaming body guard on scripted engine bodies: coalescing, mid-stream failure, a
//! stalled engine, a failed prefill partner, the end and a client that leaves; each case with
//! the outcome the circuit breaker hears and whether the in-flight guard is released.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use router_state_load::{Inflight, SystemClock};
use router_workers::{ModelId, Stage, Worker, WorkerId};
use tokio::sync::oneshot;

use super::{AnswerMetrics, COALESCE_LIMIT, COALESCE_ROUNDS, GuardedBody, QUIET_POLLS};
use crate::error::{ApiError, EngineError};
use crate::forward::{Outcome, OutcomeSink};

/// One step of a scripted engine body.
enum Step {
    Data(&'static str),
    Big(usize),
    Pending,
    Fail,
}

/// An engine body that plays its steps, one per poll; `Pending` wakes itself so the next
/// poll moves on. After the last step it ends, or stays silent when `stall` is set.
struct Scripted {
    steps: VecDeque<Step>,
    stall: bool,
}

impl Scripted {
    fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self { steps: steps.into_iter().collect(), stall: false }
    }

    fn stalling(steps: impl IntoIterator<Item = Step>) -> Self {
        Self { stall: true, ..Self::new(steps) }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("connection reset by the engine")]
struct Reset;

impl Body for Scripted {
    type Data = Bytes;
    type Error = Reset;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Reset>>> {
        match self.steps.pop_front() {
            Some(Step::Data(text)) => Poll::Ready(Some(Ok(Frame::data(Bytes::from(text))))),
            Some(Step::Big(len)) => {
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; len])))))
            }
            Some(Step::Pending) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Some(Step::Fail) => Poll::Ready(Some(Err(Reset))),
            None if self.stall => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

/// The circuit breaker's side: every outcome heard.
#[derive(Default)]
struct Recording(Mutex<Vec<Outcome>>);

impl OutcomeSink for Recording {
    fn record(&self, _: &Worker, outcome: Outcome) {
        self.0.lock().push(outcome);
    }
}

/// The prefill work (uncached tokens) each fixture stream was dispatched with.
const PREFILL_WORK: u64 = 700;

struct Fixture {
    inflight: Inflight,
    sink: Arc<Recording>,
    worker: Arc<Worker>,
}

impl Fixture {
    fn new() -> Self {
        let worker = Worker::plain("e1", "http://127.0.0.1:9", &ModelId::new("m")).expect("valid");
        Self {
            inflight: Inflight::new(Arc::new(SystemClock)),
            sink: Arc::default(),
            worker: Arc::new(worker),
        }
    }

    fn body(
        &self,
        engine: Scripted,
        partner: Option<oneshot::Receiver<ApiError>>,
    ) -> GuardedBody<Scripted> {
        self.measured(engine, partner, None)
    }

    fn measured(
        &self,
        engine: Scripted,
        partner: Option<oneshot::Receiver<ApiError>>,
        metrics: Option<AnswerMetrics>,
    ) -> GuardedBody<Scripted> {
        let guard = self.inflight.acquire_work(self.worker.id(), Stage::Plain, PREFILL_WORK);
        let sink: Arc<dyn OutcomeSink> = self.sink.clone();
        let idle = Duration::from_secs(300);
        let worker = Arc::clone(&self.worker);
        GuardedBody::new(engine, vec![guard], worker, sink, idle, partner, metrics)
    }

    fn held(&self) -> u64 {
        self.inflight.count(self.worker.id())
    }

    fn outcomes(&self) -> Vec<Outcome> {
        self.sink.0.lock().clone()
    }
}

/// Every frame the client receives, as text.
async fn frames(mut body: GuardedBody<Scripted>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let data = frame.expect("the guard never fails").into_data().expect("data");
        out.push(String::from_utf8_lossy(&data).into_owned());
    }
    out
}

fn error_event(frame: &str) -> serde_json::Value {
    let json = frame.strip_prefix("data: ").and_then(|f| f.strip_suffix("\n\n")).expect("event");
    serde_json::from_str(json).expect("json event")
}

#[tokio::test]
async fn arrived_frames_go_out_as_one_write_and_a_pending_engine_is_not_waited_for() {
    let fixture = Fixture::new();
    // A frame after one `Pending` came while the stream yielded; `QUIET_POLLS` of them in a
    // row are a turn of the event loop that brought nothing, and the batch goes out.
    let quiet = (0..=QUIET_POLLS).map(|_| Step::Pending);
    let engine = Scripted::new(
        [Step::Data("data: 1\n\n"), Step::Data("data: 2\n\n"), Step::Pending]
            .into_iter()
            .chain([Step::Data("data: 3\n\n")])
            .chain(quiet)
            .chain([Step::Data("data: 4\n\n")]),
    );
    let got = frames(fixture.body(engine, None).handed_over_by_a_task()).await;
    assert_eq!(got, ["data: 1\n\ndata: 2\n\ndata: 3\n\n", "data: 4\n\n"]);
    assert_eq!(fixture.outcomes(), [Outcome::Success]);
    assert_eq!(fixture.held(), 0, "the guard is released at the end");
}

#[tokio::test]
async fn a_body_that_reads_its_socket_sends_what_it_has_at_its_first_pending() {
    let fixture = Fixture::new();
    let engine = Scripted::new([
        Step::Data("data: 1\n\n"),
        Step::Data("data: 2\n\n"),
        Step::Pending,
        Step::Data("data: 3\n\n"),
        Step::Pending,
        Step::Pending,
        Step::Data("data: 4\n\n"),
    ]);
    let got = frames(fixture.body(engine, None)).await;
    assert_eq!(got, ["data: 1\n\ndata: 2\n\n", "data: 3\n\n", "data: 4\n\n"]);
    assert_eq!(fixture.outcomes(), [Outcome::Success]);
}

#[tokio::test]
async fn the_first_frame_releases_the_prefill_work_and_the_end_the_request() {
    let fixture = Fixture::new();
    let engine = Scripted::stalling([Step::Pending, Step::Data("data: 1\n\n")]);
    let mut body = fixture.body(engine, None);
    let work = || fixture.inflight.inflight_tokens(fixture.worker.id());
    assert_eq!(work(), PREFILL_WORK, "no first token yet: the prefill is still to do");
    let first = body.frame().await.expect("a frame").expect("never fails");
    assert_eq!(first.into_data().expect("data"), "data: 1\n\n");
    assert_eq!(work(), 0, "the first token came: the prefill is done");
    assert_eq!(fixture.held(), 1, "the request is still in flight");
    drop(body);
    assert_eq!((work(), fixture.held()), (0, 0));
}

#[tokio::test]
async fn a_lone_frame_goes_out_uncopied() {
    static EVENT: &str = "data: 1\n\n";
    let fixture = Fixture::new();
    let mut body = fixture.body(Scripted::new([Step::Data(EVENT)]), None);
    let frame = body.frame().await.expect("a frame").expect("never fails");
    let data = frame.into_data().expect("data");
    assert_eq!(data.as_ptr(), EVENT.as_ptr(), "the engine's own bytes");
}

#[tokio::test]
async fn a_batch_waits_a_bounded_number_of_rounds_for_more() {
    let fixture = Fixture::new();
    // A frame in every round from a task-fed body: the batch goes out after its last round
    // all the same.
    let rounds = usize::from(COALESCE_ROUNDS);
    let engine = Scripted::new(
        (0..rounds + 3).flat_map(|_| [Step::Data("x"), Step::Pending]).collect::<Vec<_>>(),
    );
    let got = frames(fixture.body(engine, None).handed_over_by_a_task()).await;
    let lengths: Vec<usize> = got.iter().map(String::len).collect();
    assert_eq!(lengths, [rounds + 1, 2], "{rounds} rounds after the first frame, then the rest");
}

#[tokio::test]
async fn coalescing_stops_at_its_limit() {
    let fixture = Fixture::new();
    let engine = Scripted::new([Step::Big(COALESCE_LIMIT - 1), Step::Big(10), Step::Big(10)]);
    let got = frames(fixture.body(engine, None)).await;
    let lengths: Vec<usize> = got.iter().map(String::len).collect();
    assert_eq!(lengths, [COALESCE_LIMIT + 9, 10]);
}

#[tokio::test]
async fn a_mid_stream_failure_is_an_error_event_and_the_engines_failure() {
    let fixture = Fixture::new();
    let engine = Scripted::new([Step::Data("data: 1\n\n"), Step::Pending, Step::Fail]);
    let got = frames(fixture.body(engine, None)).await;
    assert_eq!(got.len(), 2, "{got:?}");
    let event = error_event(&got[1]);
    assert_eq!(event["error"]["code"], "engine_failed", "{event}");
    let message = event["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("e1 failed mid-response: connection reset"), "{message}");
    assert_eq!(fixture.outcomes(), [Outcome::Failure]);
    assert_eq!(fixture.held(), 0);
}

/// Found attacking the router: an engine dying mid-event had the error event glued onto half
/// an event (`data: {"partialdata: {"error":...}}`), which no client can parse. Only whole
/// events pass now, so every `data:` line the client gets is JSON.
#[tokio::test]
async fn an_engine_dying_mid_event_leaves_only_whole_events_and_the_error_event() {
    let fixture = Fixture::new();
    let engine = Scripted::new([
        Step::Data("data: {\"a\":1}\n\ndata: {\"b\""),
        Step::Pending,
        Step::Data(":2}\n\ndata: {\"partial"),
        Step::Pending,
        Step::Fail,
    ]);
    let got = frames(fixture.body(engine, None).sse_events()).await;
    let text = got.concat();
    assert!(!text.contains("partial"), "the cut event is dropped: {text:?}");
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|err| panic!("{line:?} is no JSON ({err}) in {text:?}"));
    }
    assert!(text.starts_with("data: {\"a\":1}\n\ndata: {\"b\":2}\n\n"), "{text:?}");
    assert_eq!(error_event(got.last().expect("frames"))["error"]["code"], "engine_failed");

    // CRLF events and an unterminated last event at a normal end pass on as they are.
    let engine =
        Scripted::new([Step::Data("data: 1\r\n\r\ndata: "), Step::Pending, Step::Data("2")]);
    let got = frames(Fixture::new().body(engine, None).sse_events()).await;
    assert_eq!(got.concat(), "data: 1\r\n\r\ndata: 2");
}

#[tokio::test(start_paused = true)]
async fn an_engine_silent_past_its_idle_limit_ends_the_stream_as_a_timeout() {
    let fixture = Fixture::new();
    let body = fixture.body(Scripted::stalling([Step::Data("data: 1\n\n")]), None);
    let started = tokio::time::Instant::now();
    let got = frames(body).await;
    assert!(started.elapsed() >= Duration::from_secs(300), "{:?}", started.elapsed());
    assert_eq!(got.len(), 2, "{got:?}");
    let event = error_event(&got[1]);
    assert_eq!(event["error"]["code"], "engine_timeout", "{event}");
    assert_eq!(fixture.outcomes(), [Outcome::Failure]);
    assert_eq!(fixture.held(), 0);
}

/// A stream whose first byte does not come by its deadline ends there, well before the idle
/// limit; once the first byte came, only the idle limit counts.
#[tokio::test(start_paused = true)]
async fn a_stream_without_its_first_byte_by_the_deadline_ends_as_a_timeout() {
    let fixture = Fixture::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let body = fixture.body(Scripted::stalling([]), None).first_frame_by(deadline);
    let started = tokio::time::Instant::now();
    let got = frames(body).await;
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(20) && waited < Duration::from_secs(300), "{waited:?}");
    assert_eq!(error_event(&got[0])["error"]["code"], "engine_timeout", "{got:?}");

    let fixture = Fixture::new();
    let engine = Scripted::stalling([Step::Data("data: 1\n\n")]);
    let body = fixture.body(engine, None).first_frame_by(std::time::Instant::now());
    let started = tokio::time::Instant::now();
    let got = frames(body).await;
    assert!(started.elapsed() >= Duration::from_secs(300), "the idle limit after the first byte");
    assert_eq!(got[0], "data: 1\n\n");
}

#[tokio::test]
async fn a_failed_prefill_partner_ends_the_decode_stream_without_blaming_decode() {
    let fixture = Fixture::new();
    let (failed, partner) = oneshot::channel();
    let body = fixture.body(Scripted::stalling([Step::Data("data: 1\n\n")]), Some(partner));
    let prefill = WorkerId::new("p1").expect("valid");
    let text = "boom".to_owned();
    let status = http::StatusCode::INTERNAL_SERVER_ERROR;
    let _ = failed.send(ApiError::Prefill(EngineError::Status { worker: prefill, status, text }));
    let got = frames(body).await;
    let event = error_event(got.last().expect("an event"));
    let message = event["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("prefill engine p1 failed"), "{message}");
    assert_eq!(fixture.outcomes(), [Outcome::Success]);
    assert_eq!(fixture.held(), 0);
}

#[tokio::test]
async fn a_partner_that_succeeds_changes_nothing() {
    let fixture = Fixture::new();
    let (succeeded, partner) = oneshot::channel::<ApiError>();
    drop(succeeded);
    let body = fixture.body(Scripted::new([Step::Data("data: 1\n\n")]), Some(partner));
    assert_eq!(frames(body).await, ["data: 1\n\n"]);
    assert_eq!(fixture.outcomes(), [Outcome::Success]);
}

#[tokio::test]
async fn a_client_that_leaves_releases_the_guard_without_blaming_the_engine() {
    let fixture = Fixture::new();
    let mut body = fixture.body(Scripted::stalling([Step::Data("data: 1\n\n")]), None);
    assert!(body.frame().await.is_some());
    assert_eq!(fixture.held(), 1);
    drop(body);
    assert_eq!(fixture.held(), 0);
    assert_eq!(fixture.outcomes(), [Outcome::Success]);
}

#[tokio::test]
async fn a_measured_stream_passes_its_bytes_unchanged_and_reports_at_its_end() {
    crate::metrics::install();
    let fixture = Fixture::new();
    let labels = |model: &str| AnswerMetrics {
        model: ModelId::new(model),
        started: std::time::Instant::now(),
        dispatched: std::time::Instant::now(),
        prediction: None,
    };
    let usage = r#"data: {"choices":[],"usage":{"prompt_tokens":6,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}

"#;
    let steps = || {
        [
            Step::Data("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"),
            Step::Pending,
            Step::Data("data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n"),
            Step::Pending,
            Step::Data(usage),
            Step::Pending,
            Step::Data("data: [DONE]\n\n"),
        ]
    };
    let plain = frames(fixture.body(Scripted::new(steps()), None)).await;
    let body = fixture.measured(Scripted::new(steps()), None, Some(labels("body-m")));
    assert_eq!(frames(body).await, plain, "measuring changes no byte");
    let series =
        |name: &str, model: &str| crate::tests::metric(name, &[("model", model), ("worker", "e1")]);
    assert_eq!(series("router_time_to_first_token_seconds_count", "body-m"), Some(1.0));
    assert_eq!(series("router_inter_token_latency_seconds_count", "body-m"), Some(1.0));
    assert_eq!(series("router_e2e_latency_seconds_count", "body-m"), Some(1.0));
    assert_eq!(series("router_prompt_tokens_total", "body-m"), Some(6.0));
    assert_eq!(series("router_cached_tokens_total", "body-m"), Some(2.0));
    assert_eq!(series("router_completion_tokens_total", "body-m"), Some(3.0));

    // A stream that breaks off, or that the client leaves, reports nothing.
    let broken = Scripted::new([Step::Data(usage), Step::Pending, Step::Fail]);
    frames(fixture.measured(broken, None, Some(labels("body-broken")))).await;
    let mut left =
        fixture.measured(Scripted::stalling([Step::Data(usage)]), None, Some(labels("body-left")));
    assert!(left.frame().await.is_some());
    drop(left);
    for model in ["body-broken", "body-left"] {
        assert_eq!(series("router_e2e_latency_seconds_count", model), None, "{model}");
        assert_eq!(series("router_prompt_tokens_total", model), None, "{model}");
    }
}
