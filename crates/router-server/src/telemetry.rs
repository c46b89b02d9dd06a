//! Distributed tracing: the W3C trace context (`traceparent`, `tracestate`) a client sends is
//! passed on to the engines, and with `telemetry.otlp_endpoint` set the router exports spans of
//! its own over OTLP/gRPC: one per request (a child of the client's context) with child spans
//! for preparation, selection and each dispatch to an engine. The engines then get the
//! dispatch span's context, so their spans hang below the router's.
//!
//! Export is off by default; then nothing is measured or allocated per request beyond copying
//! the two client headers, and they reach the engines unchanged.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{
    SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};

use router_config::TelemetrySection;

/// The W3C trace context headers.
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub(crate) const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// How often finished spans are sent to the collector.
const EXPORT_DELAY: Duration = Duration::from_secs(1);

/// The exporting tracer, once [`init`] has set one up.
static TRACER: OnceLock<(SdkTracerProvider, SdkTracer)> = OnceLock::new();

/// Sets up span export when `section` names an endpoint. Must run inside the Tokio runtime
/// (the gRPC client's connection task runs there).
pub fn init(section: &TelemetrySection) -> anyhow::Result<()> {
    let Some(endpoint) = &section.otlp_endpoint else { return Ok(()) };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .with_timeout(Duration::from_secs(10))
        .build()?;
    let batch = BatchConfigBuilder::default().with_scheduled_delay(EXPORT_DELAY).build();
    let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batch).build();
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(section.sample_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(Resource::builder().with_service_name(section.service_name.clone()).build())
        .build();
    let tracer = provider.tracer("router-server");
    if TRACER.set((provider, tracer)).is_err() {
        anyhow::bail!("trace export was already set up");
    }
    tracing::info!(endpoint = %endpoint, ratio = section.sample_ratio, "exporting traces");
    Ok(())
}

/// Sends the spans still buffered and stops exporting (at shutdown).
pub async fn shutdown() {
    if let Some((provider, _)) = TRACER.get() {
        let provider = provider.clone();
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(err)) = flushed {
            tracing::warn!(error = %err, "flushing the last spans failed");
        }
    }
}

/// The exporting tracer, if any.
fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get().map(|(_, tracer)| tracer)
}

/// Most list members of a `tracestate` passed on (the W3C limit).
pub(crate) const MAX_TRACESTATE_MEMBERS: usize = 32;
/// Most bytes of a `tracestate` passed on: the length the W3C asks every vendor to propagate.
pub(crate) const MAX_TRACESTATE_BYTES: usize = 512;

/// Whether `value` is a W3C `traceparent`: `version-trace_id-parent_id-flags` in lowercase hex
/// (2-32-16-2 digits), the ids not all zero, the version not `ff`; version `00` exactly 55
/// bytes, a later version at least that, followed by `-` when longer.
fn valid_traceparent(value: &[u8]) -> bool {
    let hex = |field: &[u8]| field.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    let nonzero = |field: &[u8]| field.iter().any(|b| *b != b'0');
    if value.len() < 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return false;
    }
    let (version, trace, parent, flags) =
        (&value[..2], &value[3..35], &value[36..52], &value[53..55]);
    let fields_ok = hex(version) && hex(trace) && hex(parent) && hex(flags);
    let length_ok = match version {
        b"00" => value.len() == 55,
        b"ff" => false,
        _ => value.len() == 55 || value[55] == b'-',
    };
    fields_ok && length_ok && nonzero(trace) && nonzero(parent)
}

/// `value` within the W3C bounds: whole list members from the start while they fit.
fn bounded_tracestate(value: &HeaderValue) -> Option<HeaderValue> {
    let text = value.to_str().ok()?;
    if text.len() <= MAX_TRACESTATE_BYTES
        && text.bytes().filter(|b| *b == b',').count() < MAX_TRACESTATE_MEMBERS
    {
        return Some(value.clone());
    }
    let mut kept = String::new();
    for member in
        text.split(',').map(str::trim).filter(|m| m.contains('=')).take(MAX_TRACESTATE_MEMBERS)
    {
        let extra = if kept.is_empty() { member.len() } else { member.len() + 1 };
        if kept.len() + extra > MAX_TRACESTATE_BYTES {
            break;
        }
        if !kept.is_empty() {
            kept.push(',');
        }
        kept.push_str(member);
    }
    (!kept.is_empty()).then(|| HeaderValue::from_str(&kept).ok()).flatten()
}

