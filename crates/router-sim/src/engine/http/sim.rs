//! The simulator's own controls, which no real engine has: `POST /sim/drain` and
//! `POST /sim/resume` make the load reporter state DRAINING or SERVING (as an engine told to
//! shut down gracefully would, and one that changed its mind), and `GET /sim/state` answers
//! that status with the generation requests received so far, so that a test can see what a
//! router sent (and the W3C trace context, `traceparent` and `tracestate`, of the last request
//! that carried one). A draining simulator keeps serving whatever reaches it: it is the router's job
//! to send nothing new, and the count shows whether it did.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use router_state_load::EngineStatus;
use serde_json::{Value, json};

use super::Engine;

/// The status the load reporter states: DRAINING once dying or told to drain, else SERVING.
pub(crate) fn status(dying: bool, draining: bool) -> EngineStatus {
    if dying || draining { EngineStatus::Draining } else { EngineStatus::Serving }
}

/// `POST /sim/drain`.
pub(crate) async fn drain(State(engine): State<Arc<Engine>>) -> Json<Value> {
    engine.draining.store(true, Ordering::SeqCst);
    state(State(engine)).await
}

/// `POST /sim/resume` (a dying engine stays draining).
pub(crate) async fn resume(State(engine): State<Arc<Engine>>) -> Json<Value> {
    engine.draining.store(false, Ordering::SeqCst);
    state(State(engine)).await
}

/// `GET /sim/state`: `{"status": "serving"|"draining", "received": N, "traceparent": ..,
/// "tracestate": ..}` (the trace context of the last request that carried one, else null).
pub(crate) async fn state(State(engine): State<Arc<Engine>>) -> Json<Value> {
    let status =
        status(engine.faults.dying().is_cancelled(), engine.draining.load(Ordering::SeqCst));
    let trace = engine.trace_context.lock().clone();
    Json(json!({
        "status": status.as_str(),
        "received": engine.received.load(Ordering::SeqCst),
        "traceparent": trace.traceparent,
        "tracestate": trace.tracestate,
    }))
}

/// The W3C trace context headers of one request.
#[derive(Clone, Debug, Default)]
pub(crate) struct TraceContext {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

/// Remembers the trace context of a request that carries a `traceparent`.
pub(crate) async fn note_trace_context(
    State(engine): State<Arc<Engine>>,
    request: Request,
    next: Next,
) -> Response {
    {
        let headers = request.headers();
        let header = |name| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        if let Some(traceparent) = header("traceparent") {
            let tracestate = header("tracestate");
            *engine.trace_context.lock() =
                TraceContext { traceparent: Some(traceparent), tracestate };
        }
    }
    next.run(request).await
}
