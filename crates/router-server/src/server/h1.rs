//! Client connections served by the router's own HTTP/1.1 loop, where the front serves the
//! inference endpoints directly ([`Front::direct`]).
//!
//! The common request, an HTTP/1.1 `POST` to an inference endpoint whose body is framed by a
//! Content-Length, is read here with httparse, handed to [`front::serve`], and its answer is
//! written here: no task, channel or second buffer sits between the client's socket and the
//! handler. Of its head, only the fields an inference request is read for are kept
//! ([`Direct::fields`]); the others are read past. The first request of any other shape
//! (another route or method, a chunked body, `Expect: 100-continue`, an upgrade, HTTP/1.0, a
//! head that does not parse or is too large) hands the connection over to hyper with every
//! byte read from it so far. Hyper then serves the connection as it serves every other, and
//! answers the errors in its own words.
//!
//! The loop keeps what hyper guarantees a connection:
//! - the request head within `server.header_read_timeout_secs`, also while a kept-alive
//!   connection waits for its next request, and at most `server.max_header_bytes`;
//! - every write under the socket's write timeout (`server.client_write_timeout_secs`);
//! - a client that closes its side cancels its request, as dropping it does everywhere;
//! - pipelined requests answered in order, a body that arrives after its head fed to the
//!   handler as fast as it takes it (the socket is not read while it is behind), and a body
//!   the handler refused read to its end (or closed on);
//! - a stop lets the request in progress finish, answers it with `connection: close`, and
//!   closes idle connections at once.
//!
//! [`Front::direct`]: super::front::Front::direct
//! [`Direct::fields`]: super::front::Direct::fields

use std::cell::RefCell;
use std::future::poll_fn;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use axum::body::Body;
use axum::response::Response;
use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, EXPECT, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body::Body as _;
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, Sleep};
use tokio_io_timeout::TimeoutStream;
use tokio_stream::wrappers::ReceiverStream;

use super::ConnectionLimits;
use super::front::{self, Direct};
use crate::app::AppContext;
use crate::h1_text::{self, field, has_token};
use crate::routes::body::{BodyFraming, IncomingBody};
use router_prepare::Endpoint;

/// A client's socket, its writes under the write timeout.
pub(super) type ClientIo = Pin<Box<TimeoutStream<TcpStream>>>;

/// Most header fields in a request head (hyper's default too).
const MAX_HEADERS: usize = 100;

/// The room each read of the client's socket asks for.
const READ_BYTES: usize = 8 * 1024;

/// How a connection's time with this loop ended.
pub(super) enum Ended {
    /// Closed (by either side, a timeout, or the stop).
    Closed,
    /// A request this loop does not serve: the connection and what was read of it, for hyper.
    HandedOver(Rewound),
}

/// Serves the client on `io` until it closes or sends a request this loop leaves to hyper.
pub(super) async fn serve(
    io: ClientIo,
    direct: &Direct,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) -> Ended {
    let mut connection = Connection {
        io,
        buf: BytesMut::with_capacity(READ_BYTES),
        head: Vec::with_capacity(512),
        header_timer: Box::pin(tokio::time::sleep(limits.header_read)),
        limits,
    };
    loop {
        let request = match connection.next_request(&direct.fields, &mut stop).await {
            Next::Serve(request) => request,
            Next::HandOver => {
                let Connection { io, buf, .. } = connection;
                return Ended::HandedOver(Rewound { read: buf.freeze(), io });
            }
            Next::Close => return Ended::Closed,
        };
        if !connection.exchange(request, &direct.ctx, &stop).await {
            return Ended::Closed;
        }
    }
}

/// A request this loop serves, its head parsed.
#[derive(Debug)]
struct Request {
    endpoint: Endpoint,
    headers: HeaderMap,
    /// The body's Content-Length (0 without one).
    length: u64,
    /// The client asked to close after the answer (`Connection: close`).
    close: bool,
}

/// What the start of a connection's buffer holds.
#[derive(Debug)]
enum Parsed {
    /// Not a whole request head yet.
    Partial,
    /// A request this loop serves (its head is taken off the buffer).
    Ours(Request),
    /// Anything else, for hyper (the buffer is left as it was).
    Theirs,
}

