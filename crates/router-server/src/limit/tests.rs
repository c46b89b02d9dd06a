//! The concurrency bound and its queue as middleware: a request holds its slot until its
//! response body has been read to the end or dropped, not merely until the handler returns;
//! beyond the bound requests wait in FIFO order, a full queue or an expired wait is a 429 with
//! `Retry-After`, and a client that leaves the queue gives its place back.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::middleware::from_fn_with_state;
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tower::ServiceExt as _;

use super::{Admission, BodyBudget, concurrency};
use crate::tests::{metric, text};

/// A route whose answers stream what the test sends them, behind `admission`; the sender of
/// each answer's body comes out of `bodies`.
fn bounded(
    admission: &Arc<Admission>,
) -> (axum::Router, mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>) {
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
    let app = axum::Router::new().route("/", axum::routing::get(handler)).layer(
        from_fn_with_state((bodies_budget(), Arc::clone(admission), Arc::from([])), concurrency),
    );
    (app, bodies)
}

/// Room for every test's bodies.
fn bodies_budget() -> Arc<BodyBudget> {
    Arc::new(BodyBudget::new(64, 1 << 20, 1 << 20, 5))
}

fn get() -> Request<Body> {
    Request::get("/").body(Body::empty()).expect("request")
}

fn refused(reason: &str) -> f64 {
    metric("router_requests_refused_total", &[("reason", reason)]).unwrap_or(0.0)
}

#[tokio::test]
async fn a_request_holds_its_permit_until_its_body_ends() {
    crate::metrics::install();
    let admission = Arc::new(Admission::new(1, 0, Duration::from_secs(60)));
    let (app, mut bodies) = bounded(&admission);

    let first = app.clone().oneshot(get()).await.expect("answered");
    assert_eq!(first.status(), StatusCode::OK);
    let first_body = bodies.recv().await.expect("the first body's sender");
    assert_eq!(admission.available(), 0, "the handler returned, the body is still open");

    let before = refused("queue_full");
    let second = app.clone().oneshot(get()).await.expect("answered");
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS, "no queue: refused at once");
    assert_eq!(second.headers()[header::RETRY_AFTER], "1");
    let body: serde_json::Value = serde_json::from_str(&text(second).await).expect("json");
    assert_eq!(body["error"]["code"], "queue_full");
    assert_eq!(refused("queue_full") - before, 1.0);

    first_body.send(Bytes::from_static(b"the end")).await.expect("sent");
    drop(first_body);
    let mut first = first.into_body();
    let frame = first.frame().await.expect("a frame").expect("data");
    assert_eq!(frame.into_data().expect("data"), "the end");
    assert_eq!(admission.available(), 0, "not before the end");
    assert!(first.frame().await.is_none(), "the end");
    drop(first);
    assert_eq!(admission.available(), 1);

    // A client that leaves before the end gives its permit back too.
    let third = app.clone().oneshot(get()).await.expect("answered");
    assert_eq!(third.status(), StatusCode::OK);
    assert_eq!(admission.available(), 0);
    drop(third);
    assert_eq!(admission.available(), 1);
}

/// Lets the spawned requests run until they block.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn beyond_the_bound_requests_wait_in_order_and_a_full_queue_is_refused() {
    crate::metrics::install();
    let admission = Arc::new(Admission::new(1, 2, Duration::from_secs(60)));
    let (app, mut bodies) = bounded(&admission);
    let first = app.clone().oneshot(get()).await.expect("answered");
    let first_body = bodies.recv().await.expect("sender");

    let (order_tx, mut order) = mpsc::unbounded_channel();
    let mut waiting = Vec::new();
    for name in ["second", "third"] {
        let (app, order_tx) = (app.clone(), order_tx.clone());
        waiting.push(tokio::spawn(async move {
            let response = app.oneshot(get()).await.expect("answered");
            let _ = order_tx.send(name);
            response
        }));
        settle().await;
    }
    assert_eq!(admission.queued(), 2);
    let before = refused("queue_full");
    let fourth = app.clone().oneshot(get()).await.expect("answered");
    assert_eq!(fourth.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused("queue_full") - before, 1.0);

    // The first's end lets the second in, and only the second.
    drop(first_body);
    drop(first);
    assert_eq!(order.recv().await, Some("second"));
    settle().await;
    assert_eq!(admission.queued(), 1, "the third still waits");
    let second = waiting.remove(0).await.expect("task");
    assert_eq!(second.status(), StatusCode::OK);
    drop(bodies.recv().await);
    drop(second);
    assert_eq!(order.recv().await, Some("third"));
    let third = waiting.remove(0).await.expect("task");
    assert_eq!(third.status(), StatusCode::OK);
    assert_eq!(admission.queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_expired_wait_is_a_429_and_a_departed_client_leaves_the_queue() {
    crate::metrics::install();
    let admission = Arc::new(Admission::new(1, 4, Duration::from_secs(3)));
    let (app, mut bodies) = bounded(&admission);
    let _first = app.clone().oneshot(get()).await.expect("answered");
    let _first_body = bodies.recv().await.expect("sender");

    let before = refused("queue_timeout");
    let timed_out = app.clone().oneshot(get()).await.expect("answered");
    assert_eq!(timed_out.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(timed_out.headers()[header::RETRY_AFTER], "1");
    let body: serde_json::Value = serde_json::from_str(&text(timed_out).await).expect("json");
    assert_eq!(body["error"]["code"], "queue_timeout");
    assert_eq!(refused("queue_timeout") - before, 1.0);
    assert_eq!(admission.queued(), 0);

    let leaving = tokio::spawn(app.clone().oneshot(get()));
    settle().await;
    assert_eq!(admission.queued(), 1);
    leaving.abort();
    settle().await;
    assert_eq!(admission.queued(), 0, "the client went away: its place is free");
}
