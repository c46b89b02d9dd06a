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
use router_engine_client::trace::TraceHeaders;

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
        Self { client: TraceHeaders::none(), span: None }
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
    use router_engine_client::trace::{TRACEPARENT, TRACESTATE};

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