/// Kept fields of a request head noted on the stack while it is parsed; more spill to the heap.
const USUAL_FIELDS: usize = 8;

/// Parses the request head at the start of `buf`, a head of at most `max_bytes`. Of its
/// fields, those named in `kept` (the fields an inference request is read for) go into the
/// request's header map; the rest are read past, never made into names, values or map
/// entries (clients send a dozen, the OpenAI clients' `x-stainless-*` among them).
fn parse_head(buf: &mut BytesMut, max_bytes: usize, kept: &[HeaderName]) -> Parsed {
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
    let Some(endpoint) = Endpoint::at(path) else { return Parsed::Theirs };
    // The path is one of ours, so valid; a query (rare on an inference POST) must be one hyper
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
    Parsed::Ours(Request { endpoint, headers, length: length_field.unwrap_or(0), close })
}

/// Whether the bytes of `buf` after its first `from` may end a head: a blank line (CRLF or
/// bare LF, as httparse reads them) ends in them, counting the three bytes before `from`.
fn head_ends(buf: &[u8], from: usize) -> bool {
    let new = &buf[from.saturating_sub(3)..];
    memchr::memmem::find(new, b"\n\r\n").is_some() || memchr::memmem::find(new, b"\n\n").is_some()
}

/// What the loop makes of `bytes` as the start of a connection (a head of at most
/// `max_bytes`): `Some((path, content length))` when it serves the request itself (its head
/// whole, a `POST` to an inference endpoint framed by a Content-Length), `None` when the
/// request is hyper's or its head is not whole yet. For the differential fuzz target.
pub(crate) fn served_here(bytes: &[u8], max_bytes: usize) -> Option<(String, u64)> {
    let mut buf = BytesMut::from(bytes);
    match parse_head(&mut buf, max_bytes, &[]) {
        Parsed::Ours(request) => Some((request.endpoint.path().to_owned(), request.length)),
        Parsed::Partial | Parsed::Theirs => None,
    }
}

/// A Content-Length's digits as a number; `None` for anything else.
fn content_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, digit| n * 10 + u64::from(digit - b'0')))
}

/// What a connection does next.
enum Next {
    Serve(Request),
    HandOver,
    Close,
}

struct Connection {
    io: ClientIo,
    /// Read from the client and not yet taken: the start of the next request.
    buf: BytesMut,
    /// An answer's head being written (its allocation kept from answer to answer).
    head: Vec<u8>,
    /// The deadline of the request head being read, reset for each request.
    header_timer: Pin<Box<Sleep>>,
    limits: ConnectionLimits,
}

/// A request body still arriving, fed to its handler as it takes it: through a channel of
/// [`FEED_CHUNKS`] reads, and while that is full the bytes wait in the connection's buffer,
/// which is not read past a head's worth. A body waits in no unbounded buffer.
struct Feed {
    to_handler: mpsc::Sender<Result<Bytes, std::io::Error>>,
    /// Bytes of the body not yet read.
    remaining: u64,
}

/// Reads of a body that may wait for its handler.
const FEED_CHUNKS: usize = 2;

/// Resolves once `feed`'s handler can take more (at once without a feed).
async fn room(feed: &Option<Feed>) {
    if let Some(Feed { to_handler, .. }) = feed {
        // The permit is given back at once: the next feed takes it again.
        let _ = to_handler.reserve().await;
    }
}

