//! Predicted-TTFT (`predicted_ttft`): the candidate with the lowest predicted time to first
//! token, from the prefill work queued there, this request's uncached tokens there and that
//! engine's prefill rate.

use std::sync::Arc;

use futures::future::BoxFuture;
use rand::seq::SliceRandom;
use router_state_load::EngineLoad;
use router_workers::{Stage, Worker};

use crate::admission::{Rejection, rejection};
use crate::cache::Prefixes;
use crate::config::PredictedTtftSettings;
use crate::pressure::Basis;
use crate::sampler::Sampler;
use crate::ttft_model::{Estimate, Predictions, TtftModel};
use crate::{
    AdmissionCheck, CacheSource, ConfigError, EngineAdmission, LoadHandles, Pick, PickError,
    PickReason, PickRequest, Policy,
};

/// Predicted-TTFT selection, for plain and prefill groups: one cost model decided per request
/// over every candidate, with no fleet-wide switch between "affinity" and "balance" modes.
///
/// For each candidate, predicted TTFT = (queued + uncached) / rate (the cost model of
/// `ttft_model.rs`, which the live SLO estimates of buckets, [`crate::LiveEstimator`], share),
/// where
/// - **queued** is the prefill work waiting there: the engine-reported waiting uncached tokens
///   plus the work this router dispatched to it since the report's capture time (the
///   recent-dispatch correction of docs/design/POLICY_DESIGN.md §5, in tokens:
///   `Inflight::dispatched_tokens_since`), and at least the work of this router's requests
///   there without a first token yet, which covers the prefill pass a report leaves out,
///   less what the engine can have prefilled of that pass since it began
///   (`Inflight::prefill_queue`). When any candidate lacks a fresh, complete native report,
///   every candidate is compared by that router-local work instead, reason
///   [`PickReason::PredictedTtftLocal`];
/// - **uncached** is this request's input minus the leading tokens the candidate holds, from
///   the prefix source (KV index and predicted entries); every token without a block size
///   (KV events, or `block_size` for a remote indexer), token ids or an answering source;
/// - **rate** is the candidate's prefill rate derived from its reports; before its first
///   estimate, the median of the other candidates' estimates, or
///   `default_prefill_tokens_per_sec` while none has one (a negative, NaN or zero estimate is
///   ignored).
///
/// Candidates are ranked by that prediction plus `recompute_weight x uncached / rate`: the
/// tokens a candidate must recompute delay every request that queues behind this one there,
/// so under load they cost the fleet more than this request's own wait (measured on the
/// Mooncake conversation trace at offered load 0.7: the default weight 6 keeps 0.95 of the
/// fleet-LRU oracle's hit rate where weight 1 keeps 0.83, at about the same mean and p99 TTFT;
/// 0 ranks by predicted TTFT alone), plus `waiting_weight x waiting x uncached / rate`: an
/// engine prefills what waits there in one pass, so a prompt recomputed where `waiting`
/// requests of this router wait for the next pass delays each of them too (those in the
/// running pass it does not delay). That term trades the tail for the mean: a long prompt
/// kept off a short queue where others wait saves their delay but waits longer itself
/// (measured on both Mooncake traces with 64k caches: weight 1 lowered mean TTFT at offered
/// load 0.8 from 94 to 81 ms on the conversation trace against weight 0; in 6 alternated
/// runs each against weight 1, the default 0.25 keeps the mean within 1 ms there, lowers p99
/// from 345 to 325 ms at 0.8 and from 398 to 370 ms at 0.9, and at 0.9 on the synthetic
/// trace keeps 0.94 of the fleet-LRU oracle's hit rate where weight 1 keeps 0.905).
/// A cache-rich engine whose queue makes it slower than recomputing elsewhere (by more than
/// that) loses, which spreads a hot prefix to a second engine by itself; the dispatch
/// correction makes each request of a burst see the ones before it.
///
/// **Near ties** (ranking above the best by at most `near_tie_ratio` of the best's predicted
/// TTFT plus `near_tie_ms`) go to the one with the least uncached work (the holder of the
/// prefix, so that a burst of siblings is not scattered while they are all as fast there), and
/// are otherwise broken by sampling, so that equal engines share a burst instead of the lowest
/// id taking all of it. The margin bounds how much slower a holder may be predicted than the
/// best and still win. Then admission is checked in that order (ties in their sampled order,
/// the rest by predicted time, then id); when every candidate is rejected the result is
/// [`PickError::NoAdmissibleEngine`] with every rejection in the order met.
#[derive(Debug)]
pub struct PredictedTtftPolicy {
    source: Arc<CacheSource>,
    model: TtftModel,
    settings: PredictedTtftSettings,
    admission: Option<Arc<dyn EngineAdmission>>,
    sampler: Sampler,
}

