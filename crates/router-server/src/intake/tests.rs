//! A request's intake: which `x-request-id` is kept, and reading the body within its size
//! and time limits (413, 408, a broken body 400), a refused body drained in the background
//! unless its client waits for `100 Continue`.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use bytes::Bytes;
use tokio::sync::oneshot;

use super::{IncomingBody, REQUEST_ID_HEADER, read_body, request_id};

#[test]
fn a_sane_request_id_is_kept_and_anything_else_replaced() {
    let long = "x".repeat(129);
    let longest = "x".repeat(128);
    let cases: [(&str, Option<&[u8]>, bool); 7] = [
        ("a token", Some(b"req-42_abc"), true),
        ("the longest kept", Some(longest.as_bytes()), true),
        ("too long", Some(long.as_bytes()), false),
        ("empty", Some(b""), false),
        ("with a space", Some(b"a b"), false),
        ("not ascii", Some(b"caf\xc3\xa9"), false),
        ("absent", None, false),
    ];
    for (name, given, kept) in cases {
        let mut headers = HeaderMap::new();
        if let Some(given) = given {
            headers.insert("x-request-id", HeaderValue::from_bytes(given).expect("a value"));
        }
        let id = request_id(&headers, &[REQUEST_ID_HEADER]);
        assert_eq!(given == Some(id.as_bytes()), kept, "{name}: {id:?}");
        if !kept {
            let fresh = id.to_str().expect("ascii");
            assert!(fresh.len() == 32 && fresh.bytes().all(|b| b.is_ascii_hexdigit()), "{fresh}");
        }
    }
    let empty = HeaderMap::new();
    let names = [REQUEST_ID_HEADER];
    let (first, second) = (request_id(&empty, &names), request_id(&empty, &names));
    assert_ne!(first, second, "fresh ids are unique");
    // The process's random half, then a counter: both lowercase hex, the counter counting up.
    let halves = |id: &HeaderValue| {
        let id = id.to_str().expect("ascii").to_owned();
        assert_eq!(id, id.to_ascii_lowercase(), "lowercase");
        let (prefix, count) = id.split_at(16);
        (prefix.to_owned(), u64::from_str_radix(count, 16).expect("hex"))
    };
    let ((prefix_a, count_a), (prefix_b, count_b)) = (halves(&first), halves(&second));
    assert_eq!(prefix_a, prefix_b, "one prefix per process");
    assert!(count_b > count_a, "{count_a} then {count_b}");
}

#[test]
fn the_first_configured_header_present_with_a_sane_id_names_the_request() {
    let names =
        [HeaderName::from_static("x-correlation-id"), HeaderName::from_static("x-trace-id")];
    // (headers sent, the id kept; None: a fresh one)
    for (sent, kept) in [
        (vec![("x-trace-id", "t-1")], Some("t-1")),
        (vec![("x-correlation-id", "c-1"), ("x-trace-id", "t-1")], Some("c-1")),
        (vec![("x-correlation-id", "bad id"), ("x-trace-id", "t-2")], Some("t-2")),
        (vec![("x-request-id", "r-1")], None),
    ] {
        let mut headers = HeaderMap::new();
        for (name, value) in &sent {
            headers.insert(*name, HeaderValue::from_static(value));
        }
        let id = request_id(&headers, &names);
        match kept {
            Some(kept) => assert_eq!(id, kept, "{sent:?}"),
            None => assert_eq!(id.len(), 32, "{sent:?}: not configured, so a fresh id"),
        }
    }
}

/// One step of a client's body: a chunk, a break (`Err`), or silence for ever (`None`).
type Chunk = Option<Result<&'static str, ()>>;

