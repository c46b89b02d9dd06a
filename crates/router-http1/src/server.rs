//! The server side's connection driver: the own HTTP/1.1 loop, generic over a [`Handler`].
//!
//! The common request, an HTTP/1.1 `POST` to a path the handler routes whose body is framed by
//! a Content-Length, is read here with httparse ([`crate::request`]), handed to the handler,
//! and its answer is written here ([`crate::response`]): no task, channel or second buffer sits
//! between the client's socket and the handler. Of its head, only the fields the handler names
//! ([`Handler::kept`]) are kept; the others are read past. The first request of any other shape
//! (another route or method, a chunked body, `Expect: 100-continue`, an upgrade, HTTP/1.0, a
//! head that does not parse or is too large) hands the connection back ([`Ended::HandedOver`])
//! with every byte read from it so far, for a general server (hyper) to serve as it serves
//! every other connection, answering the errors in its own words.
//!
//! The loop keeps what hyper guarantees a connection:
//! - the request head within [`Limits::header_read`], also while a kept-alive connection waits
//!   for its next request, and at most [`Limits::max_header_bytes`];
//! - a client that closes its side cancels its request, as dropping it does everywhere;
//! - pipelined requests answered in order, a body that arrives after its head fed to the
//!   handler as fast as it takes it (the socket is not read while it is behind), and a body
//!   the handler refused read to its end (or closed on);
//! - a stop lets the request in progress finish, answers it with `connection: close`, and
//!   closes idle connections at once.
//!
//! Write timeouts belong to the socket the caller passes in (the router's is a
//! `tokio_io_timeout::TimeoutStream`).

use std::future::Future;
use std::future::poll_fn;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, Sleep};

use crate::request::{Parsed, Request, head_ends, parse_request_head};
use crate::response::{ChunkSize, Framing, write_response_head};

/// What serves the requests the own loop reads.
pub trait Handler: Sync {
    /// What a routed path is served by.
    type Route: Send;
    /// The body of an answer.
    type Body: Body<Data = Bytes> + Unpin + Send;

    /// What serves a `POST` to `path` (without its query), `None` for a path left to the
    /// general server. Must accept only paths a URI may hold.
    fn route(&self, path: &str) -> Option<Self::Route>;

    /// The request header fields the handler reads: the only ones kept of a head.
    fn kept(&self) -> &[HeaderName];

    /// Serves one request: its route, its kept fields and its body.
    fn call(
        &self,
        route: Self::Route,
        headers: HeaderMap,
        body: RequestBody,
    ) -> impl Future<Output = Response<Self::Body>> + Send;
}

/// The bounds on reading request heads.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A whole request head (slowloris), from its first byte or from the end of the answer
    /// before it.
    pub header_read: Duration,
    /// The largest request head.
    pub max_header_bytes: usize,
}

/// The room each read of the client's socket asks for.
const READ_BYTES: usize = 8 * 1024;

/// How a connection's time with this loop ended.
pub enum Ended<IO> {
    /// Closed (by either side, a timeout, or the stop).
    Closed,
    /// A request this loop does not serve: the connection and what was read of it, for the
    /// general server.
    HandedOver(Rewound<IO>),
}

/// Serves the client on `io` until it closes, `stop` turns true while it is idle, or it sends
/// a request this loop leaves to the general server.
pub async fn serve<IO, H>(
    io: IO,
    handler: &H,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) -> Ended<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    H: Handler,
{
    let mut connection = Connection {
        io,
        buf: BytesMut::with_capacity(READ_BYTES),
        head: Vec::with_capacity(512),
        header_timer: Box::pin(tokio::time::sleep(limits.header_read)),
        limits,
    };
    loop {
        let request = match connection.next_request(handler, &mut stop).await {
            Next::Serve(request) => request,
            Next::HandOver => {
                let Connection { io, buf, .. } = connection;
                return Ended::HandedOver(Rewound { read: buf.freeze(), io });
            }
            Next::Close => return Ended::Closed,
        };
        if !connection.exchange(request, handler, &stop).await {
            return Ended::Closed;
        }
    }
}

/// A request's body as the handler reads it: whole when it came with its head (the usual
/// case), else fed as it arrives.
#[derive(Debug)]
pub struct RequestBody {
    /// The Content-Length.
    length: u64,
    arriving: Arriving,
}

