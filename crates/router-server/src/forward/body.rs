//! Streamed answers: the engine's SSE body passed through as it arrives, holding the
//! dispatch's in-flight guards until it ends, with the engine's silence bounded.
//!
//! Data frames that have already arrived are written as one: a burst of events costs one
//! write, as in a proxy that moves whatever its socket holds. An HTTP/1.1 engine's body reads
//! its socket as it is polled and hands over all that arrived as one frame, so its `Pending`
//! means nothing more is there and the frame goes out at once, uncopied. hyper's HTTP/2
//! connection task hands over one decoded frame at a time: after taking what is there the
//! stream lets that task run again (a turn of the event loop, no system call) and sends the
//! batch once a turn brings nothing new ([`GuardedBody::handed_over_by_a_task`]). It never
//! waits for the engine.
//!
//! A mid-stream failure, an engine silent for longer than its idle limit, or a failed prefill
//! partner ends the stream with an SSE error event and is reported to the circuit breaker.
//! Dropping the body (the client went away) releases the guards and drops the upstream
//! response, which closes the engine connection and so cancels the request there.
//!
//! The first data frame carries the first token, so the engine's prefill is done: the guards'
//! prefill work stops counting in flight then ([`InflightGuard::prefilled`]), while the
//! requests count until the stream ends.
//!
//! A stream that ends normally reports its timing and the engine's token counts
//! ([`AnswerMetrics`]): each data frame only notes the time it arrived (already taken for the
//! idle bound) and keeps a reference to itself as the stream's tail; the tail is read for the
//! final usage chunk once, at the end. The bytes pass unchanged.

use std::convert::Infallible;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, header};
use http_body::{Body, Frame, SizeHint};
use router_state_load::InflightGuard;
use router_workers::Worker;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::{Outcome, OutcomeSink};
use crate::error::{ApiError, BoxError, Chain, EngineError};
use crate::metrics;

/// Most bytes of already-arrived data frames merged into one write.
const COALESCE_LIMIT: usize = 64 * 1024;

/// Most times one batch yields to the event loop for more frames.
const COALESCE_ROUNDS: u8 = 32;

/// Polls without a new frame after which a batch goes out, for a body that a connection task
/// of its own feeds. hyper polls a pending response body twice in one turn of the client
/// connection's task (once more after flushing), so the second empty poll is the first that
/// comes after the engine connection's task had its turn.
const QUIET_POLLS: u8 = 2;

/// Most bytes of one unfinished SSE event held back ([`GuardedBody::sse_events`]); a longer
/// event passes on as it comes.
const MAX_HELD_EVENT: usize = 8 << 20;

/// An engine's streamed (SSE) response body on its way to the client.
pub(crate) struct GuardedBody<B: Body = router_engine_client::EngineBody> {
    inner: B,
    guards: Vec<InflightGuard>,
    worker: Arc<Worker>,
    sink: Arc<dyn OutcomeSink>,
    idle: Idle,
    /// A prefill partner's failure, which ends this (decode) stream.
    partner_failure: Option<oneshot::Receiver<ApiError>>,
    /// A frame or error polled while coalescing, delivered on the next poll.
    stashed: Option<Result<Frame<Bytes>, B::Error>>,
    /// The engine's body ended while coalescing.
    ended: bool,
    /// Data frames taken but not yet passed on, and when the first of them arrived.
    batch: Option<(Batch, Instant)>,
    /// Times the batch has yielded for more, and polls in a row that brought nothing.
    rounds: u8,
    quiet: u8,
    /// Empty polls after the one that found the batch complete before it goes out: none when
    /// the body's `Pending` means nothing more has arrived, [`QUIET_POLLS`] when a task hands
    /// its frames over.
    quiet_polls: u8,
    finished: bool,
    /// The first data frame came, so the guards' prefill work was released
    /// ([`InflightGuard::prefilled`]).
    prefilled: bool,
    /// What the end of the stream reports to the metrics.
    timing: Option<StreamTiming>,
    /// Only whole SSE events are passed on ([`GuardedBody::sse_events`]).
    sse: bool,
    /// The start of an event whose end has not arrived yet.
    held: BytesMut,
    /// Resolves when the router's drain runs out ([`GuardedBody::until_drain_ends`]).
    drain_ended: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
}

impl<B: Body> GuardedBody<B> {
    /// Wraps an engine's streamed body. `idle_limit` bounds the silence between two frames.
    pub(crate) fn new(
        inner: B,
        guards: Vec<InflightGuard>,
        worker: Arc<Worker>,
        sink: Arc<dyn OutcomeSink>,
        idle_limit: Duration,
        partner_failure: Option<oneshot::Receiver<ApiError>>,
        metrics: Option<AnswerMetrics>,
    ) -> Self {
        let timing = metrics.map(|labels| StreamTiming {
            labels,
            first: None,
            last: None,
            tail: [Bytes::new(), Bytes::new()],
        });
        Self {
            inner,
            guards,
            worker,
            sink,
            idle: Idle::new(idle_limit),
            partner_failure,
            stashed: None,
            ended: false,
            batch: None,
            rounds: 0,
            quiet: 0,
            quiet_polls: 0,
            finished: false,
            prefilled: false,
            timing,
            sse: false,
            held: BytesMut::new(),
            drain_ended: None,
        }
    }

