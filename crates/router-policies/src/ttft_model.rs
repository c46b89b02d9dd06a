//! The time-to-first-token cost model: (prefill work queued on an engine + this request's
//! uncached tokens there) / that engine's prefill rate. One model, read by the
//! `predicted_ttft` policy to rank its candidates and by the live SLO estimates of buckets
//! ([`crate::LiveEstimator`]) to say how soon a bucket's best engine would answer.

use std::sync::Arc;

use router_state_load::EngineLoad;
use router_workers::Worker;

use crate::cache::Prefixes;
use crate::pressure::Basis;
use crate::{CacheSource, LoadHandles, PickError, PickRequest};

/// One candidate's prediction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Estimate {
    /// Prefill tokens waiting there before this request.
    pub(crate) queued: u64,
    /// This request's tokens not cached there.
    pub(crate) uncached: u64,
    /// Requests of this router there waiting for the engine's next prefill pass (sent after
    /// its running pass began, no first token yet): the ones this request's prefill delays,
    /// by sharing that pass.
    pub(crate) waiting: u64,
    /// The rate used, in tokens per second.
    pub(crate) rate: f64,
    /// The rate is the candidate's own (reported, or learned), not assumed from the others.
    pub(crate) rated: bool,
    /// `(queued + uncached) / rate`, in milliseconds.
    pub(crate) ms: f64,
}

/// The predictions of one request on a set of candidates, in their order, with the prefix
/// lookups and load observations they were made from (for the pick and its admission).
pub(crate) struct Predictions {
    /// Whether queued work came from the engines' reports or from router-local accounting.
    pub(crate) basis: Basis,
    /// Each candidate's usable load report, if it has one.
    pub(crate) loads: Vec<Option<EngineLoad>>,
    /// Each candidate's prediction.
    pub(crate) estimates: Vec<Estimate>,
    /// What the prefix lookups found (nothing without a source).
    pub(crate) prefixes: Prefixes,
}

/// The cost model over the application's load state.
#[derive(Clone, Debug)]
pub(crate) struct TtftModel {
    pub(crate) load: LoadHandles,
    /// The prefill rate assumed for an engine before its reports (or, when learning, its
    /// observed first tokens) give one.
    pub(crate) default_prefill_tokens_per_sec: f64,
    /// Whether rates learned from observed first tokens count ([`PrefillRates`]).
    ///
    /// [`PrefillRates`]: router_state_load::PrefillRates
    pub(crate) learn_rates: bool,
}

