//! The server side's request heads: which heads the own loop serves, and the fields it keeps.
//!
//! A head is served here when it is whole, within the size limit, an HTTP/1.1 `POST` to a path
//! the handler routes, framed by a Content-Length (or without a body), with no
//! Transfer-Encoding, `Expect` or upgrade. Anything else is left to the general server (hyper)
//! with the buffer as it was: a head both could read differently is never read here (the
//! `client_head` fuzz target holds this against hyper).

use std::mem::MaybeUninit;
use std::ops::Range;

use bytes::{Buf as _, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

use crate::text::{content_length, has_token};

/// Most header fields in a request head (hyper's default too).
const MAX_HEADERS: usize = 100;

/// Kept fields of a request head noted on the stack while it is parsed; more spill to the heap.
const USUAL_FIELDS: usize = 8;

/// A request the own loop serves, its head parsed.
#[derive(Debug)]
pub struct Request<R> {
    /// What the handler routed its path to.
    pub route: R,
    /// The head's fields named in the kept list, nothing else.
    pub headers: HeaderMap,
    /// The body's Content-Length (0 without one).
    pub length: u64,
    /// The client asked to close after the answer (`Connection: close`).
    pub close: bool,
}

/// What the start of a connection's buffer holds.
#[derive(Debug)]
pub enum Parsed<R> {
    /// Not a whole request head yet.
    Partial,
    /// A request the own loop serves (its head is taken off the buffer).
    Ours(Request<R>),
    /// Anything else, for the general server (the buffer is left as it was).
    Theirs,
}

/// Parses the request head at the start of `buf`, a head of at most `max_bytes`. `route` maps
/// a `POST`'s path (without its query) to what serves it, and must accept only paths a URI may
/// hold. Of the head's fields, those named in `kept` go into the request's header map; the
/// rest are read past, never made into names, values or map entries (clients send a dozen,
/// the OpenAI clients' `x-stainless-*` among them).
pub fn parse_request_head<R>(
    buf: &mut BytesMut,
    max_bytes: usize,
    kept: &[HeaderName],
    route: impl FnOnce(&str) -> Option<R>,
) -> Parsed<R> {
    // Left uninitialized: writing 100 empty fields first would cost more than the parse.
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut request,
        buf,
        &mut fields,
    );
    let length = match parsed {
        Ok(httparse::Status::Complete(length)) if length <= max_bytes => length,
        Ok(httparse::Status::Partial) if buf.len() < max_bytes => return Parsed::Partial,
        _ => return Parsed::Theirs,
    };
    if request.method != Some("POST") || request.version != Some(1) {
        return Parsed::Theirs;
    }
    let target = request.path.unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let Some(route) = route(path) else { return Parsed::Theirs };
    // The path is routed, so valid; a query (rare on an inference POST) must be one hyper
    // accepts too (httparse lets through bytes, such as `"`, that a URI may not hold): found by
    // the `client_head` fuzz target.
    if !query.is_empty() && http::uri::PathAndQuery::try_from(target).is_err() {
        return Parsed::Theirs;
    }
    let (mut length_field, mut close) = (None, false);
    // Each value as a range of the head, which becomes shared bytes once it is taken off.
    let start = buf.as_ptr() as usize;
    let mut named: SmallVec<[(HeaderName, Range<usize>); USUAL_FIELDS]> = SmallVec::new();
    for field in request.headers.iter() {
        let value = field.value;
        // httparse took the name as a token; header names compare in any case.
        let is = |known: &HeaderName| field.name.eq_ignore_ascii_case(known.as_str());
        if is(&CONTENT_LENGTH) {
            let Some(parsed) = content_length(value) else { return Parsed::Theirs };
            if length_field.is_some_and(|earlier| earlier != parsed) {
                return Parsed::Theirs;
            }
            length_field = Some(parsed);
        } else if is(&TRANSFER_ENCODING) || is(&EXPECT) || is(&UPGRADE) {
            return Parsed::Theirs;
        } else if is(&CONNECTION) {
            if has_token(value, b"upgrade") {
                return Parsed::Theirs;
            }
            close |= has_token(value, b"close");
        }
        if let Some(name) = kept.iter().find(|name| is(name)) {
            let at = value.as_ptr() as usize - start;
            named.push((name.clone(), at..at + value.len()));
        }
    }
    let mut headers = HeaderMap::with_capacity(named.len());
    if named.is_empty() {
        // Nothing of the head is needed once it is parsed: read past, not split off.
        buf.advance(length);
    } else {
        let head = buf.split_to(length).freeze();
        for (name, range) in named {
            let Ok(value) = HeaderValue::from_maybe_shared(head.slice(range)) else {
                // httparse checks the same bytes a header value may hold, so this does not
                // happen; if it did, hyper would see the head as it came.
                let mut whole = BytesMut::from(&head[..]);
                whole.unsplit(std::mem::take(buf));
                *buf = whole;
                return Parsed::Theirs;
            };
            headers.append(name, value);
        }
    }
    Parsed::Ours(Request { route, headers, length: length_field.unwrap_or(0), close })
}

/// Whether the bytes of `buf` after its first `from` may end a head: a blank line (CRLF or
/// bare LF, as httparse reads them) ends in them, counting the three bytes before `from`.
#[inline]
pub fn head_ends(buf: &[u8], from: usize) -> bool {
    let new = &buf[from.saturating_sub(3)..];
    memchr::memmem::find(new, b"\n\r\n").is_some() || memchr::memmem::find(new, b"\n\n").is_some()
}

#[cfg(test)]
mod tests;
