//! Live SLO estimates of a bucket (docs/design/SLO.md, "Live estimates"): how soon its best
//! engine would give this request its first token, from the cost model `predicted_ttft` ranks
//! by, and how fast one request decodes on its fastest engine, from the engines' load reports.

use std::sync::Arc;

use router_workers::Worker;

use crate::ttft_model::TtftModel;
use crate::{
    CacheSource, ConfigError, LoadHandles, PickRequest, PolicyConfig, PolicyHandles,
    PolicySettings, PredictedTtftSettings,
};

/// The live estimates of one bucket's engines, over the application's shared load state (and
/// prefix source, when there is one to read).
///
/// - [`LiveEstimator::ttft_ms`]: the lowest predicted time to first token over the candidates
///   given, with the cost model of [`crate::PredictedTtftPolicy`] (queued prefill work with
///   the recent-dispatch correction, plus this request's uncached tokens, over the engine's
///   prefill rate), without its recompute weight: the prediction, not the ranking.
/// - [`LiveEstimator::decode_tokens_per_sec`]: the highest decode speed of one request over the
///   candidates given: each engine's reported generation throughput over its running requests
///   (`router_state_load::NativeLoad::request_decode_tokens_per_sec`).
///
/// An estimate that cannot be made is `None`, which meets no target.
#[derive(Debug)]
pub struct LiveEstimator {
    model: TtftModel,
    source: Option<Arc<CacheSource>>,
}

impl LiveEstimator {
    /// Estimates over `load`, looking cached prefixes up in `source` (`None`: every token is
    /// uncached), assuming for an engine whose reports give no prefill rate yet the median of
    /// the other candidates' rates, or `default_prefill_tokens_per_sec` while none has one.
    /// Fails on a rate that is not a finite number above 0.
    pub fn new(
        load: LoadHandles,
        source: Option<Arc<CacheSource>>,
        default_prefill_tokens_per_sec: f64,
    ) -> Result<Self, ConfigError> {
        let settings =
            PredictedTtftSettings { default_prefill_tokens_per_sec, ..Default::default() };
        settings.validate()?;
        let model = TtftModel { load, default_prefill_tokens_per_sec, learn_rates: true };
        Ok(Self { model, source })
    }

    /// The estimator of a bucket whose first group (plain, or prefill) runs `policy`: it sees
    /// what that group's policy sees. A `predicted_ttft` group lends its prefix source and
    /// `default_prefill_tokens_per_sec`; a `cache_aware` group its prefix source; any other
    /// group the local KV index when the router keeps one (else every token is uncached), with
    /// the default rate of `predicted_ttft`.
    pub fn for_group(policy: &PolicyConfig, handles: &PolicyHandles) -> Result<Self, ConfigError> {
        let defaults = PredictedTtftSettings::default();
        let (source, rate) = match &policy.kind {
            PolicySettings::PredictedTtft(settings) => {
                let source = policy.prefix_source(handles)?;
                (source, settings.default_prefill_tokens_per_sec)
            }
            PolicySettings::CacheAware(_) => {
                (policy.prefix_source(handles)?, defaults.default_prefill_tokens_per_sec)
            }
            _ => (handles.cache.local().cloned(), defaults.default_prefill_tokens_per_sec),
        };
        Self::new(handles.load.clone(), source, rate)
    }

    /// The predicted time to first token of `request` on the best of `engines`, in
    /// milliseconds; `None` without engines. A prefix source that refuses the lookup counts
    /// every token as uncached (the policy that picks later reports the refusal itself).
    pub async fn ttft_ms(&self, engines: &[Arc<Worker>], request: &PickRequest<'_>) -> Option<f64> {
        let predictions = match self.model.predict(self.source.as_ref(), engines, request).await {
            Ok(predictions) => predictions,
            Err(error) => {
                tracing::debug!(%error, "live TTFT estimate without cached prefixes");
                self.model.predict(None, engines, request).await.ok()?
            }
        };
        predictions.estimates.iter().map(|e| e.ms).min_by(f64::total_cmp)
    }