    /// Ends the stream with an error event (`router_shutdown`) when `drain_ended` is
    /// cancelled: a stream longer than the shutdown drain tells its client why it ends.
    pub(crate) fn until_drain_ends(mut self, drain_ended: CancellationToken) -> Self {
        self.drain_ended = Some(Box::pin(drain_ended.cancelled_owned()));
        self
    }

    /// Ends the stream with a timeout unless its first frame comes by `deadline` (the idle
    /// limit bounds each silence after that).
    pub(crate) fn first_frame_by(mut self, deadline: std::time::Instant) -> Self {
        self.idle.first_by = Some(Instant::from_std(deadline));
        self
    }

    /// Passes on only whole SSE events: an event the engine split over several writes waits
    /// for its end (up to [`MAX_HELD_EVENT`] bytes), so that a failure mid-event ends the stream
    /// with an error event of its own instead of one glued to half an event, which no client
    /// could parse. Engines write whole events, so nothing waits in practice.
    pub(crate) fn sse_events(mut self) -> Self {
        self.sse = true;
        self
    }

    /// The whole events of `data` and what was held before it; `None` while no event is
    /// complete.
    fn whole_events(&mut self, data: Bytes) -> Option<Bytes> {
        if self.held.is_empty() && ends_an_event(&data) {
            return Some(data);
        }
        self.held.extend_from_slice(&data);
        if self.held.len() > MAX_HELD_EVENT {
            return Some(self.held.split().freeze());
        }
        let end = events_end(&self.held)?;
        Some(self.held.split_to(end).freeze())
    }

    /// The engine's frames are handed over by a connection task of its own, one at a time:
    /// an empty poll may only mean that task has not run yet, so a batch waits for a turn of
    /// the event loop that brings nothing.
    pub(crate) fn handed_over_by_a_task(mut self) -> Self {
        self.quiet_polls = QUIET_POLLS;
        self
    }

    fn finish(&mut self, outcome: Outcome) {
        if !self.finished {
            self.finished = true;
            self.sink.record(&self.worker, outcome);
            self.guards.clear();
            self.partner_failure = None;
        }
    }

    /// Ends the stream with `error` as an SSE error event, the engine's outcome recorded (and
    /// its own failure counted).
    fn fail(
        &mut self,
        outcome: Outcome,
        error: &ApiError,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        tracing::warn!(error = %Chain(error), "stream ended with an error event");
        if let ApiError::Engine(failure) = error {
            metrics::engine_failure(failure.worker().as_str(), failure.kind());
        }
        // The unfinished event is dropped: the error event stands alone.
        self.held.clear();
        self.finish(outcome);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(format!("data: {}\n\n", error.body()))))))
    }
}

impl<B> GuardedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError> + Unpin,
{
    /// Passes one polled result on, finishing the dispatch at the end or on an error.
    fn deliver(
        &mut self,
        polled: Poll<Option<Result<Frame<Bytes>, B::Error>>>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match polled {
            Poll::Pending => Poll::Pending,
            // The engine ended without closing its last event: what it sent goes on as sent.
            Poll::Ready(None) if !self.held.is_empty() => {
                Poll::Ready(Some(Ok(Frame::data(self.held.split().freeze()))))
            }
            Poll::Ready(None) => {
                if !self.finished
                    && let Some(timing) = self.timing.take()
                {
                    timing.report(&self.worker);
                }
                self.finish(Outcome::Success);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(source))) => {
                let worker = self.worker.id().clone();
                let source = source.into();
                let error = ApiError::Engine(EngineError::MidResponse { worker, source });
                self.fail(Outcome::Failure, &error)
            }
        }
    }
}