impl Connection {
    /// Waits for the next request head: within the header timeout, and only while the stop
    /// has not come when nothing of it has arrived.
    async fn next_request(
        &mut self,
        kept: &[HeaderName],
        stop: &mut watch::Receiver<bool>,
    ) -> Next {
        let mut timing = false;
        // After a partial head, the bytes known to hold no end of it: the head is parsed
        // again only once a read brings its end (or passes the size limit), not on every read
        // (a head sent a byte at a time would be parsed once per byte).
        let mut scanned: Option<usize> = None;
        loop {
            let max = self.limits.max_header_bytes;
            if !self.buf.is_empty()
                && scanned.is_none_or(|from| self.buf.len() >= max || head_ends(&self.buf, from))
            {
                match parse_head(&mut self.buf, max, kept) {
                    Parsed::Ours(request) => return Next::Serve(request),
                    Parsed::Theirs => return Next::HandOver,
                    Parsed::Partial => scanned = Some(self.buf.len()),
                }
            }
            if self.buf.is_empty() && *stop.borrow_and_update() {
                return Next::Close;
            }
            if !timing {
                self.header_timer.as_mut().reset(Instant::now() + self.limits.header_read);
                timing = true;
            }
            self.make_room();
            tokio::select! {
                biased;
                read = self.io.read_buf(&mut self.buf) => match read {
                    Ok(0) | Err(_) => return Next::Close,
                    Ok(_) => {}
                },
                () = &mut self.header_timer => return Next::Close,
                changed = stop.changed(), if self.buf.is_empty() => {
                    // A router that went away without a stop stops too.
                    if changed.is_err() {
                        return Next::Close;
                    }
                }
            }
        }
    }

    /// Serves one request and writes its answer; whether the connection stays open.
    async fn exchange(
        &mut self,
        request: Request,
        ctx: &Arc<AppContext>,
        stop: &watch::Receiver<bool>,
    ) -> bool {
        let Request { endpoint, headers, length, close } = request;
        // The body whole when it came with the head (the usual case), else fed as it comes.
        let (body, mut feed) = if self.buf.len() as u64 >= length {
            let length = usize::try_from(length).unwrap_or(usize::MAX);
            (Body::from(self.buf.split_to(length).freeze()), None)
        } else {
            let (to_handler, from_client) = mpsc::channel(FEED_CHUNKS);
            let mut feed = Some(Feed { to_handler, remaining: length });
            self.feed(&mut feed);
            (Body::from_stream(ReceiverStream::new(from_client)), feed)
        };
        // The loop serves no `Expect` (hyper does), and knows the length it read.
        let framing = BodyFraming { declared: Some(length), waits_for_continue: false };
        let body = IncomingBody { body, framing };
        let mut answer = std::pin::pin!(front::serve(endpoint, Arc::clone(ctx), headers, body));
        let response = loop {
            let waiting = self.waits_for_room(&feed);
            tokio::select! {
                biased;
                response = &mut answer => break response,
                () = room(&feed), if waiting => self.feed(&mut feed),
                read = self.read(), if self.wants_read() => {
                    if !read {
                        // The client is gone: dropping its request cancels it.
                        return false;
                    }
                    self.feed(&mut feed);
                }
            }
        };
        let close = close || *stop.borrow();
        if !self.answer(response, close, &mut feed).await {
            return false;
        }
        // A body still arriving for a handler that holds it (a refused body drained in the
        // background) is read to its end before the next request.
        while let Some(Feed { to_handler, .. }) = &feed {
            let waiting = self.waits_for_room(&feed);
            let read = tokio::select! {
                () = room(&feed), if waiting => true,
                read = self.read(), if !waiting => read,
                () = to_handler.closed() => false,
            };
            if !read {
                return false;
            }
            self.feed(&mut feed);
        }
        !close
    }