    /// The decode speed of one request on the fastest of `engines`, in output tokens per
    /// second; `None` when none has a fresh native report with a generation throughput.
    pub fn decode_tokens_per_sec(&self, engines: &[Arc<Worker>]) -> Option<f64> {
        let snapshot = self.model.load.table.snapshot();
        engines
            .iter()
            .filter_map(|engine| snapshot.get(engine.id()))
            .filter_map(|load| load.native.and_then(|n| n.request_decode_tokens_per_sec))
            .filter(|speed| speed.is_finite() && *speed > 0.0)
            .max_by(f64::total_cmp)
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use router_state_load::{RankSample, Report, ReportKind};
    use router_workers::Stage;

    use super::*;
    use crate::cache::tests::fixture::{World, eng, prompt, wid};
    use crate::{PredictedTtftPolicy, RequestTokens};

    /// One token per millisecond before any report gives a rate.
    const RATE: f64 = 1000.0;

    fn estimator(world: &World, source: bool) -> LiveEstimator {
        let source = source.then(|| Arc::clone(&world.source));
        LiveEstimator::new(world.load(), source, RATE).expect("valid rate")
    }

    fn ttft(
        estimator: &LiveEstimator,
        world: &World,
        engines: &[Arc<Worker>],
        input: usize,
    ) -> Option<f64> {
        let tokens = RequestTokens::new(prompt(input));
        let request = world.request(input as u64, Some(&tokens));
        estimator.ttft_ms(engines, &request).now_or_never().expect("local lookups are ready")
    }

    #[test]
    fn the_bucket_ttft_is_the_best_candidates_prediction_of_the_policys_own_model() {
        // a holds 60 blocks (960 tokens) behind 2000 queued; b holds nothing, 300 queued; c
        // has 100 queued and 100 more dispatched since its report.
        let world = World::new(
            Stage::Plain,
            &[eng("a", 60).uncached(2_000), eng("b", 0).uncached(300), eng("c", 0).uncached(100)],
        );
        let _since = world.inflight.acquire_work(&wid("c"), Stage::Plain, 100);
        let live = estimator(&world, true);
        let all = world.only(&["a", "b", "c"]);
        // a: 2000 + 64; b: 300 + 1024; c: 100 + 100 + 1024.
        assert_eq!(ttft(&live, &world, &all, 1_024), Some(1_224.0));
        assert_eq!(ttft(&live, &world, &world.only(&["a"]), 1_024), Some(2_064.0), "cache credit");
        assert_eq!(ttft(&live, &world, &[], 1_024), None, "no engine, no estimate");
        // Without a source every token is uncached.
        let blind = estimator(&world, false);
        assert_eq!(ttft(&blind, &world, &world.only(&["a"]), 1_024), Some(3_024.0));

        // The very prediction predicted_ttft reports for its pick (recompute and waiting
        // weights 0, so it picks the fastest).
        let settings = crate::PredictedTtftSettings {
            default_prefill_tokens_per_sec: RATE,
            recompute_weight: 0.0,
            waiting_weight: 0.0,
            near_tie_ratio: 0.0,
            near_tie_ms: 0.0,
            ..Default::default()
        };
        let policy = PredictedTtftPolicy::new(Arc::clone(&world.source), world.load(), settings)
            .expect("valid");
        let pick = world.pick_from(&policy, &all, 1_024).expect("pick");
        assert_eq!(pick.predicted_ttft_ms, ttft(&live, &world, &all, 1_024));
    }

    #[test]
    fn without_usable_reports_the_router_local_work_decides() {
        let world = World::new(Stage::Plain, &[eng("a", 0).missing(), eng("b", 0).uncached(50)]);
        let _a = world.inflight.acquire_work(&wid("a"), Stage::Plain, 700);
        let _b = world.inflight.acquire_work(&wid("b"), Stage::Plain, 200);
        let live = estimator(&world, false);
        // a has no report, so both are judged by their in-flight work: 700 and 200.
        assert_eq!(ttft(&live, &world, &world.only(&["a", "b"]), 100), Some(300.0));
    }

    #[test]
    fn the_decode_speed_is_the_fastest_reported_one() {
        let world = World::new(Stage::Decode, &[eng("a", 0), eng("b", 0), eng("c", 0).missing()]);
        let live = estimator(&world, false);
        let all = world.only(&["a", "b", "c"]);
        assert_eq!(live.decode_tokens_per_sec(&all), None, "no engine reports a throughput");
        let report = |id: &str, sequence, running, throughput| {
            let worker = world.only(&[id]).remove(0);
            let rank = RankSample::basic(0, running, 0, 0, 100_000)
                .with_native(0, 0, 64)
                .with_decode_rate(throughput);
            let report = Report::new(id, 1, sequence, ReportKind::Native, vec![rank]);
            world.table.apply(worker.id(), worker.incarnation(), report).expect("accepted");
        };
        report("a", 2, 4, 200.0);
        report("b", 2, 2, 60.0);
        assert_eq!(live.decode_tokens_per_sec(&all), Some(50.0), "a: 200 over 4 requests");
        assert_eq!(live.decode_tokens_per_sec(&world.only(&["b"])), Some(30.0));
        assert_eq!(live.decode_tokens_per_sec(&world.only(&["c"])), None, "no report");
    }

    #[test]
    fn a_group_lends_its_prefix_source_and_rate() {
        let world = World::new(Stage::Plain, &[eng("a", 60)]);
        let handles = PolicyHandles::new(world.load()).with_kv(Arc::clone(&world.index));
        let policy = |text: &str| -> PolicyConfig { serde_yaml_ng::from_str(text).expect("valid") };
        let engines = world.only(&["a"]);
        for (text, ms) in [
            // Its own rate, and the local index: 64 uncached tokens at 2 tokens/ms.
            ("{type: predicted_ttft, default_prefill_tokens_per_sec: 2000}", 32.0),
            // The index, at the default rate of 10000 tokens/s.
            ("{type: cache_aware}", 6.4),
            ("{type: round_robin}", 6.4),
        ] {
            let live = LiveEstimator::for_group(&policy(text), &handles).expect("built");
            let estimate = ttft(&live, &world, &engines, 1_024).expect("an estimate");
            assert!((estimate - ms).abs() < 1e-9, "{text}: {estimate}");
        }
        // A router without a local index: every token uncached.
        let bare = PolicyHandles::new(world.load());
        let live = LiveEstimator::for_group(&policy("{type: power_of_two}"), &bare).expect("built");
        let estimate = ttft(&live, &world, &engines, 1_024).expect("an estimate");
        assert!((estimate - 102.4).abs() < 1e-9, "{estimate}");
        let missing = LiveEstimator::for_group(&policy("{type: predicted_ttft}"), &bare);
        assert!(matches!(missing, Err(ConfigError::MissingState { .. })), "{missing:?}");
        let zero = LiveEstimator::new(world.load(), None, 0.0);
        assert!(matches!(zero, Err(ConfigError::InvalidValue { .. })), "{zero:?}");
    }
}