/// A body of `chunks` and what became of it: the number of chunks read when it was read to
/// its end, an error when it was dropped before.
fn watched(chunks: Vec<Chunk>) -> (Body, oneshot::Receiver<usize>) {
    let (done, read) = oneshot::channel();
    let state = (chunks.into_iter(), 0, Some(done));
    let stream = futures::stream::unfold(state, |(mut chunks, count, mut done)| async move {
        match chunks.next() {
            Some(Some(Ok(chunk))) => Some((Ok(Bytes::from(chunk)), (chunks, count + 1, done))),
            Some(Some(Err(()))) => {
                Some((Err(std::io::Error::other("reset")), (chunks, count, done)))
            }
            Some(None) => std::future::pending().await,
            None => {
                if let Some(done) = done.take() {
                    let _ = done.send(count);
                }
                None
            }
        }
    });
    (Body::from_stream(stream), read)
}

fn declaring(length: usize) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    headers
}

/// One body: its headers and chunks, then what is read of it or the status refusing it.
type Case = (&'static str, HeaderMap, Vec<Chunk>, Result<&'static str, u16>);

#[tokio::test]
async fn a_body_is_read_within_its_limit_or_refused() {
    let ok = |text: &'static str| Some(Ok(text));
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("one frame", HeaderMap::new(), vec![ok("{}")], Ok("{}")),
        ("several frames, joined", HeaderMap::new(), vec![ok("ab"), ok("cd"), ok("ef")], Ok("abcdef")),
        ("exactly the limit", declaring(8), vec![ok("12345678")], Ok("12345678")),
        ("a declared length over the limit", declaring(9), vec![ok("123456789")], Err(413)),
        ("more bytes than the limit", HeaderMap::new(), vec![ok("12345"), ok("6789")], Err(413)),
        ("a body that breaks off", HeaderMap::new(), vec![ok("12"), Some(Err(()))], Err(400)),
    ];
    for (name, headers, chunks, expected) in cases {
        let (body, _) = watched(chunks);
        let read = read_body(IncomingBody::framed_by(&headers, body), 8, 60).await;
        match (read, expected) {
            (Ok(bytes), Ok(want)) => assert_eq!(bytes, want, "{name}"),
            (Err(err), Err(status)) => assert_eq!(err.status().as_u16(), status, "{name}: {err}"),
            (read, _) => panic!("{name}: {read:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_that_does_not_arrive_in_time_is_a_408() {
    let (body, _) = watched(vec![Some(Ok("{")), None]);
    let started = tokio::time::Instant::now();
    let err = read_body(IncomingBody::framed_by(&HeaderMap::new(), body), 1024, 60)
        .await
        .expect_err("never ends");
    assert!(started.elapsed() >= Duration::from_secs(60), "{:?}", started.elapsed());
    assert_eq!((err.status().as_u16(), err.kind().1), (408, "body_timeout"));
    assert_eq!(err.to_string(), "the request body did not arrive within 60 s");
}

#[tokio::test(start_paused = true)]
async fn a_refused_body_is_drained_unless_its_client_waits_for_100_continue() {
    let (body, read) = watched(vec![Some(Ok("123456789")), Some(Ok("more"))]);
    let err = read_body(IncomingBody::framed_by(&declaring(13), body), 8, 60)
        .await
        .expect_err("too large");
    assert_eq!(err.status().as_u16(), 413);
    assert_eq!(read.await, Ok(2), "read to its end in the background");

    let (body, read) = watched(vec![Some(Ok("12345")), Some(Ok("6789")), Some(Ok("more"))]);
    let err = read_body(IncomingBody::framed_by(&HeaderMap::new(), body), 8, 60)
        .await
        .expect_err("too large");
    assert_eq!(err.status().as_u16(), 413);
    assert_eq!(read.await, Ok(3), "the rest read and dropped");

    let mut waiting = declaring(13);
    waiting.insert(header::EXPECT, HeaderValue::from_static("100-Continue"));
    let (body, read) = watched(vec![Some(Ok("123456789")), Some(Ok("more"))]);
    let err =
        read_body(IncomingBody::framed_by(&waiting, body), 8, 60).await.expect_err("too large");
    assert_eq!(err.status().as_u16(), 413);
    assert!(read.await.is_err(), "dropped unread: reading it would invite the upload");
}
