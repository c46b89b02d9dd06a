//! The client side's connections, driven by the requests that use them: a request
//! writes its head and body in one vectored write and reads the answer's head itself, and the
//! answer's body reads the rest from the same socket as the client's side polls it. No task
//! of its own runs per connection, so an answer never crosses a task boundary between the
//! engine's socket and the router's client (see [`crate::answer`] for the bytes).
//!
//! Idle connections wait in a per-thread list per engine, the most recently used taken
//! first; an answer read to its end puts its connection back (unless the engine said
//! `Connection: close`, framed the body by closing, or sent bytes beyond the answer). A body
//! dropped early drops its connection, which closes it: the engine sees its client go and
//! cancels the request. Before reuse, a connection is checked without a system call for what
//! the event loop already knows: one the engine closed while it sat idle, or past the idle
//! timeout, is dropped, and a request whose write fails on a reused connection goes out again
//! on another (the engine cannot have read all of it).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{Response, Version};
use http_body::{Body, Frame, SizeHint};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Sleep, sleep_until};
use tower::ServiceExt as _;

use crate::BoxError;
use crate::answer::{AnswerHead, Decoded, Reading, WireError, final_head};

/// Bytes an answer's first read asks for at least: a read that fills all the room it had
/// doubles the next one's, up to [`MAX_READ_SIZE`], so that a large answer takes few reads.
const READ_SIZE: usize = 8 * 1024;

/// The most bytes one read asks for.
const MAX_READ_SIZE: usize = 256 * 1024;

/// A connection's read buffer over this size is not kept while it idles.
const KEPT_BUFFER: usize = 64 * 1024;

/// What a connector makes: an engine connection over plain TCP or TLS.
pub type Stream = MaybeHttpsStream<TokioIo<TcpStream>>;

/// An engine connection as this module reads and writes it.
type Io = TokioIo<Stream>;

/// A connection and the bytes read from it but not yet used. Always boxed: a TLS stream is
/// large, and a connection moves from the pool to a request to its answer and back.
struct Conn {
    io: Io,
    buf: BytesMut,
    /// Room the buffer is given when it runs short.
    read_size: usize,
    /// When it was last put back.
    idle_since: Instant,
    /// The timer of the exchange under way (taken while it runs), kept for the next one:
    /// moving a registered timer's deadline later costs a compare-and-swap, where a fresh
    /// timer per request is put into the timer wheel and taken out again.
    timer: Option<Pin<Box<Sleep>>>,
}

/// Where an exchange failed: writing the request (which a reused connection retries), or
/// reading the answer's head.
enum Failed {
    Write(std::io::Error),
    Read(WireError),
}

impl Conn {
    /// Writes the request `head` and `body` in one vectored write and reads the answer's head.
    async fn exchange(&mut self, head: &[u8], body: &Bytes) -> Result<AnswerHead, Failed> {
        let mut request = bytes::Buf::chain(head, &body[..]);
        let written = async {
            self.io.write_all_buf(&mut request).await?;
            self.io.flush().await
        };
        written.await.map_err(Failed::Write)?;
        read_head(self).await.map_err(Failed::Read)
    }

    /// Reads what the socket holds onto the end of the buffer: the bytes read, 0 at EOF.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 8 {
            self.buf.reserve(self.read_size);
        }
        let room = self.buf.capacity() - self.buf.len();
        let read =
            ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf))?;
        if read == room {
            self.read_size = (self.read_size * 2).min(MAX_READ_SIZE);
        }
        Poll::Ready(Ok(read))
    }
}

/// One engine's idle connections on one thread, the most recently used at the back, at most
/// `max` of them.
struct Idle {
    conns: Mutex<VecDeque<Box<Conn>>>,
    max: usize,
}

impl Idle {
    /// Puts `conn`, its answer read, back; dropped (closed) when the list is full.
    fn put_back(&self, mut conn: Box<Conn>) {
        if conn.buf.capacity() > KEPT_BUFFER {
            conn.buf = BytesMut::new();
        }
        conn.read_size = READ_SIZE;
        conn.idle_since = Instant::now();
        let mut conns = self.conns.lock();
        if conns.len() < self.max {
            conns.push_back(conn);
        }
    }
}