impl PredictedTtftPolicy {
    /// Predicted-TTFT reading prefixes from `source` and load from `load`, admitting every
    /// engine. Fails when `settings` do not validate.
    pub fn new(
        source: Arc<CacheSource>,
        load: LoadHandles,
        settings: PredictedTtftSettings,
    ) -> Result<Self, ConfigError> {
        settings.validate()?;
        let model = TtftModel {
            load,
            default_prefill_tokens_per_sec: settings.default_prefill_tokens_per_sec,
            learn_rates: settings.learn_rates,
        };
        let sampler = Sampler::for_tie_break(settings.tie_break);
        Ok(Self { source, model, settings, admission: None, sampler })
    }

    /// Checks candidates with `admission`, fastest first.
    pub fn with_admission(mut self, admission: AdmissionCheck) -> Self {
        self.admission = Some(Arc::clone(admission.admission()));
        self
    }

    /// Breaks near ties with a generator seeded with `seed`, for reproducible runs.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.sampler = Sampler::seeded(seed);
        self
    }

    /// The tuning.
    pub fn settings(&self) -> &PredictedTtftSettings {
        &self.settings
    }

    async fn select(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        if request.stage == Stage::Decode {
            return Err(PickError::UnsupportedStage {
                policy: "predicted_ttft",
                stage: request.stage,
            });
        }
        if engines.is_empty() {
            return Err(PickError::NoCandidates { stage: request.stage });
        }
        let Predictions { basis, loads, estimates, prefixes } =
            self.model.predict(Some(&self.source), engines, request).await?;
        let costs: Vec<f64> = estimates.iter().map(|e| self.cost(e)).collect();
        let order = self.order(engines, request, &estimates, &costs);
        trace_candidates(engines, request, &order, &prefixes, &estimates, &costs);
        let reason = match basis {
            Basis::Reported => PickReason::PredictedTtft,
            Basis::Local => PickReason::PredictedTtftLocal,
        };
        let mut rejections: Vec<Rejection> = Vec::new();
        for index in order {
            let engine = &engines[index];
            if let Some(rejection) = self.check(engine, loads[index].as_ref()) {
                rejections.push(rejection);
                continue;
            }
            let estimate = estimates[index];
            tracing::debug!(
                engine = %engine.id(),
                predicted_ms = estimate.ms,
                matched_tokens = prefixes.matched(engine),
                queued_tokens = estimate.queued,
                waiting = estimate.waiting,
                rate = estimate.rate,
                basis = ?basis,
                "predicted_ttft pick"
            );
            return Ok(Pick::new(Arc::clone(engine), reason)
                .with_uncached_tokens(estimate.uncached)
                .with_predicted_ttft_ms(estimate.ms)
                .with_predicted_work(estimate.queued.saturating_add(estimate.uncached))
                .with_cached_prefix(prefixes.held(engine)));
        }
        Err(PickError::NoAdmissibleEngine { rejections })
    }

    /// The prediction for one candidate alone (the shared cost model's, with no peers to take
    /// a rate from).
    #[cfg(test)]
    pub(crate) fn estimate(
        &self,
        engine: &Worker,
        load: Option<&EngineLoad>,
        basis: Basis,
        input: u64,
        matched: u64,
    ) -> Estimate {
        let unrated = self.settings.default_prefill_tokens_per_sec;
        self.model.estimate(engine, load, basis, unrated, input, matched)
    }

    /// What candidates are ranked by: the predicted ms plus `(recompute_weight +
    /// waiting_weight x waiting) x uncached / rate`.
    fn cost(&self, estimate: &Estimate) -> f64 {
        let s = &self.settings;
        let weight = s.recompute_weight + s.waiting_weight * estimate.waiting as f64;
        estimate.ms + weight * estimate.uncached as f64 / estimate.rate * 1000.0
    }

    /// Candidate indices in the order admission tries them: first the near ties of the best
    /// (fewest uncached tokens first, so a holder of the prefix keeps it while it is no slower
    /// than the margin; equal ones in a sampled order), then the rest by predicted time, then
    /// id.
    fn order(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
        estimates: &[Estimate],
        costs: &[f64],
    ) -> Vec<usize> {
        let mut order: Vec<usize> = (0..engines.len()).collect();
        order.sort_by(|&a, &b| {
            costs[a].total_cmp(&costs[b]).then_with(|| engines[a].id().cmp(engines[b].id()))
        });
        let Some(&best) = order.first() else { return order };
        let s = &self.settings;
        // The margin is a fraction of the best's predicted time, not of its ranking cost: the
        // recompute terms, alike on every engine without the prefix, would widen it with the
        // prompt until a long prompt's ties spanned queues a tenth of a second apart
        // (measured on the Mooncake conversation trace at offered load 0.8).
        let ceiling = costs[best] + estimates[best].ms * s.near_tie_ratio + s.near_tie_ms;
        let ties = order.partition_point(|&i| costs[i] <= ceiling);
        if ties > 1 {
            let near = &mut order[..ties];
            // Shuffled from (cost, id) order, so a request-seeded draw depends on the candidates
            // and their costs only, never on the slice order a replica holds.
            self.sampler.with_request(request, |rng| near.shuffle(rng));
            // Stable: an engine whose rate is not known yet first (its prediction borrowed the
            // others' rate; without a request now and then it would never have its own, and a
            // faster engine would never be found), then the least uncached work, then the
            // fewest requests in flight (a real engine decodes what it has prefilled on the same
            // cores, which slows its next prefill; `cargo xtask bench --only real`), then the
            // sampled order.
            let inflight = &self.model.load.inflight;
            near.sort_by_key(|&i| {
                let e = &estimates[i];
                (e.rated, e.uncached, inflight.count(engines[i].id()))
            });
        }
        order
    }

    /// Admission on one observation: `None` when admitted.
    fn check(&self, engine: &Worker, load: Option<&EngineLoad>) -> Option<Rejection> {
        let inflight = self.model.load.inflight.count(engine.id());
        rejection(self.admission.as_deref(), engine, load, inflight)
    }
}