#[derive(Debug)]
enum Arriving {
    /// All of it, until taken.
    Whole(Option<Bytes>),
    /// From the connection, as it reads the body.
    Fed(mpsc::Receiver<Result<Bytes, std::io::Error>>),
}

impl RequestBody {
    /// The body's length, as its head declared it.
    pub fn length(&self) -> u64 {
        self.length
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match &mut self.arriving {
            Arriving::Whole(whole) => Poll::Ready(whole.take().map(|data| Ok(Frame::data(data)))),
            Arriving::Fed(from_client) => {
                from_client.poll_recv(cx).map(|fed| fed.map(|data| data.map(Frame::data)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.arriving, Arriving::Whole(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.arriving {
            Arriving::Whole(whole) => {
                SizeHint::with_exact(whole.as_ref().map_or(0, |data| data.len() as u64))
            }
            Arriving::Fed(_) => SizeHint::default(),
        }
    }
}

/// What a connection does next.
enum Next<R> {
    Serve(Request<R>),
    HandOver,
    Close,
}

struct Connection<IO> {
    io: IO,
    /// Read from the client and not yet taken: the start of the next request.
    buf: BytesMut,
    /// An answer's head being written (its allocation kept from answer to answer).
    head: Vec<u8>,
    /// The deadline of the request head being read, reset for each request.
    header_timer: Pin<Box<Sleep>>,
    limits: Limits,
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

impl<IO: AsyncRead + AsyncWrite + Unpin> Connection<IO> {
    /// Waits for the next request head: within the header timeout, and only while the stop
    /// has not come when nothing of it has arrived.
    async fn next_request<H: Handler>(
        &mut self,
        handler: &H,
        stop: &mut watch::Receiver<bool>,
    ) -> Next<H::Route> {
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
                match parse_request_head(&mut self.buf, max, handler.kept(), |path| {
                    handler.route(path)
                }) {
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
    async fn exchange<H: Handler>(
        &mut self,
        request: Request<H::Route>,
        handler: &H,
        stop: &watch::Receiver<bool>,
    ) -> bool {
        let Request { route, headers, length, close } = request;
        // The body whole when it came with the head (the usual case), else fed as it comes.
        let (arriving, mut feed) = if self.buf.len() as u64 >= length {
            let whole = usize::try_from(length).unwrap_or(usize::MAX);
            let data = (whole > 0).then(|| self.buf.split_to(whole).freeze());
            (Arriving::Whole(data), None)
        } else {
            let (to_handler, from_client) = mpsc::channel(FEED_CHUNKS);
            let mut feed = Some(Feed { to_handler, remaining: length });
            self.feed(&mut feed);
            (Arriving::Fed(from_client), feed)
        };
        let body = RequestBody { length, arriving };
        let mut answer = std::pin::pin!(handler.call(route, headers, body));
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
    async fn answer<B: Body<Data = Bytes> + Unpin>(
        &mut self,
        response: Response<B>,
        close: bool,
        feed: &mut Option<Feed>,
    ) -> bool {
        let (parts, mut body) = response.into_parts();
        let exact = body.size_hint().exact();
        let framing =
            write_response_head(&mut self.head, parts.status, &parts.headers, exact, close);
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
                return framing.written_whole(written);
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

/// The next thing to do with an answer's body.
enum Step {
    /// Nothing yet: the head goes out alone, so the client hears of the answer.
    Flush,
    Data(Bytes),
    End,
    Failed,
}

/// The body's next step; [`Step::Flush`] when it has nothing yet and the head is unwritten.
async fn next_step<B: Body<Data = Bytes> + Unpin>(body: &mut B, head_pending: bool) -> Step {
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
async fn write_all<IO: AsyncWrite + Unpin>(
    io: &mut IO,
    mut slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
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

/// A client connection handed to the general server: the bytes read from it so far, then the
/// socket.
#[derive(Debug)]
pub struct Rewound<IO> {
    read: Bytes,
    io: IO,
}

impl<IO> Rewound<IO> {
    /// A connection nothing has been read from yet.
    pub fn unread(io: IO) -> Self {
        Self { read: Bytes::new(), io }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewound<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.read.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.read.len().min(buf.remaining());
        buf.put_slice(&self.read.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewound<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
