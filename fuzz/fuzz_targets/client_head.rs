//! The client-facing HTTP/1.1 head parser of the router's own loop, checked against hyper.
//!
//! Input: the bytes a client sends first on a connection. Whatever request the own loop decides
//! to serve itself (a `POST` to an inference endpoint framed by a Content-Length), hyper must
//! read from the same bytes as the same request: method `POST`, the same path, the same
//! Content-Length, no Transfer-Encoding. A head hyper refuses, or reads otherwise, is a request
//! the two would frame differently: the root of request smuggling. Heads the own loop leaves to
//! hyper are hyper's to judge, and need no check.
//!
//! Invariants: no panic; every head served by the own loop is read alike by hyper.

#![no_main]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use libfuzzer_sys::fuzz_target;
use router_http1::request::{Parsed, parse_request_head};
use router_prepare::Endpoint;
use tokio::io::AsyncWriteExt as _;

/// The head limit the router runs with by default (`server.max_header_bytes`).
const MAX_HEAD: usize = 64 * 1024;

/// What hyper made of the first request: method, path, Content-Length, Transfer-Encoding.
type Seen = (String, String, Option<String>, bool);

/// hyper's reading of `bytes` as the start of a server connection: the first request's parts,
/// `None` when hyper refused the head.
fn hyper_reads(bytes: &[u8]) -> Option<Seen> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(bytes.len() + 1024);
        let seen: Arc<Mutex<Option<Seen>>> = Arc::default();
        let record = Arc::clone(&seen);
        let service =
            hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let header = |name: &http::HeaderName| {
                    request
                        .headers()
                        .get(name)
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                };
                let parts = (
                    request.method().as_str().to_owned(),
                    request.uri().path().to_owned(),
                    header(&http::header::CONTENT_LENGTH),
                    request.headers().contains_key(http::header::TRANSFER_ENCODING),
                );
                record.lock().expect("not poisoned").get_or_insert(parts);
                async { Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new()))) }
            });
        let connection = hyper::server::conn::http1::Builder::new()
            .max_buf_size(MAX_HEAD.max(8192))
            .serve_connection(hyper_util::rt::TokioIo::new(server), service);
        let _ = client.write_all(bytes).await;
        let _ = client.shutdown().await;
        // The connection ends when the client's side does, or at the first refusal; a body
        // cut short ends it too, after the head was read.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), connection).await;
        seen.lock().expect("not poisoned").take()
    })
}

/// What the own loop serves itself from the start of a connection that sent `bytes`: the
/// path and Content-Length of a `POST` to an inference endpoint; `None` when it leaves the
/// connection to hyper or the head is not whole.
fn served_here(bytes: &[u8]) -> Option<(String, u64)> {
    let mut buf = bytes::BytesMut::from(bytes);
    match parse_request_head(&mut buf, MAX_HEAD, &[], Endpoint::at) {
        Parsed::Ours(request) => Some((request.route.path().to_owned(), request.length)),
        Parsed::Partial | Parsed::Theirs => None,
    }
}

fuzz_target!(|bytes: &[u8]| {
    let Some((path, length)) = served_here(bytes) else { return };
    let Some((method, hyper_path, hyper_length, chunked)) = hyper_reads(bytes) else {
        panic!("the own loop serves {path} ({length} bytes) from a head hyper refuses");
    };
    assert_eq!(method, "POST", "the own loop serves a {method}");
    assert_eq!(hyper_path, path, "the paths differ");
    assert!(!chunked, "hyper sees a Transfer-Encoding the own loop did not");
    let hyper_length =
        hyper_length.and_then(|l| l.trim().split(',').next()?.trim().parse::<u64>().ok());
    assert_eq!(hyper_length.unwrap_or(0), length, "the body lengths differ");
});
