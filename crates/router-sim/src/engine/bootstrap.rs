//! Prefill/decode disaggregation, SGLang style: the router gives both engines the same
//! `bootstrap_host`, `bootstrap_port` and `bootstrap_room`. The prefill engine serves a small
//! bootstrap HTTP server on its bootstrap port and marks the room ready once the prompt is
//! prefilled; the decode engine long-polls `GET /room/{room}` there (bounded), checks that
//! the room holds the same prompt, and then decodes.
//!
//! Bootstrap server: `GET /room/{room}?timeout_ms=N` answers 200 with the room's
//! [`RoomInfo`] as soon as it is ready (waiting at most `min(N, 30000)` ms), 410 when the
//! prefill failed, 404 when the room was not ready in time; `GET /health` answers 200.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

/// Rooms kept at most; the oldest are forgotten first.
const MAX_ROOMS: usize = 4096;
/// Longest single long-poll the server holds.
const MAX_POLL: Duration = Duration::from_secs(30);

/// What a ready room tells the decode engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RoomInfo {
    pub(crate) room: u64,
    pub(crate) prompt_tokens: usize,
    pub(crate) cached_tokens: usize,
    /// Hash of the prompt's token ids, so the decode side can tell it is the same prompt.
    pub(crate) prompt_hash: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RoomState {
    Pending,
    Ready(RoomInfo),
    Failed(String),
}

/// The prefill engine's rooms, each a watch channel that decode pollers wait on.
#[derive(Debug, Default)]
pub(crate) struct Rooms {
    inner: Mutex<RoomsInner>,
}

#[derive(Debug, Default)]
struct RoomsInner {
    rooms: HashMap<u64, watch::Sender<RoomState>>,
    order: VecDeque<u64>,
}

impl Rooms {
    fn sender(&self, room: u64) -> watch::Sender<RoomState> {
        let mut inner = self.inner.lock();
        if let Some(sender) = inner.rooms.get(&room) {
            return sender.clone();
        }
        if inner.order.len() == MAX_ROOMS
            && let Some(oldest) = inner.order.pop_front()
        {
            inner.rooms.remove(&oldest);
        }
        let (sender, _) = watch::channel(RoomState::Pending);
        inner.rooms.insert(room, sender.clone());
        inner.order.push_back(room);
        sender
    }

    /// Sets a room's state, creating the room if needed.
    pub(crate) fn set(&self, room: u64, state: RoomState) {
        self.sender(room).send_replace(state);
    }

    /// Waits up to `timeout` for the room to be ready or failed.
    pub(crate) async fn wait(&self, room: u64, timeout: Duration) -> RoomState {
        let mut rx = self.sender(room).subscribe();
        let settled =
            tokio::time::timeout(timeout, rx.wait_for(|s| *s != RoomState::Pending)).await;
        match settled {
            Ok(Ok(state)) => state.clone(),
            _ => RoomState::Pending,
        }
    }
}

/// A prefill request's hold on its room: marks it ready with the cached token count, or
/// failed if the request ends (error, client gone, engine stopping) before its prefill did.
#[derive(Debug)]
pub(crate) struct RoomGuard {
    rooms: Arc<Rooms>,
    room: u64,
    prompt_tokens: usize,
    prompt_hash: String,
    settled: bool,
}

impl RoomGuard {
    pub(crate) fn new(rooms: Arc<Rooms>, room: u64) -> Self {
        Self { rooms, room, prompt_tokens: 0, prompt_hash: String::new(), settled: false }
    }

    /// Records the prompt the room will hold.
    pub(crate) fn describe(&mut self, prompt_tokens: usize, prompt_hash: String) {
        self.prompt_tokens = prompt_tokens;
        self.prompt_hash = prompt_hash;
    }

    /// The prompt is prefilled: the decode side may go on.
    pub(crate) fn ready(&mut self, cached_tokens: usize) {
        if self.settled {
            return;
        }
        self.settled = true;
        self.rooms.set(
            self.room,
            RoomState::Ready(RoomInfo {
                room: self.room,
                prompt_tokens: self.prompt_tokens,
                cached_tokens,
                prompt_hash: self.prompt_hash.clone(),
            }),
        );
    }