/// The W3C trace context headers to send to an engine (none by default).
#[derive(Clone, Debug, Default)]
pub struct TraceHeaders {
    traceparent: Option<HeaderValue>,
    tracestate: Option<HeaderValue>,
}

impl TraceHeaders {
    /// The client's trace context headers, when valid as the W3C Trace Context says: a
    /// `traceparent` that is not valid is dropped, and `tracestate` with it (it means nothing
    /// without one); a `tracestate` of more than [`MAX_TRACESTATE_MEMBERS`] members or
    /// [`MAX_TRACESTATE_BYTES`] bytes loses members from its end until it fits (whole members,
    /// as the specification allows), and one with no valid member left is dropped.
    fn of(headers: &HeaderMap) -> Self {
        let Some(traceparent) =
            headers.get(&TRACEPARENT).filter(|v| valid_traceparent(v.as_bytes()))
        else {
            return Self::default();
        };
        let tracestate = headers.get(&TRACESTATE).and_then(bounded_tracestate);
        Self { traceparent: Some(traceparent.clone()), tracestate }
    }

    /// Calls `field` with each header to send.
    pub(crate) fn each(&self, mut field: impl FnMut(&HeaderName, &HeaderValue)) {
        if let Some(value) = &self.traceparent {
            field(&TRACEPARENT, value);
        }
        if let Some(value) = &self.tracestate {
            field(&TRACESTATE, value);
        }
    }

    /// Adds the headers to an engine request.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        if let Some(value) = &self.traceparent {
            headers.insert(TRACEPARENT, value.clone());
        }
        if let Some(value) = &self.tracestate {
            headers.insert(TRACESTATE, value.clone());
        }
    }
}

/// One request's trace: the client's context, and with export on the request span.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestTrace {
    client: TraceHeaders,
    /// The context holding the request span (export on).
    span: Option<Context>,
}

impl RequestTrace {
    /// No trace: no client context, no span.
    #[cfg(test)]
    pub(crate) const fn none() -> Self {
        Self { client: TraceHeaders { traceparent: None, tracestate: None }, span: None }
    }

    /// Starts the request's trace from the client's `headers` (`name`: the route).
    pub(crate) fn start(headers: &HeaderMap, name: &'static str, request_id: &HeaderValue) -> Self {
        let client = TraceHeaders::of(headers);
        let span = tracer().map(|tracer| {
            let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
            let span = tracer
                .span_builder(name)
                .with_kind(SpanKind::Server)
                .with_attributes([KeyValue::new(
                    "router.request_id",
                    request_id.to_str().unwrap_or_default().to_owned(),
                )])
                .start_with_context(tracer, &parent);
            parent.with_span(span)
        });
        Self { client, span }
    }

    /// A child span of the request span named `name` (a no-op with export off).
    pub(crate) fn child(&self, name: &'static str) -> ChildSpan {
        let context = match (&self.span, tracer()) {
            (Some(parent), Some(tracer)) => {
                let span = tracer.span_builder(name).start_with_context(tracer, parent);
                Some(parent.with_span(span))
            }
            _ => None,
        };
        ChildSpan { context }
    }

    /// The trace context headers for an engine, sent within `dispatch`: the client's own
    /// with export off, else `dispatch`'s context (same trace, the router's span as parent).
    pub(crate) fn engine_headers(&self, dispatch: &ChildSpan) -> Cow<'_, TraceHeaders> {
        match &dispatch.context {
            None => Cow::Borrowed(&self.client),
            Some(context) => {
                let mut headers = HeaderMap::new();
                TraceContextPropagator::new()
                    .inject_context(context, &mut HeaderInjector(&mut headers));
                Cow::Owned(TraceHeaders::of(&headers))
            }
        }
    }

    /// Notes the response status on the request span, which ends once `response` has been
    /// sent (a stream at its end, or when the client leaves): the span's context travels with
    /// the body, ended as the body is dropped. With export off the response is unchanged.
    pub(crate) fn finish(self, response: Response) -> Response {
        let Some(context) = &self.span else { return response };
        let status = response.status().as_u16();
        let span = context.span();
        span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status)));
        if status >= 500 {
            span.set_status(Status::error(format!("status {status}")));
        }
        response.map(|body| Body::new(Traced { inner: body, trace: self }))
    }
}

/// A child span of a request span, ended when dropped; every call is a no-op with export off.
#[derive(Debug, Default)]
pub(crate) struct ChildSpan {
    context: Option<Context>,
}

impl ChildSpan {
    /// Whether the span records (export on): attributes worth computing.
    pub(crate) fn is_recording(&self) -> bool {
        self.context.as_ref().is_some_and(|c| c.span().is_recording())
    }