impl Policy for PredictedTtftPolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(self.select(engines, request))
    }

    fn name(&self) -> &'static str {
        "predicted_ttft"
    }

    fn supports_stage(&self, stage: Stage) -> bool {
        stage != Stage::Decode
    }
}

/// At trace level, every candidate in the order admission tries them, as
/// `id:m<matched tokens>/q<queued tokens>/w<waiting requests>/c<cost>`: what an operator reads
/// to see why a request did not land where its prefix is.
fn trace_candidates(
    engines: &[Arc<Worker>],
    request: &PickRequest<'_>,
    order: &[usize],
    prefixes: &Prefixes,
    estimates: &[Estimate],
    costs: &[f64],
) {
    if !tracing::enabled!(tracing::Level::TRACE) {
        return;
    }
    let candidates: Vec<String> = order
        .iter()
        .map(|&i| {
            let (engine, estimate) = (&engines[i], &estimates[i]);
            format!(
                "{}:m{}/q{}/w{}/c{:.0}",
                engine.id(),
                prefixes.matched(engine),
                estimate.queued,
                estimate.waiting,
                costs[i]
            )
        })
        .collect();
    tracing::trace!(
        input_tokens = request.input_tokens,
        candidates = %candidates.join(" "),
        "predicted_ttft candidates"
    );
}

#[cfg(test)]
mod tests;