impl<B> Body for GuardedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError> + Unpin,
{
    type Data = Bytes;
    /// Every failure becomes an error event: the stream itself never fails.
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.finished {
            return Poll::Ready(None);
        }
        if let Some(drain_ended) = &mut this.drain_ended
            && drain_ended.as_mut().poll(cx).is_ready()
        {
            this.drain_ended = None;
            // The engine did nothing wrong: the router is going away.
            return this.fail(Outcome::Success, &ApiError::DrainEnded);
        }
        if let Some(partner) = &mut this.partner_failure
            && let Poll::Ready(result) = Pin::new(partner).poll(cx)
        {
            this.partner_failure = None;
            if let Ok(error) = result {
                // The decode engine did nothing wrong.
                return this.fail(Outcome::Success, &error);
            }
        }
        if this.batch.is_none() {
            if let Some(stashed) = this.stashed.take() {
                return this.deliver(Poll::Ready(Some(stashed)));
            }
            if this.ended {
                return this.deliver(Poll::Ready(None));
            }
        }
        // Take every data frame that is already here; see the module documentation.
        let mut received = false;
        while this.stashed.is_none() && !this.ended {
            if this.batch.as_ref().is_some_and(|(batch, _)| batch.len() >= COALESCE_LIMIT) {
                break;
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.idle.progressed();
                        received = true;
                        if !this.prefilled {
                            // The first token is here: the engine's prefill work is done.
                            this.prefilled = true;
                            this.guards.iter_mut().for_each(InflightGuard::prefilled);
                        }
                        match &mut this.batch {
                            Some((batch, _)) => batch.push(&data),
                            None => this.batch = Some((Batch::One(data), this.idle.last_progress)),
                        }
                    }
                    Err(trailers) => this.stashed = Some(Ok(trailers)),
                },
                Poll::Ready(Some(Err(err))) => this.stashed = Some(Err(err)),
                Poll::Ready(None) => this.ended = true,
                Poll::Pending if this.batch.is_some() => {
                    this.quiet = if received { 0 } else { this.quiet + 1 };
                    if this.quiet < this.quiet_polls && this.rounds < COALESCE_ROUNDS {
                        this.rounds += 1;
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    break;
                }
                Poll::Pending => {
                    if this.idle.poll_expired(cx).is_ready() {
                        let worker = this.worker.id().clone();
                        let silence = this.idle.silence().max(Duration::from_secs(1));
                        let error = ApiError::Engine(EngineError::Stalled { worker, silence });
                        return this.fail(Outcome::Failure, &error);
                    }
                    return Poll::Pending;
                }
            }
        }
        let Some((batch, first_arrived)) = this.batch.take() else {
            // Nothing was taken: the end, a failure or trailers came first.
            let stashed = this.stashed.take();
            return this.deliver(Poll::Ready(stashed));
        };
        this.rounds = 0;
        this.quiet = 0;
        let mut data = batch.into_bytes();
        if this.sse {
            match this.whole_events(data) {
                Some(whole) => data = whole,
                None => {
                    // Half an event: poll again for the rest.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
        }
        if let Some(timing) = &mut this.timing {
            timing.passed(&data, first_arrived, this.idle.last_progress, &this.worker);
        }
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.finished
    }

    /// A stream may gain an error event, so its length is never promised.
    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The data frames of one write: a lone frame as it came, several copied into one buffer.
enum Batch {
    One(Bytes),
    Joined(BytesMut),
}

impl Batch {
    fn len(&self) -> usize {
        match self {
            Batch::One(data) => data.len(),
            Batch::Joined(data) => data.len(),
        }
    }

    fn push(&mut self, more: &[u8]) {
        match self {
            Batch::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + more.len());
                joined.extend_from_slice(first);
                joined.extend_from_slice(more);
                *self = Batch::Joined(joined);
            }
            Batch::Joined(joined) => joined.extend_from_slice(more),
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Batch::One(data) => data,
            Batch::Joined(data) => data.freeze(),
        }
    }
}

impl<B: Body> Drop for GuardedBody<B> {
    fn drop(&mut self) {
        // The client went away before the end: not the engine's fault.
        self.finish(Outcome::Success);
    }
}

/// The engine's silence, measured lazily: each frame only notes the time, and one timer,
/// pushed back when it fires early, wakes the stream when the limit has really passed.
struct Idle {
    limit: Duration,
    last_progress: Instant,
    timer: Option<Pin<Box<Sleep>>>,
    /// Until the first frame: when it must have come at the latest.
    first_by: Option<Instant>,
}

impl Idle {
    fn new(limit: Duration) -> Self {
        Self { limit, last_progress: Instant::now(), timer: None, first_by: None }
    }

    fn progressed(&mut self) {
        self.last_progress = Instant::now();
        self.first_by = None;
    }

    /// How long the engine has been silent: since the last frame, or since the head.
    fn silence(&self) -> Duration {
        self.last_progress.elapsed()
    }

    /// Ready once the engine has been silent for the whole limit, or sent no first frame by
    /// its deadline; else registers a wake-up.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let idle = self.last_progress + self.limit;
        let deadline = self.first_by.map_or(idle, |first| first.min(idle));
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if timer.deadline() >= deadline {
                return Poll::Ready(());
            }
            timer.as_mut().reset(deadline);
        }
    }
}

/// The engine's response headers that make sense end to end (content type, caching), never
/// hop-by-hop ones. The engine's own map is kept when it holds nothing else, as the HTTP/1.1
/// client's answer heads do (router-http1's `answer::KEPT_FIELDS`, the fields read or passed
/// on): an answer then costs no second map.
pub(crate) fn passthrough_headers(from: HeaderMap) -> HeaderMap {
    const PASSED: [HeaderName; 2] = [header::CONTENT_TYPE, header::CACHE_CONTROL];
    if from.keys().all(|name| PASSED.contains(name)) {
        return from;
    }
    let mut to = HeaderMap::with_capacity(PASSED.len());
    for name in PASSED {
        if let Some(value) = from.get(&name) {
            to.insert(name, value.clone());
        }
    }
    to
}

mod timing;

pub(crate) use timing::{AnswerMetrics, TtftPrediction};
use timing::{StreamTiming, ends_an_event, events_end};

#[cfg(test)]
mod tests;