    /// The prefill will not happen, for `reason`.
    pub(crate) fn fail(&mut self, reason: &str) {
        if !self.settled {
            self.settled = true;
            self.rooms.set(self.room, RoomState::Failed(reason.to_owned()));
        }
    }
}

impl Drop for RoomGuard {
    fn drop(&mut self) {
        self.fail("prefill did not complete");
    }
}

#[derive(Deserialize)]
struct PollQuery {
    timeout_ms: Option<u64>,
}

async fn poll_room(
    State(rooms): State<Arc<Rooms>>,
    Path(room): Path<u64>,
    Query(query): Query<PollQuery>,
) -> Response {
    let timeout = query.timeout_ms.map_or(MAX_POLL, Duration::from_millis).min(MAX_POLL);
    match rooms.wait(room, timeout).await {
        RoomState::Ready(info) => Json(info).into_response(),
        RoomState::Failed(reason) => {
            (StatusCode::GONE, Json(serde_json::json!({ "error": reason }))).into_response()
        }
        RoomState::Pending => {
            let message =
                format!("bootstrap room {room} not ready after {} ms", timeout.as_millis());
            (StatusCode::NOT_FOUND, Json(serde_json::json!({ "error": message }))).into_response()
        }
    }
}

/// The bootstrap server's routes.
pub(crate) fn router(rooms: Arc<Rooms>) -> Router {
    Router::new()
        .route("/room/{room}", get(poll_room))
        .route("/health", get(|| async { StatusCode::OK }))
        .with_state(rooms)
}

/// Why the decode side could not get the prefill's KV.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BootstrapError {
    #[error("bootstrap room {room} not ready at {server} after {waited_ms} ms")]
    NotReady { room: u64, server: String, waited_ms: u128 },
    #[error("prefill for bootstrap room {room} failed: {reason}")]
    PrefillFailed { room: u64, reason: String },
    #[error(
        "bootstrap room {room} holds a different prompt ({theirs} tokens, hash {their_hash}) than this request ({ours} tokens, hash {our_hash})"
    )]
    Mismatch { room: u64, theirs: usize, their_hash: String, ours: usize, our_hash: String },
    #[error("bootstrap server {server} unreachable")]
    Unreachable {
        server: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("bootstrap server {server} answered {status} for room {room}")]
    BadAnswer { server: String, room: u64, status: StatusCode },
}

impl BootstrapError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            BootstrapError::NotReady { .. } => StatusCode::GATEWAY_TIMEOUT,
            BootstrapError::Mismatch { .. } => StatusCode::CONFLICT,
            BootstrapError::PrefillFailed { .. }
            | BootstrapError::Unreachable { .. }
            | BootstrapError::BadAnswer { .. } => StatusCode::BAD_GATEWAY,
        }
    }
}

