//! A started request's runs and their progress: the scheduler's messages of every run merged,
//! the prefill rooms marked ready at each first token, and the tokens released to the answer
//! (a run's tokens go out once `--stream-interval` of them are pending or its output is
//! complete). An answer is either awaited whole ([`Generation::finish`]) or streamed as SSE
//! through an endpoint's [`Framing`] ([`Generation::stream`]).

use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, BoxStream, SelectAll};
use futures::{FutureExt as _, StreamExt as _};
use http::{HeaderValue, StatusCode, header};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant};

use super::Finish;
use crate::engine::bootstrap::RoomGuard;
use crate::engine::http::Engine;
use crate::engine::http::error::ApiError;
use crate::engine::scheduler::Progress;

/// One run: one output for one prompt.
#[derive(Debug)]
pub(crate) struct Run {
    /// Index of its prompt in the request.
    pub(crate) prompt: usize,
    pub(crate) prompt_tokens: usize,
    /// The whole output, generated or not yet.
    pub(crate) output_ids: Vec<u32>,
    /// The text of each output token.
    pub(crate) pieces: Vec<String>,
    pub(crate) finish: Finish,
    /// Prompt tokens served from cache (known at the first token).
    pub(crate) cached_tokens: usize,
    /// Output tokens generated so far.
    pub(crate) generated: usize,
    /// When the last token came, measured from the request's start.
    pub(crate) latency: Option<Duration>,
    /// A prefill engine's bootstrap room, marked ready at the first token.
    room: Option<RoomGuard>,
}

impl Run {
    /// Every output token has been generated.
    pub(crate) fn complete(&self) -> bool {
        self.generated == self.output_ids.len()
    }

    /// The text of the output's first `tokens` tokens.
    pub(crate) fn text(&self, tokens: usize) -> String {
        self.pieces[..tokens].concat()
    }
}

/// Tokens `from..to` of run `run`, released together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Release {
    pub(crate) run: usize,
    pub(crate) from: usize,
    pub(crate) to: usize,
}

/// The engine stopped before the answer was complete.
#[derive(Debug, thiserror::Error)]
#[error("engine stopped mid-stream")]
pub(crate) struct Interrupted;

/// A started request: its runs, in run order, and their progress.
pub(crate) struct Generation {
    pub(crate) runs: Vec<Run>,
    started: Instant,
    interval: usize,
    /// Tokens of each run already released.
    released: Vec<usize>,
    messages: SelectAll<BoxStream<'static, (usize, Option<Progress>)>>,
    /// The engine stopped: reported once what came before is released.
    broken: bool,
}

/// A run's messages, tagged with the run, ending after `Done`; `None` when the channel closed
/// before (the engine stopped).
fn messages(
    run: usize,
    rx: mpsc::UnboundedReceiver<Progress>,
) -> BoxStream<'static, (usize, Option<Progress>)> {
    stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        let message = rx.recv().await;
        let rest = matches!(message, Some(Progress::First { .. } | Progress::Token)).then_some(rx);
        Some(((run, message), rest))
    })
    .boxed()
}

impl Run {
    pub(crate) fn new(
        prompt: usize,
        prompt_tokens: usize,
        output_ids: Vec<u32>,
        pieces: Vec<String>,
        finish: Finish,
        room: Option<RoomGuard>,
    ) -> Self {
        let (cached_tokens, generated, latency) = (0, 0, None);
        Self {
            prompt,
            prompt_tokens,
            output_ids,
            pieces,
            finish,
            cached_tokens,
            generated,
            latency,
            room,
        }
    }
}

impl Generation {
    pub(crate) fn new(started: Instant, interval: usize) -> Self {
        Self {
            runs: Vec::new(),
            started,
            interval: interval.max(1),
            released: Vec::new(),
            messages: SelectAll::new(),
            broken: false,
        }
    }

    /// Adds the next run, whose scheduler messages arrive on `rx`.
    pub(crate) fn add(&mut self, run: Run, rx: mpsc::UnboundedReceiver<Progress>) {
        self.messages.push(messages(self.runs.len(), rx));
        self.runs.push(run);
        self.released.push(0);
    }

    /// Every run is complete.
    pub(crate) fn complete(&self) -> bool {
        self.runs.iter().all(Run::complete)
    }

