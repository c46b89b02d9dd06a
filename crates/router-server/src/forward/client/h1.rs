//! The HTTP/1.1 connections to the engines, pooled per thread and engine: each connection's
//! hyper `SendRequest` stays in its engine's list while it serves a request, and a request
//! takes the first one whose connection is ready for another (the previous answer read to its
//! end), so a connection goes back to use without a task of its own to watch it. Connections
//! that closed, or idled past the idle timeout, are dropped as the list is scanned; a request
//! that a reused connection refused before writing it (the engine closed it as it sat idle)
//! is sent again on another, as hyper-util's client does.
//!
//! Scanning costs a few instructions a connection, so an engine with thousands of answers
//! streaming at once on one thread pays some microseconds a request more than an idle list
//! would; the pool it replaces spent more than that on every request (a hashed checkout, a
//! task per answer).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use tower::ServiceExt as _;

use super::EngineConnector;
use crate::error::BoxError;

/// A pooled connection.
struct Conn {
    send: SendRequest<Full<Bytes>>,
    /// When it was last taken for a request.
    used: Instant,
}

/// One thread's connections of one forwarder, by engine URL.
type Engines = hashbrown::HashMap<String, Vec<Conn>>;

thread_local! {
    /// This thread's connections of each forwarder (by id).
    static POOLS: RefCell<Vec<(u64, Engines)>> = const { RefCell::new(Vec::new()) };
}

/// Why a request got no response head.
pub(super) enum H1Error {
    /// No connection could be made (connect, TLS handshake, setup timeout).
    Connect(BoxError),
    /// The exchange failed on a connection.
    Exchange(hyper::Error),
}

/// The connection settings of a forwarder's HTTP/1.1 pools.
pub(super) struct H1Pool<'f> {
    /// The forwarder's id in each thread's table.
    pub id: u64,
    pub connector: &'f EngineConnector,
    /// Connections kept per engine and thread.
    pub max_per_engine: usize,
    pub idle_timeout: Duration,
}

impl H1Pool<'_> {
    /// Sends `request` (origin-form URI, `Host` set) to the engine at `url`, whose new
    /// connections are made to `connect_uri`, and waits for the response head.
    pub(super) async fn send(
        &self,
        url: &str,
        connect_uri: impl Fn() -> http::Uri,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, H1Error> {
        loop {
            let (mut conn, reused) = match self.checkout(url) {
                Some(conn) => (conn, true),
                // Boxed: connecting is rare and its future large, which every request's
                // future would otherwise carry (and copy).
                None => (Box::pin(self.connect(connect_uri())).await?, false),
            };
            match conn.send.try_send_request(request).await {
                Ok(response) => {
                    self.put_back(url, conn);
                    return Ok(response);
                }
                Err(mut err) => match err.take_message() {
                    // Refused before a byte was written: the engine closed this idle
                    // connection. Another (or a new one) gets the request.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(H1Error::Exchange(err.into_error())),
                },
            }
        }
    }

    /// A ready connection to `url` from this thread's pool, the closed and long-idle ones
    /// dropped on the way.
    fn checkout(&self, url: &str) -> Option<Conn> {
        POOLS.with_borrow_mut(|pools| {
            let conns = pools.iter_mut().find(|(id, _)| *id == self.id)?.1.get_mut(url)?;
            let now = Instant::now();
            let mut at = conns.len();
            while at > 0 {
                at -= 1;
                let conn = &conns[at];
                if conn.send.is_closed() {
                    conns.swap_remove(at);
                } else if conn.send.is_ready() {
                    if now.saturating_duration_since(conn.used) > self.idle_timeout {
                        conns.swap_remove(at);
                        continue;
                    }
                    let mut conn = conns.swap_remove(at);
                    conn.used = now;
                    return Some(conn);
                }
            }
            None
        })
    }

    /// Returns `conn` to `url`'s list, busy until its answer is read; dropped (closing once
    /// that answer is done) when the list is full.
    fn put_back(&self, url: &str, conn: Conn) {
        POOLS.with_borrow_mut(|pools| {
            let at = match pools.iter().position(|(id, _)| *id == self.id) {
                Some(at) => at,
                None => {
                    pools.push((self.id, Engines::default()));
                    pools.len() - 1
                }
            };
            // The URL is copied only for an engine's first connection.
            let conns = pools[at].1.entry_ref(url).or_default();
            if conns.len() < self.max_per_engine {
                conns.push(conn);
            }
        });
    }

    /// A new connection to `uri`'s engine, driven by a task of its own.
    async fn connect(&self, uri: http::Uri) -> Result<Conn, H1Error> {
        let io = self.connector.clone().oneshot(uri).await.map_err(H1Error::Connect)?;
        let (send, connection) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|err| H1Error::Connect(err.into()))?;
        tokio::spawn(async move {
            // Ends when the engine or the router closes the connection; the request it was
            // serving sees the error.
            let _ = connection.await;
        });
        Ok(Conn { send, used: Instant::now() })
    }
}