    /// Writes `response`, its head (with `connection: close` when `close`) and then its body
    /// as it comes; whether it was written whole.
    async fn answer(&mut self, response: Response, close: bool, feed: &mut Option<Feed>) -> bool {
        let (parts, mut body) = response.into_parts();
        let framing = write_head(&mut self.head, parts.status, &parts.headers, &body, close);
        let mut head_pending = true;
        let mut written = 0u64;
        loop {
            let waiting = self.waits_for_room(feed);
            let step = tokio::select! {
                biased;
                step = next_step(&mut body, head_pending) => step,
                () = room(feed), if waiting => {
                    self.feed(feed);
                    continue;
                }
                read = self.read(), if self.wants_read() => {
                    if !read {
                        return false;
                    }
                    self.feed(feed);
                    continue;
                }
            };
            let head: &[u8] = if head_pending { &self.head } else { &[] };
            let mut size_line = ChunkSize::default();
            let (wrote, ended) = match step {
                Step::Flush => (write_all(&mut self.io, &mut [IoSlice::new(head)]).await, false),
                Step::Data(data) => {
                    written += data.len() as u64;
                    // Known before the write: the last chunk then goes out with the last data.
                    let ended = body.is_end_stream();
                    let wrote = match framing {
                        Framing::Length(declared) if written > declared => return false,
                        Framing::Length(_) => {
                            write_all(&mut self.io, &mut [IoSlice::new(head), IoSlice::new(&data)])
                                .await
                        }
                        Framing::None => write_all(&mut self.io, &mut [IoSlice::new(head)]).await,
                        Framing::Chunked => {
                            let end: &[u8] = if ended { b"\r\n0\r\n\r\n" } else { b"\r\n" };
                            let slices = &mut [
                                IoSlice::new(head),
                                IoSlice::new(size_line.of(data.len())),
                                IoSlice::new(&data),
                                IoSlice::new(end),
                            ];
                            write_all(&mut self.io, slices).await
                        }
                    };
                    (wrote, ended)
                }
                Step::End => {
                    let end: &[u8] = if framing == Framing::Chunked { b"0\r\n\r\n" } else { &[] };
                    let wrote =
                        write_all(&mut self.io, &mut [IoSlice::new(head), IoSlice::new(end)]).await;
                    (wrote, true)
                }
                // The answer broke off: the client sees it cut short and the connection closed.
                Step::Failed => return false,
            };
            if wrote.is_err() {
                return false;
            }
            if ended {
                return written_whole(framing, written);
            }
            head_pending = false;
        }
    }

    /// Whether to read the client's socket while a request is served: to feed its body, to
    /// hear it close, or to take in its next request, up to one head's worth.
    fn wants_read(&self) -> bool {
        self.buf.len() < self.limits.max_header_bytes
    }

    /// Makes room in the buffer for a read when little is left. Requests split off the front
    /// share the buffer's allocation: a read into the room behind them costs nothing, where
    /// asking for a whole read's room each time would make a new buffer for every request.
    fn make_room(&mut self) {
        if self.buf.capacity() - self.buf.len() < READ_BYTES / 8 {
            self.buf.reserve(READ_BYTES);
        }
    }

    /// Reads what the client sent; false once it has closed its side (or the read failed).
    async fn read(&mut self) -> bool {
        self.make_room();
        matches!(self.io.read_buf(&mut self.buf).await, Ok(n) if n > 0)
    }

    /// Whether body bytes wait in the buffer for the handler to take more.
    fn waits_for_room(&self, feed: &Option<Feed>) -> bool {
        feed.as_ref().is_some_and(|f| f.to_handler.capacity() == 0 && !f.to_handler.is_closed())
            && !self.buf.is_empty()
    }

    /// Passes what has arrived of a request body to its handler while it has room; the feed
    /// ends with the body.
    fn feed(&mut self, feed: &mut Option<Feed>) {
        let Some(Feed { to_handler, remaining }) = feed else { return };
        let n = usize::try_from(*remaining).unwrap_or(usize::MAX).min(self.buf.len());
        if n > 0 {
            match to_handler.try_reserve() {
                Ok(permit) => permit.send(Ok(self.buf.split_to(n).freeze())),
                // The handler is behind: the bytes wait in the buffer.
                Err(mpsc::error::TrySendError::Full(())) => return,
                // A handler that stopped reading: the bytes are dropped, still counted.
                Err(mpsc::error::TrySendError::Closed(())) => self.buf.advance(n),
            }
            *remaining -= n as u64;
        }
        if *remaining == 0 {
            *feed = None;
        }
    }
}

/// How an answer's body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// A Content-Length.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// No body (204 and 304).
    None,
}

/// Whether a body framed by `framing` ended where its framing said it would.
fn written_whole(framing: Framing, written: u64) -> bool {
    match framing {
        Framing::Length(declared) => written == declared,
        Framing::Chunked | Framing::None => true,
    }
}