    fn apply(&mut self, (run, message): (usize, Option<Progress>)) -> Result<(), Interrupted> {
        let run = &mut self.runs[run];
        match message {
            Some(Progress::First { cached_tokens }) => {
                run.cached_tokens = cached_tokens;
                if let Some(room) = &mut run.room {
                    room.ready(cached_tokens);
                }
                run.generated = 1;
            }
            Some(Progress::Token) => run.generated = (run.generated + 1).min(run.output_ids.len()),
            Some(Progress::Done) => {}
            None if run.complete() => {}
            None => return Err(Interrupted),
        }
        if run.complete() && run.latency.is_none() {
            run.latency = Some(self.started.elapsed());
        }
        Ok(())
    }

    /// Waits for progress and returns the tokens it releases (in run order); `None` once every
    /// run is complete.
    pub(crate) async fn next(&mut self) -> Option<Result<Vec<Release>, Interrupted>> {
        loop {
            if self.complete() {
                return None;
            }
            if self.broken {
                return Some(Err(Interrupted));
            }
            let message = self.messages.next().await;
            self.broken = message.is_none_or(|message| self.apply(message).is_err());
            // Take what is already there too (several decode steps may end at once).
            while !self.broken
                && let Some(Some(message)) = self.messages.next().now_or_never()
            {
                self.broken = self.apply(message).is_err();
            }
            let releases = self.releases();
            if !releases.is_empty() {
                return Some(Ok(releases));
            }
        }
    }

    /// The runs with enough pending tokens (all that is pending once the engine stopped).
    fn releases(&mut self) -> Vec<Release> {
        let mut releases = Vec::new();
        for (index, run) in self.runs.iter().enumerate() {
            let from = self.released[index];
            let pending = run.generated - from;
            if pending > 0 && (pending >= self.interval || run.complete() || self.broken) {
                releases.push(Release { run: index, from, to: run.generated });
                self.released[index] = run.generated;
            }
        }
        releases
    }

    /// Awaits every run's whole output. The answer counts for `--die-after`; an engine that
    /// stops first is a 503.
    pub(crate) async fn finish(mut self, engine: &Engine) -> Result<Self, ApiError> {
        let outcome = loop {
            match self.next().await {
                None => break Ok(()),
                Some(Ok(_)) => {}
                Some(Err(error)) => break Err(error),
            }
        };
        engine.faults.answered();
        outcome
            .map(|()| self)
            .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "engine stopped"))
    }

    /// The answer as an SSE stream written by `framing`; it counts for `--die-after` once
    /// complete, and breaks off if the engine stops first.
    pub(crate) fn stream(self, engine: Arc<Engine>, framing: impl Framing) -> Response {
        let state = Streaming { generation: self, framing, engine, finished: false };
        let body = Body::from_stream(stream::unfold(state, Streaming::next_frame));
        let mut response = (StatusCode::OK, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    }
}

/// How an endpoint writes its SSE stream.
pub(crate) trait Framing: Send + 'static {
    /// Appends the events of released tokens.
    fn release(&mut self, runs: &[Run], release: Release, out: &mut Vec<u8>);
    /// Appends the events that close the stream once every run is complete.
    fn end(&mut self, runs: &[Run], out: &mut Vec<u8>);
}

/// Appends `data: <value>\n\n`.
pub(crate) fn push_event(out: &mut Vec<u8>, value: &Value) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(value.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

struct Streaming<F> {
    generation: Generation,
    framing: F,
    engine: Arc<Engine>,
    finished: bool,
}

impl<F: Framing> Streaming<F> {
    /// The events of one wake-up: what it released, and the end of the stream once complete.
    async fn next_frame(mut self) -> Option<(Result<Bytes, Interrupted>, Self)> {
        if self.finished {
            return None;
        }
        let mut out = Vec::new();
        match self.generation.next().await {
            Some(Ok(releases)) => {
                for release in releases {
                    self.framing.release(&self.generation.runs, release, &mut out);
                }
            }
            Some(Err(error)) => {
                self.finished = true;
                return Some((Err(error), self));
            }
            None => {}
        }
        if self.generation.complete() {
            self.framing.end(&self.generation.runs, &mut out);
            self.finished = true;
            self.engine.faults.answered();
        }
        Some((Ok(Bytes::from(out)), self))
    }
}

#[cfg(test)]
mod tests;