    /// Sets an attribute.
    pub(crate) fn set(
        &self,
        key: impl Into<opentelemetry::Key>,
        value: impl Into<opentelemetry::Value>,
    ) {
        if let Some(context) = &self.context {
            context.span().set_attribute(KeyValue::new(key, value));
        }
    }

    /// Marks the span failed with `error`.
    pub(crate) fn fail(&self, error: &dyn std::fmt::Display) {
        if let Some(context) = &self.context {
            context.span().set_status(Status::error(error.to_string()));
        }
    }
}

impl Drop for ChildSpan {
    fn drop(&mut self) {
        if let Some(context) = &self.context {
            context.span().end();
        }
    }
}

/// A response body carrying its request's span, which ends when the body is dropped.
struct Traced {
    inner: Body,
    trace: RequestTrace,
}

impl http_body::Body for Traced {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        if let Some(context) = &self.trace.span {
            context.span().end();
        }
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(key.as_bytes()), HeaderValue::from_str(&value))
        {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_export_the_clients_context_goes_to_the_engines_unchanged() {
        let mut headers = HeaderMap::new();
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        headers.insert(TRACEPARENT, HeaderValue::from_static(parent));
        headers.insert(TRACESTATE, HeaderValue::from_static("vendor=x"));
        let trace = RequestTrace::start(&headers, "test", &HeaderValue::from_static("id"));
        let dispatch = trace.child("dispatch");
        assert!(!dispatch.is_recording());
        let mut sent = HeaderMap::new();
        trace.engine_headers(&dispatch).apply(&mut sent);
        assert_eq!(sent.get(TRACEPARENT).map(HeaderValue::as_bytes), Some(parent.as_bytes()));
        assert_eq!(sent.get(TRACESTATE).map(HeaderValue::as_bytes), Some(&b"vendor=x"[..]));
        let none = RequestTrace::start(&HeaderMap::new(), "test", &HeaderValue::from_static("id"));
        let mut sent = HeaderMap::new();
        none.engine_headers(&none.child("dispatch")).apply(&mut sent);
        assert!(sent.is_empty(), "no context is made up");
    }

    /// Found attacking the router: a 20 KB `tracestate` and any `traceparent` reached engines.
    #[test]
    fn only_a_valid_context_within_its_bounds_goes_on() {
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let sent = |traceparent: &str, tracestate: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(TRACEPARENT, HeaderValue::from_str(traceparent).expect("value"));
            headers.insert(TRACESTATE, HeaderValue::from_str(tracestate).expect("value"));
            let trace = TraceHeaders::of(&headers);
            let text =
                |v: &Option<HeaderValue>| v.as_ref().map(|v| v.to_str().expect("text").to_owned());
            (text(&trace.traceparent), text(&trace.tracestate))
        };
        assert_eq!(sent(parent, "a=1"), (Some(parent.into()), Some("a=1".into())));
        for bad in [
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "not a traceparent",
        ] {
            assert_eq!(sent(bad, "a=1"), (None, None), "{bad}");
        }
        let future = format!("01{}-what-comes-next", &parent[2..]);
        assert_eq!(sent(&future, "a=1").0, Some(future.clone()), "a later version may grow");
        let huge = format!("a={}", "x".repeat(20_000));
        assert_eq!(sent(parent, &huge).1, None, "a member past the bound cannot be kept whole");
        let many: Vec<String> = (0..40).map(|i| format!("k{i}=v")).collect();
        let kept = sent(parent, &many.join(",")).1.expect("the first members");
        assert_eq!(kept.split(',').count(), MAX_TRACESTATE_MEMBERS);
        let long: Vec<String> = (0..20).map(|i| format!("k{i}={}", "v".repeat(40))).collect();
        let kept = sent(parent, &long.join(",")).1.expect("the first members");
        assert!(kept.len() <= MAX_TRACESTATE_BYTES && kept.starts_with("k0="), "{kept}");
    }

    #[test]
    fn the_section_checks_its_ratio_endpoint_and_name() {
        assert!(TelemetrySection::default().problems().is_empty());
        let bad = TelemetrySection {
            otlp_endpoint: Some("collector:4317".to_owned()),
            sample_ratio: 1.5,
            service_name: " ".to_owned(),
        };
        let fields: Vec<_> = bad.problems().into_iter().map(|(field, _)| field).collect();
        assert_eq!(fields, ["sample_ratio", "otlp_endpoint", "service_name"]);
    }
}