/// Writes the head of an answer into `head` (cleared first): the status line, the handler's
/// fields, the date and the body's framing as hyper would add them, and `connection: close`
/// when `close`.
fn write_head(
    head: &mut Vec<u8>,
    status: StatusCode,
    fields: &HeaderMap,
    body: &Body,
    close: bool,
) -> Framing {
    head.clear();
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    head.extend_from_slice(b"\r\n");
    // The fields the framing depends on are noted as they are written, not looked up.
    let (mut dated, mut length, mut connection) = (false, None, false);
    for (name, value) in fields {
        field(head, name.as_str().as_bytes(), value.as_bytes());
        if *name == DATE {
            dated = true;
        } else if *name == CONTENT_LENGTH {
            length = length.or(Some(value));
        } else if *name == CONNECTION {
            connection = true;
        }
    }
    if !dated {
        DATE_NOW.with_borrow_mut(|date| field(head, b"date", date.now()));
    }
    let framing = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        Framing::None
    } else if let Some(declared) = length.and_then(|v| content_length(v.as_bytes())) {
        Framing::Length(declared)
    } else if let Some(exact) = body.size_hint().exact() {
        let mut digits = [0; 20];
        field(head, b"content-length", h1_text::decimal(exact, &mut digits));
        Framing::Length(exact)
    } else {
        field(head, b"transfer-encoding", b"chunked");
        Framing::Chunked
    };
    if close && !connection {
        field(head, b"connection", b"close");
    }
    head.extend_from_slice(b"\r\n");
    framing
}

/// A chunk's size line (`1a2b\r\n`), written on the stack.
#[derive(Default)]
struct ChunkSize([u8; 18]);

impl ChunkSize {
    fn of(&mut self, n: usize) -> &[u8] {
        let mut at = self.0.len() - 2;
        self.0[at..].copy_from_slice(b"\r\n");
        let mut n = n;
        loop {
            at -= 1;
            self.0[at] = b"0123456789abcdef"[n & 0xf];
            n >>= 4;
            if n == 0 {
                return &self.0[at..];
            }
        }
    }
}

/// The next thing to do with an answer's body.
enum Step {
    /// Nothing yet: the head goes out alone, so the client hears of the answer.
    Flush,
    Data(Bytes),
    End,
    Failed,
}

/// The body's next step; [`Step::Flush`] when it has nothing yet and the head is unwritten.
async fn next_step(body: &mut Body, head_pending: bool) -> Step {
    poll_fn(|cx| {
        loop {
            return match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => Poll::Ready(Step::Data(data)),
                    // Trailers: HTTP/1.1 answers here carry none.
                    Err(_) => continue,
                },
                Poll::Ready(Some(Err(_))) => Poll::Ready(Step::Failed),
                Poll::Ready(None) => Poll::Ready(Step::End),
                Poll::Pending if head_pending => Poll::Ready(Step::Flush),
                Poll::Pending => Poll::Pending,
            };
        }
    })
    .await
}

/// Writes every byte of `slices`, in as few system calls as the socket allows.
async fn write_all(io: &mut ClientIo, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let n = io.write_vectored(slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

/// The `Date` field's value, formatted once a second per thread.
struct DateNow {
    second: u64,
    text: [u8; 29],
}

impl DateNow {
    fn now(&mut self) -> &[u8] {
        let now = SystemTime::now();
        let second = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if second != self.second {
            self.second = second;
            let text = httpdate::fmt_http_date(now);
            if text.len() == self.text.len() {
                self.text.copy_from_slice(text.as_bytes());
            }
        }
        &self.text
    }
}

thread_local! {
    static DATE_NOW: RefCell<DateNow> = const { RefCell::new(DateNow { second: 0, text: [b' '; 29] }) };
}

/// A client connection handed to hyper: the bytes read from it so far, then the socket.
pub(super) struct Rewound {
    read: Bytes,
    io: ClientIo,
}

impl Rewound {
    /// A connection nothing has been read from yet.
    pub(super) fn unread(io: ClientIo) -> Self {
        Self { read: Bytes::new(), io }
    }
}

impl AsyncRead for Rewound {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.read.is_empty() {
            return self.io.as_mut().poll_read(cx, buf);
        }
        let n = self.read.len().min(buf.remaining());
        buf.put_slice(&self.read.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Rewound {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.io.as_mut().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.io.as_mut().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io.as_mut().poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