impl TtftModel {
    /// Predicts `request` on every one of `engines`.
    ///
    /// - **queued** is the engine-reported waiting uncached tokens plus the work this router
    ///   dispatched there since the report's capture time and not yet prefilled (the
    ///   recent-dispatch correction: `Inflight::dispatched_tokens_since`, at most
    ///   `Inflight::inflight_tokens`, since work that finished is queued nowhere), and at
    ///   least this router's own prefill work still to do there (`Inflight::prefill_queue`):
    ///   a report's waiting tokens leave out the prefill pass the engine is running, which
    ///   this router's requests without a first token still cover, less the work the engine
    ///   can have done of that pass at `rate` since it began. A fresh basic report (vLLM's
    ///   metrics: no waiting tokens) contributes the recent-dispatch correction alone. When
    ///   any candidate lacks a fresh, complete report, every candidate is judged by that
    ///   router-local work alone, [`Basis::Local`];
    /// - **uncached** is the input minus the leading tokens the candidate holds, looked up in
    ///   `source` through the request's memo (every token without a source, token ids, a
    ///   block size or an answering backend);
    /// - **rate** is the candidate's prefill rate derived from its reports; else the one learned
    ///   from its observed first tokens (when learning); else the median of the other
    ///   candidates' ([`Self::unrated_rate`]), or the configured default while none has one
    ///   (a negative, NaN or zero estimate is ignored).
    ///
    /// Fails only when the source refuses the lookup as an invalid query.
    pub(crate) async fn predict(
        &self,
        source: Option<&Arc<CacheSource>>,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Predictions, PickError> {
        let prefixes = match source {
            Some(source) => Prefixes::look_up(source, engines, request, 1).await?,
            None => Prefixes::default(),
        };
        let snapshot = self.load.table.snapshot();
        let loads: Vec<Option<EngineLoad>> =
            engines.iter().map(|e| snapshot.get(e.id()).copied()).collect();
        let basis = if loads.iter().all(Option::is_some) { Basis::Reported } else { Basis::Local };
        let rates: Vec<Option<f64>> =
            engines.iter().zip(&loads).map(|(e, l)| self.known_rate(e, l.as_ref())).collect();
        let unrated = self.unrated_rate(&rates);
        let estimates = engines
            .iter()
            .zip(&loads)
            .map(|(engine, load)| {
                let matched = prefixes.matched(engine);
                let (input, load) = (request.input_tokens, load.as_ref());
                self.estimate(engine, load, basis, unrated, input, matched)
            })
            .collect();
        Ok(Predictions { basis, loads, estimates, prefixes })
    }

    /// The rate assumed for the candidates whose reports give no estimate yet (engines that
    /// have not prefilled since they came up): the median of the others' estimates, since the
    /// engines of one group are alike and a guess far from theirs ranks an idle engine as if
    /// it were another kind (measured on the Mooncake conversation trace at offered load 0.8:
    /// with the default at half the engines' real rate, four requests of the opening burst
    /// went to the one engine whose estimate was known); the configured default while no
    /// candidate has one. Nothing is sorted when every candidate has its own.
    fn unrated_rate(&self, known: &[Option<f64>]) -> f64 {
        let rated = || known.iter().flatten().copied();
        if rated().count() == known.len() {
            // Every candidate has its own: the value is never read.
            return self.default_prefill_tokens_per_sec;
        }
        let mut rates: Vec<f64> = rated().collect();
        rates.sort_by(f64::total_cmp);
        let middle = rates.len() / 2;
        match rates.len() {
            0 => self.default_prefill_tokens_per_sec,
            n if n % 2 == 1 => rates[middle],
            _ => (rates[middle - 1] + rates[middle]) / 2.0,
        }
    }

    /// The prediction for one candidate holding `matched` leading tokens of an `input`-token
    /// request, prefilling at its reported rate, or at `unrated` tokens per second while its
    /// reports give none.
    pub(crate) fn estimate(
        &self,
        engine: &Worker,
        load: Option<&EngineLoad>,
        basis: Basis,
        unrated: f64,
        input: u64,
        matched: u64,
    ) -> Estimate {
        let inflight = &self.load.inflight;
        let own = self.known_rate(engine, load);
        let rate = own.unwrap_or(unrated);
        let local = inflight.prefill_queue(engine.id(), rate);
        let queued = match (basis, load) {
            (Basis::Reported, Some(load)) => {
                // What the report cannot know yet, but only what is still here to do: work
                // that already finished is in neither the report nor the queue.
                let pending = inflight.inflight_tokens(engine.id());
                let since = inflight.dispatched_tokens_since(engine.id(), load.captured_at);
                let waiting = load.native.as_ref().map_or(0, |n| n.waiting_uncached_tokens);
                let reported = waiting.saturating_add(since.min(pending));
                // A report counts waiting requests only, not the prefill pass running now;
                // what this router sent and has not seen a first token of covers that pass.
                reported.max(local.tokens)
            }
            _ => local.tokens,
        };
        let uncached = input - matched.min(input);
        let ms = queued.saturating_add(uncached) as f64 / rate * 1000.0;
        Estimate { queued, uncached, waiting: local.waiting, rate, rated: own.is_some(), ms }
    }
}

impl TtftModel {
    /// The candidate's own rate: reported, else learned (when learning).
    fn known_rate(&self, engine: &Worker, load: Option<&EngineLoad>) -> Option<f64> {
        reported_rate(load)
            .or_else(|| self.learn_rates.then(|| self.load.rates.rate(engine.id())).flatten())
    }
}

/// The candidate's own prefill rate estimate from its reports, when it is a positive finite
/// number (a negative, NaN or zero estimate is ignored).
fn reported_rate(load: Option<&EngineLoad>) -> Option<f64> {
    let rate = load?.native.as_ref()?.prefill_tokens_per_sec?;
    (rate.is_finite() && rate > 0.0).then_some(rate)
}
