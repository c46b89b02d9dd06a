//! The concurrency bound as middleware: beyond its permits a request is refused at once with
//! 503 and `Retry-After`, and a request holds its permit until its response body has been
//! read to the end or dropped, not merely until the handler returns.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::middleware::from_fn_with_state;
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::{Semaphore, mpsc};
use tower::ServiceExt as _;

use super::concurrency;
use crate::tests::{metric, text};

/// A route whose answers stream what the test sends them, behind one permit; the sender of
/// each answer's body comes out of `bodies`.
fn bounded(slots: &Arc<Semaphore>) -> (axum::Router, mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>) {
    let (bodies_tx, bodies) = mpsc::unbounded_channel();
    let handler = move || {
        let bodies_tx = bodies_tx.clone();
        async move {
            let (tx, rx) = mpsc::channel::<Bytes>(4);
            let _ = bodies_tx.send(tx);
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|chunk| (Ok::<_, std::convert::Infallible>(chunk), rx))
            });
            Body::from_stream(stream)
        }
    };
    let app = axum::Router::new()
        .route("/", axum::routing::get(handler))
        .layer(from_fn_with_state(Arc::clone(slots), concurrency));
    (app, bodies)
}

fn get() -> Request<Body> {
    Request::get("/").body(Body::empty()).expect("request")
}

fn refused() -> f64 {
    metric("router_requests_refused_total", &[("reason", "overloaded")]).unwrap_or(0.0)
}

#[tokio::test]
async fn a_request_holds_its_permit_until_its_body_ends() {
    crate::metrics::install();
    let slots = Arc::new(Semaphore::new(1));
    let (app, mut bodies) = bounded(&slots);

    let first = app.clone().oneshot(get()).await.expect("answered");
    assert_eq!(first.status(), StatusCode::OK);
    let first_body = bodies.recv().await.expect("the first body's sender");
    assert_eq!(slots.available_permits(), 0, "the handler returned, the body is still open");

    let before = refused();
    let second = app.clone().oneshot(get()).await.expect("answered");
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(second.headers()[header::RETRY_AFTER], "1");
    let body: serde_json::Value = serde_json::from_str(&text(second).await).expect("json");
    assert_eq!(body["error"]["code"], "overloaded");
    assert_eq!(refused() - before, 1.0);

    first_body.send(Bytes::from_static(b"the end")).await.expect("sent");
    drop(first_body);
    let mut first = first.into_body();
    let frame = first.frame().await.expect("a frame").expect("data");
    assert_eq!(frame.into_data().expect("data"), "the end");
    assert_eq!(slots.available_permits(), 0, "not before the end");
    assert!(first.frame().await.is_none(), "the end");
    drop(first);
    assert_eq!(slots.available_permits(), 1);

    // A client that leaves before the end gives its permit back too.
    let third = app.clone().oneshot(get()).await.expect("answered");
    assert_eq!(third.status(), StatusCode::OK);
    assert_eq!(slots.available_permits(), 0);
    drop(third);
    assert_eq!(slots.available_permits(), 1);
}
