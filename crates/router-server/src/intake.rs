//! A request's intake before preparation: its id, and its body read within the size and time
//! limits (413 and 408), a refused body drained in the background so the client reads the
//! answer.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use bytes::Bytes;
use http_body_util::BodyExt;
use smallvec::SmallVec;

use crate::error::ApiError;

pub(crate) use router_engine_client::REQUEST_ID_HEADER;

/// The client's request id from the first of `names` (`server.request_id_headers`, parsed
/// once by [`crate::app::AppContext`]) present with a sane token, else a fresh one.
pub(crate) fn request_id(headers: &HeaderMap, names: &[HeaderName]) -> HeaderValue {
    names
        .iter()
        .filter_map(|name| headers.get(name))
        .find(|v| {
            let bytes = v.as_bytes();
            !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(|b| b.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(new_request_id)
}

/// How a request's body comes, as far as reading it goes: the length its head declares, and
/// whether its client waits for `100 Continue` before sending it. The front that parsed the
/// head says so (the router's own HTTP/1.1 loop knows both without a header map).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BodyFraming {
    /// The Content-Length, when the head has one.
    pub declared: Option<u64>,
    /// `Expect: 100-continue`.
    pub waits_for_continue: bool,
}

impl BodyFraming {
    /// As a request's header fields state it.
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        let declared = headers
            .get(&header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let waits_for_continue = headers
            .get(&header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        Self { declared, waits_for_continue }
    }
}

/// A request's body as its front hands it on: the bytes to come, and how they come.
pub(crate) struct IncomingBody {
    pub body: Body,
    pub framing: BodyFraming,
}

impl IncomingBody {
    /// `body`, framed as `headers` state it.
    pub(crate) fn framed_by(headers: &HeaderMap, body: Body) -> Self {
        Self { body, framing: BodyFraming::of(headers) }
    }
}

/// Reads the whole body: at most `limit` bytes (413 as soon as a declared length or the bytes
/// received exceed it) and within `secs` seconds (408).
pub(crate) async fn read_body(
    incoming: IncomingBody,
    limit: usize,
    secs: u64,
) -> Result<Bytes, ApiError> {
    read_body_with(incoming, limit, secs, |_| Ok(())).await
}

/// [`read_body`], telling `chunk` the length of every piece as it arrives; an error from it
/// ends the reading with that error.
pub(crate) async fn read_body_with(
    incoming: IncomingBody,
    limit: usize,
    secs: u64,
    mut chunk: impl FnMut(usize) -> Result<(), ApiError>,
) -> Result<Bytes, ApiError> {
    let IncomingBody { mut body, framing } = incoming;
    if framing.declared.is_some_and(|length| length > limit as u64) {
        // A client waiting for `100 Continue` has not sent the body: dropping it unread means
        // it never will. Reading it would invite the upload.
        if !framing.waits_for_continue {
            discard_in_background(body);
        }
        return Err(ApiError::BodyTooLarge { limit });
    }
    let read = async {
        // The usual body is one frame: kept inline, no vector allocated.
        let mut chunks: SmallVec<[Bytes; 1]> = SmallVec::new();
        let mut total = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|err| ApiError::InvalidRequest {
                message: format!("reading the request body failed: {err}"),
                param: None,
            })?;
            if let Ok(data) = frame.into_data() {
                total += data.len();
                if total > limit {
                    return Err(ApiError::BodyTooLarge { limit });
                }
                chunk(data.len())?;
                chunks.push(data);
            }
        }
        Ok(match chunks.len() {
            // The usual case, one frame: no copy.
            1 => chunks.pop().unwrap_or_default(),
            _ => chunks.concat().into(),
        })
    };
    let read = tokio::time::timeout(Duration::from_secs(secs), read)
        .await
        .map_err(|_| ApiError::BodyTimeout { secs })?;
    if matches!(read, Err(ApiError::BodyTooLarge { .. })) {
        discard_in_background(body);
    }
    read
}

/// Reads and drops the rest of a refused body for a few seconds, so that a client still
/// sending it gets to read the 413 instead of a connection reset (NGINX's lingering close).
/// Nothing is kept: memory stays bounded whatever the client sends.
fn discard_in_background(mut body: Body) {
    const LINGER: Duration = Duration::from_secs(5);
    tokio::spawn(async move {
        let drain = async { while let Some(Ok(_)) = body.frame().await {} };
        let _ = tokio::time::timeout(LINGER, drain).await;
    });
}

/// A fresh request id: a random per-process prefix and a counter, as 32 hex digits. Unique
/// across restarts without a random-number syscall per request.
fn new_request_id() -> HeaderValue {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(rand::random::<u64>);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    // 32 lowercase hex digits, written straight into the header's bytes (no formatter).
    let mut id = [0u8; 32];
    for (half, word) in id.chunks_mut(16).zip([prefix, count]) {
        for (i, digit) in half.iter_mut().enumerate() {
            *digit = b"0123456789abcdef"[(word >> (60 - 4 * i) & 0xf) as usize];
        }
    }
    HeaderValue::from_bytes(&id).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

#[cfg(test)]
mod tests;