/// One thread's idle lists of one forwarder, by engine URL.
type Engines = hashbrown::HashMap<String, Arc<Idle>>;

thread_local! {
    /// This thread's idle lists of each forwarder (by id).
    static POOLS: std::cell::RefCell<Vec<(u64, Engines)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Why a request got no answer head.
#[derive(Debug)]
pub enum H1Error {
    /// No connection could be made (connect, TLS handshake, setup timeout).
    Connect(BoxError),
    /// No answer head came within the time given.
    TimedOut,
    /// The exchange failed on a connection.
    Exchange(WireError),
}

/// The connection settings of one user's pools (a forwarder's, in the router), whose new
/// connections `connector` makes (the whole setup, TLS included, bounded by its own timeout).
pub struct H1Pool<'f, C> {
    /// The user's id in each thread's table.
    pub id: u64,
    /// Makes new connections.
    pub connector: &'f C,
    /// Idle connections kept per engine and thread.
    pub max_per_engine: usize,
    /// An idle connection older than this is closed, not reused.
    pub idle_timeout: Duration,
}

impl<C> H1Pool<'_, C>
where
    C: tower::Service<http::Uri, Response = Stream, Error = BoxError> + Clone,
{
    /// Sends the request `head` and `body` to the engine at `url`, whose new connections are
    /// made to `connect_uri`, and reads the answer's head, all within `timeout`.
    pub async fn send(
        &self,
        url: &str,
        connect_uri: impl Fn() -> http::Uri,
        head: &[u8],
        body: &Bytes,
        timeout: Duration,
    ) -> Result<Response<H1Answer>, H1Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let idle = self.idle_list(url);
        loop {
            let (mut conn, reused) = match self.checkout(&idle) {
                Some(conn) => (conn, true),
                // Boxed: connecting is rare and its future large, which every request's
                // future would otherwise carry (and copy).
                None => (Box::pin(self.connect(connect_uri(), deadline)).await?, false),
            };
            let mut timer = conn.timer.take().unwrap_or_else(|| Box::pin(sleep_until(deadline)));
            timer.as_mut().reset(deadline);
            let exchanged = tokio::select! {
                biased;
                exchanged = conn.exchange(head, body) => exchanged,
                () = timer.as_mut() => return Err(H1Error::TimedOut),
            };
            conn.timer = Some(timer);
            match exchanged {
                Ok(head) => return Ok(H1Answer::response(head, conn, idle)),
                // The engine closed it as it sat idle and cannot have read the whole request:
                // another connection (or a new one) gets it.
                Err(Failed::Write(_)) if reused => continue,
                Err(Failed::Write(err)) => return Err(H1Error::Exchange(err.into())),
                Err(Failed::Read(err)) => return Err(H1Error::Exchange(err)),
            }
        }
    }

    /// This thread's idle list of `url` (made on first use).
    fn idle_list(&self, url: &str) -> Arc<Idle> {
        POOLS.with_borrow_mut(|pools| {
            let at = match pools.iter().position(|(id, _)| *id == self.id) {
                Some(at) => at,
                None => {
                    pools.push((self.id, Engines::default()));
                    pools.len() - 1
                }
            };
            // The URL is copied only for an engine's first connection.
            let max = self.max_per_engine;
            let idle = pools[at]
                .1
                .entry_ref(url)
                .or_insert_with(|| Arc::new(Idle { conns: Mutex::new(VecDeque::new()), max }));
            Arc::clone(idle)
        })
    }

    /// The most recently used idle connection that is still open, dropping those the engine
    /// closed and those idle past the timeout.
    fn checkout(&self, idle: &Idle) -> Option<Box<Conn>> {
        let mut conns = idle.conns.lock();
        let now = Instant::now();
        while let Some(mut conn) = conns.pop_back() {
            if now.saturating_duration_since(conn.idle_since) > self.idle_timeout {
                // The rest waited longer still.
                conns.clear();
                return None;
            }
            if !closed_while_idle(&mut conn.io) {
                return Some(conn);
            }
        }
        None
    }

    /// A new connection to `uri`'s engine, for an exchange due by `deadline`.
    async fn connect(
        &self,
        uri: http::Uri,
        deadline: tokio::time::Instant,
    ) -> Result<Box<Conn>, H1Error> {
        let connecting = self.connector.clone().oneshot(uri);
        let stream = match tokio::time::timeout_at(deadline, connecting).await {
            Ok(connected) => connected.map_err(H1Error::Connect)?,
            Err(_) => return Err(H1Error::TimedOut),
        };
        let buf = BytesMut::with_capacity(READ_SIZE);
        let io = TokioIo::new(stream);
        let timer = Some(Box::pin(tokio::time::sleep_until(deadline)));
        Ok(Box::new(Conn { io, buf, read_size: READ_SIZE, idle_since: Instant::now(), timer }))
    }
}