/// The decode side's client of prefill bootstrap servers.
#[derive(Clone, Debug)]
pub(crate) struct BootstrapClient {
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl BootstrapClient {
    pub(crate) fn new(timeout: Duration) -> Self {
        let client =
            Client::builder(hyper_util::rt::TokioExecutor::new()).build(HttpConnector::new());
        Self { client, timeout }
    }

    /// Waits for `room` at `host:port` (within the configured bound) and checks that it holds
    /// the prompt with `prompt_tokens` tokens and `prompt_hash`.
    pub(crate) async fn fetch(
        &self,
        host: &str,
        port: u16,
        room: u64,
        prompt_tokens: usize,
        prompt_hash: &str,
    ) -> Result<RoomInfo, BootstrapError> {
        let server = if host.contains(':') && !host.starts_with('[') {
            format!("http://[{host}]:{port}")
        } else {
            format!("http://{host}:{port}")
        };
        let start = Instant::now();
        let deadline = start + self.timeout;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let uri = format!("{server}/room/{room}?timeout_ms={}", remaining.as_millis());
            let unreachable = |source: Box<dyn std::error::Error + Send + Sync>| {
                BootstrapError::Unreachable { server: server.clone(), source }
            };
            let uri: http::Uri =
                uri.parse().map_err(|e: http::uri::InvalidUri| unreachable(Box::new(e)))?;
            let response =
                tokio::time::timeout(remaining + Duration::from_secs(1), self.client.get(uri))
                    .await
                    .map_err(|e| unreachable(Box::new(e)))?
                    .map_err(|e| unreachable(Box::new(e)))?;
            let status = response.status();
            let body =
                response.into_body().collect().await.map_err(|e| unreachable(Box::new(e)))?;
            let body = body.to_bytes();
            match status {
                StatusCode::OK => {
                    let info: RoomInfo =
                        serde_json::from_slice(&body).map_err(|e| unreachable(Box::new(e)))?;
                    if info.prompt_tokens != prompt_tokens || info.prompt_hash != prompt_hash {
                        return Err(BootstrapError::Mismatch {
                            room,
                            theirs: info.prompt_tokens,
                            their_hash: info.prompt_hash,
                            ours: prompt_tokens,
                            our_hash: prompt_hash.to_owned(),
                        });
                    }
                    return Ok(info);
                }
                StatusCode::GONE => {
                    let reason = serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                        .unwrap_or_else(|| "unknown".to_owned());
                    return Err(BootstrapError::PrefillFailed { room, reason });
                }
                StatusCode::NOT_FOUND if Instant::now() < deadline => continue,
                StatusCode::NOT_FOUND => {
                    return Err(BootstrapError::NotReady {
                        room,
                        server,
                        waited_ms: start.elapsed().as_millis(),
                    });
                }
                status => return Err(BootstrapError::BadAnswer { server, room, status }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(room: u64) -> RoomInfo {
        RoomInfo { room, prompt_tokens: 10, cached_tokens: 4, prompt_hash: "ab".into() }
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_see_the_room_once_ready() {
        let rooms = Arc::new(Rooms::default());
        let waiter = {
            let rooms = Arc::clone(&rooms);
            tokio::spawn(async move { rooms.wait(7, Duration::from_secs(5)).await })
        };
        tokio::task::yield_now().await;
        rooms.set(7, RoomState::Ready(info(7)));
        assert_eq!(waiter.await.expect("joins"), RoomState::Ready(info(7)));
        // Later pollers see it at once.
        assert_eq!(rooms.wait(7, Duration::ZERO).await, RoomState::Ready(info(7)));
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_rooms_time_out_and_failures_are_reported() {
        let rooms = Rooms::default();
        let start = Instant::now();
        assert_eq!(rooms.wait(1, Duration::from_secs(2)).await, RoomState::Pending);
        assert!(start.elapsed() >= Duration::from_secs(2));
        rooms.set(2, RoomState::Failed("boom".into()));
        assert_eq!(rooms.wait(2, Duration::from_secs(2)).await, RoomState::Failed("boom".into()));
    }

    #[tokio::test]
    async fn a_guard_fails_its_room_unless_ready() {
        let rooms = Arc::new(Rooms::default());
        let mut guard = RoomGuard::new(Arc::clone(&rooms), 1);
        guard.describe(10, "ab".into());
        guard.ready(4);
        drop(guard);
        assert_eq!(rooms.wait(1, Duration::ZERO).await, RoomState::Ready(info(1)));
        drop(RoomGuard::new(Arc::clone(&rooms), 2));
        assert_eq!(
            rooms.wait(2, Duration::ZERO).await,
            RoomState::Failed("prefill did not complete".into())
        );
    }

    #[test]
    fn rooms_are_bounded() {
        let rooms = Rooms::default();
        for room in 0..(MAX_ROOMS as u64 + 10) {
            rooms.set(room, RoomState::Pending);
        }
        let inner = rooms.inner.lock();
        assert_eq!(inner.rooms.len(), MAX_ROOMS);
        assert!(!inner.rooms.contains_key(&0));
        assert!(inner.rooms.contains_key(&(MAX_ROOMS as u64 + 9)));
    }
}
