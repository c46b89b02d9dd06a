//! What an answer's body measures on its way: the labels and clocks of its metrics, a stream's
//! first and last data and its tail (where the engine's token counts are), the predicted time
//! to first token compared with the observed one, and where a stream's SSE events end.

use std::sync::Arc;

use bytes::Bytes;
use router_state_load::PrefillRates;
use router_workers::{ModelId, Worker};
use tokio::time::Instant;

use crate::metrics;

/// What an answer's metrics are labelled with and measured from.
#[derive(Clone, Debug)]
pub(crate) struct AnswerMetrics {
    /// The served model.
    pub model: ModelId,
    /// When the router received the request.
    pub started: std::time::Instant,
    /// When this answer's request went to the engine: its deadlines and its time to first
    /// token count from here.
    pub dispatched: std::time::Instant,
    /// The policy's predicted time to first token, for a stream to report beside the one it
    /// observes.
    pub prediction: Option<TtftPrediction>,
}

/// A pick's predicted time to first token and the prefill work it predicted before that
/// token. The first token is observed as a stream's first byte
/// goes to the client, or as a whole answer of at most one generated token ends: then the
/// prediction and the observation go to the metrics (`metrics::ttft_prediction`) and the
/// work and the time to the engine's learned prefill rate.
#[derive(Clone, Debug)]
pub(crate) struct TtftPrediction {
    pub predicted_ms: f64,
    pub work_tokens: Option<u64>,
    pub rates: Arc<PrefillRates>,
}

impl TtftPrediction {
    /// The first token of `worker`'s answer, dispatched at `dispatched`, came now.
    fn observed(self, model: &str, worker: &Worker, dispatched: std::time::Instant) {
        let observed = dispatched.elapsed();
        metrics::ttft_prediction(model, worker.id().as_str(), self.predicted_ms, observed);
        if let Some(work) = self.work_tokens {
            self.rates.observe(worker.id(), work, observed);
        }
    }
}

impl AnswerMetrics {
    /// Records a whole answer of `worker` (its token counts read from `answer`), complete now.
    pub(crate) fn whole(&self, worker: &Worker, answer: &[u8]) {
        let e2e = self.started.elapsed();
        let usage = router_prepare::usage::of_answer(answer);
        // One generated token: the answer's end is its first token.
        if let Some(prediction) = &self.prediction
            && usage.is_some_and(|usage| usage.completion <= 1)
        {
            prediction.clone().observed(self.model.as_str(), worker, self.dispatched);
        }
        metrics::answer(self.model.as_str(), worker.id().as_str(), None, None, e2e, usage);
    }
}

/// Whether `data` ends with the blank line that ends an SSE event.
pub(super) fn ends_an_event(data: &[u8]) -> bool {
    data.ends_with(b"\n\n") || data.ends_with(b"\r\n\r\n") || data.ends_with(b"\r\r")
}

/// The length of `data` up to the end of its last whole SSE event (its blank line included),
/// `None` when it holds none.
pub(super) fn events_end(data: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::rfind(data, b"\n\n").map(|at| at + 2);
    let crlf = memchr::memmem::rfind(data, b"\n\r\n").map(|at| at + 3);
    let cr = memchr::memmem::rfind(data, b"\r\r").map(|at| at + 2);
    lf.max(crlf).max(cr)
}

/// A stream's timing so far: the first and the last data frame, and the last two frames.
pub(super) struct StreamTiming {
    pub(super) labels: AnswerMetrics,
    pub(super) first: Option<Instant>,
    pub(super) last: Option<Instant>,
    pub(super) tail: [Bytes; 2],
}

impl StreamTiming {
    /// Data passed on, its first frame having arrived `first` and its last `last`. The first
    /// data passed is the client's first byte, which a prediction is compared with.
    pub(super) fn passed(&mut self, data: &Bytes, first: Instant, last: Instant, worker: &Worker) {
        if self.first.is_none()
            && let Some(prediction) = self.labels.prediction.take()
        {
            prediction.observed(self.labels.model.as_str(), worker, self.labels.dispatched);
        }
        self.first.get_or_insert(first);
        self.last = Some(last);
        self.tail.swap(0, 1);
        self.tail[1] = data.clone();
    }

    /// The stream ended normally: its timing and counts go to the metrics.
    pub(super) fn report(&self, worker: &Worker) {
        let started = Instant::from_std(self.labels.started);
        let e2e = self.labels.started.elapsed();
        let ttft = self.first.map(|first| first.saturating_duration_since(started));
        let usage = router_prepare::usage::of_stream_tail(&[&self.tail[0], &self.tail[1]]);
        let itl = match (self.first, self.last, usage) {
            (Some(first), Some(last), Some(usage)) if usage.completion > 1 => {
                let gaps = u32::try_from(usage.completion - 1).unwrap_or(u32::MAX);
                Some(last.saturating_duration_since(first) / gaps)
            }
            _ => None,
        };
        metrics::answer(self.labels.model.as_str(), worker.id().as_str(), ttft, itl, e2e, usage);
    }
}