/// Whether an idle connection's engine closed it (or sent something unasked, which spoils it
/// too). Only what the event loop already reported is looked at: a connection with nothing to
/// read answers at once, without a system call.
fn closed_while_idle(io: &mut Io) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    let mut byte = [0; 1];
    let mut probe = ReadBuf::new(&mut byte);
    Pin::new(io).poll_read(&mut cx, &mut probe).is_ready()
}

/// Reads an answer's head from `conn`, skipping informational (1xx) ones.
async fn read_head(conn: &mut Conn) -> Result<AnswerHead, WireError> {
    loop {
        if let Some(head) = final_head(&mut conn.buf)? {
            return Ok(head);
        }
        if std::future::poll_fn(|cx| conn.poll_read(cx)).await? == 0 {
            return Err(WireError::Closed("head"));
        }
    }
}

/// An engine's answer body, read from its connection as it is polled.
pub struct H1Answer {
    /// `None` once the body is over (or failed).
    conn: Option<Box<Conn>>,
    reading: Reading,
    reusable: bool,
    /// Where the connection goes back to.
    idle: Arc<Idle>,
}

impl H1Answer {
    /// The response whose body reads the rest of the answer from `conn`.
    fn response(head: AnswerHead, conn: Box<Conn>, idle: Arc<Idle>) -> Response<Self> {
        let reading = Reading::from(head.framing);
        let mut answer = Self { conn: Some(conn), reading, reusable: head.reusable, idle };
        if matches!(answer.reading, Reading::Length(0)) {
            answer.release();
        }
        let mut response = Response::new(answer);
        *response.status_mut() = head.status;
        *response.version_mut() = Version::HTTP_11;
        *response.headers_mut() = head.headers;
        response
    }

    /// The body is over: the connection goes back to its idle list if it can carry another.
    fn release(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.reusable
            && conn.buf.is_empty()
        {
            self.idle.put_back(conn);
        }
    }
}

impl std::fmt::Debug for H1Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match (&self.conn, &self.reading) {
            (None, _) => "over",
            (Some(_), Reading::Length(_)) => "reading a length",
            (Some(_), Reading::Chunked(_)) => "reading chunks",
            (Some(_), Reading::UntilClose) => "reading until the engine closes",
        };
        f.debug_struct("H1Answer").field("state", &state).finish_non_exhaustive()
    }
}

impl Body for H1Answer {
    type Data = Bytes;
    type Error = WireError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, WireError>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = &mut this.conn else {
                return Poll::Ready(None);
            };
            let decoded = match this.reading.decode(&mut conn.buf) {
                Ok(decoded) => decoded,
                Err(err) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(err)));
                }
            };
            match decoded {
                Decoded::Data(data) => {
                    if matches!(this.reading, Reading::Length(0)) {
                        // The last byte is here: the connection can serve another request
                        // while this one is passed on.
                        this.release();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Decoded::End => {
                    this.release();
                    return Poll::Ready(None);
                }
                Decoded::More => match ready!(conn.poll_read(cx)) {
                    Ok(0) => {
                        this.conn = None;
                        return Poll::Ready(match this.reading {
                            Reading::UntilClose => None,
                            _ => Some(Err(WireError::Closed("body"))),
                        });
                    }
                    Ok(_) => {}
                    Err(err) => {
                        this.conn = None;
                        return Poll::Ready(Some(Err(err.into())));
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.conn, &self.reading) {
            (None, _) => SizeHint::with_exact(0),
            (Some(_), Reading::Length(left)) => SizeHint::with_exact(*left),
            _ => SizeHint::default(),
        }
    }
}
