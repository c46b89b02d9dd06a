//! Prometheus metrics: the recorder, and one function per thing the router measures so that
//! names and labels live in one place (`docs/metrics.md` lists them).

use std::cell::RefCell;
use std::sync::OnceLock;
use std::time::Duration;

use hashbrown::HashMap;
use metrics::{Counter, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use router_policies::{MATCHED_TOKEN_BOUNDS, MatchedTokens, SourceStats};

use router_prepare::usage::Usage;

mod catalogue;
mod state;

pub(crate) use state::{
    engine_accepting, engine_drained, engine_healthy, engine_status, inflight, kv_events_silent,
    kv_index, kv_worker, load_freshness, segment_cache,
};

use catalogue::{ERROR_BUCKETS, ERROR_METRIC, LATENCY_BUCKETS, RATIO_BUCKETS, describe_all, help};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often histogram samples are folded into their buckets. The recorder keeps every sample
/// until then (the exporter's own `install` runs this upkeep; a recorder built and installed
/// apart, as here, does not): without it, a router nobody scrapes would grow by a few dozen
/// bytes per request for good.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The thread that runs the recorder's upkeep.
const UPKEEP_THREAD: &str = "metrics-upkeep";

/// Installs the process-wide recorder once, with its upkeep, and returns its handle.
pub(crate) fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_ratio".into()), RATIO_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(ERROR_METRIC.into()), ERROR_BUCKETS)
                })
                .map(PrometheusBuilder::build_recorder);
            match recorder {
                Ok(recorder) => {
                    let handle = recorder.handle();
                    // Fails only if another recorder was installed first; then this handle
                    // renders nothing, which the metrics test would catch.
                    let _ = metrics::set_global_recorder(recorder);
                    describe_all();
                    // Exported from the start, so a dashboard shows an empty queue as 0.
                    queue_depth(0);
                    let upkept = handle.clone();
                    let upkeep =
                        std::thread::Builder::new().name(UPKEEP_THREAD.into()).spawn(move || {
                            loop {
                                #[expect(
                                    clippy::disallowed_methods,
                                    reason = "a thread of its own, no runtime's"
                                )]
                                std::thread::sleep(UPKEEP_INTERVAL);
                                upkept.run_upkeep();
                            }
                        });
                    if let Err(err) = upkeep {
                        tracing::warn!(%err, "no metrics upkeep: histograms grow until scraped");
                    }
                    handle
                }
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}

/// The handles of the series every request touches, cached per thread: the registry lookup
/// (label strings allocated, hashed and looked up under a lock) then happens once per series
/// and thread instead of on every request. Models and buckets come from the configuration and
/// statuses are few, so the cache stays small.
struct ModelSeries {
    /// Made on first use: a request refused before selection has neither.
    head: Option<Histogram>,
    selection: Option<Histogram>,
    buckets: HashMap<String, BucketSeries>,
}

struct BucketSeries {
    duration: Histogram,
    requests: Vec<(u16, Counter)>,
}

thread_local! {
    static SERIES: RefCell<HashMap<String, ModelSeries>> = RefCell::new(HashMap::new());
}

/// `map`'s entry for `key`, made by `make` on first use: one lookup (hashbrown's foldhash, not
/// SipHash: these maps are looked up several times per request), and the key is copied into the
/// map only on first use, so looking up a series already made allocates nothing.
fn cached<'m, V>(
    map: &'m mut HashMap<String, V>,
    key: &str,
    make: impl FnOnce() -> V,
) -> &'m mut V {
    map.entry_ref(key).or_insert_with(make)
}

/// The counter labelled `label` among `counters`, made by `make` on first use.
fn counter_of<L: PartialEq>(
    counters: &mut Vec<(L, Counter)>,
    label: L,
    make: impl FnOnce() -> Counter,
) -> &Counter {
    let at = match counters.iter().position(|(l, _)| *l == label) {
        Some(at) => at,
        None => {
            counters.push((label, make()));
            counters.len() - 1
        }
    };
    &counters[at].1
}

/// Runs `f` on `model`'s cached series, creating them on first use.
fn with_model(model: &str, f: impl FnOnce(&str, &mut ModelSeries)) {
    SERIES.with_borrow_mut(|series| {
        let made = || ModelSeries { head: None, selection: None, buckets: HashMap::new() };
        f(model, cached(series, model, made));
    });
}

/// A finished inference request, of any endpoint.
pub(crate) fn request(model: &str, bucket: &str, status: u16, elapsed: Duration) {
    with_model(model, |model, series| {
        let made = || BucketSeries {
            duration: histogram!("router_request_duration_seconds", "model" => model.to_owned(), "bucket" => bucket.to_owned()),
            requests: Vec::new(),
        };
        let bucket_series = cached(&mut series.buckets, bucket, made);
        bucket_series.duration.record(elapsed.as_secs_f64());
        counter_of(&mut bucket_series.requests, status, || {
            counter!("router_requests_total", "model" => model.to_owned(), "bucket" => bucket.to_owned(), "status" => status.to_string())
        })
        .increment(1);
    });
}

/// Time from receiving the request to the engine's response head.
pub(crate) fn time_to_response_head(model: &str, elapsed: Duration) {
    record_model_histogram(model, "router_upstream_head_seconds", |s| &mut s.head, elapsed);
}

/// Time the router spent preparing and selecting, before dispatch.
pub(crate) fn selection(model: &str, elapsed: Duration) {
    record_model_histogram(model, "router_selection_seconds", |s| &mut s.selection, elapsed);
}

/// Records into the model's histogram `name`, kept in `slot` once made.
fn record_model_histogram(
    model: &str,
    name: &'static str,
    slot: fn(&mut ModelSeries) -> &mut Option<Histogram>,
    elapsed: Duration,
) {
    with_model(model, |model, series| {
        slot(series)
            .get_or_insert_with(|| histogram!(name, "model" => model.to_owned()))
            .record(elapsed.as_secs_f64());
    });
}

/// A request whose policy predicted its time to first token on `worker` (`predicted_ttft`),
/// observed at a stream's first byte or a one-token answer's end: the prediction, the time
/// from dispatch, their ratio and their difference.
pub(crate) fn ttft_prediction(model: &str, worker: &str, predicted_ms: f64, observed: Duration) {
    let observed_s = observed.as_secs_f64();
    histogram!(ERROR_METRIC, "model" => model.to_owned(), "worker" => worker.to_owned())
        .record(observed_s - predicted_ms / 1000.0);
    histogram!("router_predicted_ttft_seconds", "model" => model.to_owned())
        .record(predicted_ms / 1000.0);
    histogram!("router_observed_ttft_seconds", "model" => model.to_owned()).record(observed_s);
    if predicted_ms > 0.0 {
        histogram!("router_ttft_observed_over_predicted_ratio", "model" => model.to_owned())
            .record(observed_s * 1000.0 / predicted_ms);
    }
}

/// A request answered by the bucket the SLO order chose, for one target it stated and its
/// model reads (`target`: `ttft` or `tps`): whether that bucket's estimate met it.
pub(crate) fn slo_request(model: &str, target: &'static str, met: bool) {
    let met = if met { "true" } else { "false" };
    counter!("router_slo_requests_total", "model" => model.to_owned(), "target" => target, "met" => met)
        .increment(1);
}

/// The per-engine series of one model that every answer touches, cached per thread as
/// [`SERIES`] is.
struct EngineSeries {
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    prompt: Counter,
    cached: Counter,
    completion: Counter,
}

thread_local! {
    static ENGINE_SERIES: RefCell<HashMap<String, HashMap<String, EngineSeries>>> =
        RefCell::new(HashMap::new());
}

/// Runs `f` on the series of `model` on `worker`, creating them on first use.
fn with_engine(model: &str, worker: &str, f: impl FnOnce(&EngineSeries)) {
    ENGINE_SERIES.with_borrow_mut(|series| {
        let series = cached(series, model, HashMap::new);
        let made = || {
            let labels = [("model", model.to_owned()), ("worker", worker.to_owned())];
            EngineSeries {
                ttft: histogram!("router_time_to_first_token_seconds", &labels),
                itl: histogram!("router_inter_token_latency_seconds", &labels),
                e2e: histogram!("router_e2e_latency_seconds", &labels),
                prompt: counter!("router_prompt_tokens_total", &labels),
                cached: counter!("router_cached_tokens_total", &labels),
                completion: counter!("router_completion_tokens_total", &labels),
            }
        };
        f(cached(series, worker, made));
    });
}

/// What one answer of `worker` for `model` took and used: from receiving the request to the
/// first streamed byte (`ttft`, streams only) and to the end (`e2e`), the mean gap between
/// two generated tokens (`itl`, when the engine reported more than one), and the engine's
/// token counts.
pub(crate) fn answer(
    model: &str,
    worker: &str,
    ttft: Option<Duration>,
    itl: Option<Duration>,
    e2e: Duration,
    usage: Option<Usage>,
) {
    with_engine(model, worker, |series| {
        if let Some(ttft) = ttft {
            series.ttft.record(ttft.as_secs_f64());
        }
        if let Some(itl) = itl {
            series.itl.record(itl.as_secs_f64());
        }
        series.e2e.record(e2e.as_secs_f64());
        if let Some(usage) = usage {
            series.prompt.increment(usage.prompt);
            series.cached.increment(usage.cached);
            series.completion.increment(usage.completion);
        }
    });
}

thread_local! {
    /// Each engine's selection counters by stage, cached per thread as [`SERIES`] is: every
    /// dispatch counts one.
    static SELECTIONS: RefCell<HashMap<String, Vec<(&'static str, Counter)>>> =
        RefCell::new(HashMap::new());
    /// The pick counters by (policy, stage, reason), likewise.
    static PICKS: RefCell<HashMap<(&'static str, &'static str, &'static str), Counter>> =
        RefCell::new(HashMap::new());
}

/// An engine chosen by a selection, for `stage` (`plain`, `prefill`, `decode`).
pub(crate) fn engine_selected(worker: &str, stage: &'static str) {
    SELECTIONS.with_borrow_mut(|selections| {
        let stages = cached(selections, worker, Vec::new);
        counter_of(stages, stage, || {
            counter!("router_engine_selections_total", "worker" => worker.to_owned(), "stage" => stage)
        })
        .increment(1);
    });
}

/// A successful pick by a policy.
pub(crate) fn pick(policy: &'static str, stage: &'static str, reason: &'static str) {
    PICKS.with_borrow_mut(|picks| {
        picks
            .entry((policy, stage, reason))
            .or_insert_with(|| {
                counter!("router_picks_total", "policy" => policy, "stage" => stage, "reason" => reason)
            })
            .increment(1);
    });
}

/// A data-parallel rank chosen for a dispatch to an engine whose worker sets `dp_route`.
pub(crate) fn rank_choice(worker: &str, rank: u32, reason: &'static str) {
    counter!("router_dp_rank_dispatches_total", "worker" => worker.to_owned(), "rank" => rank.to_string(), "reason" => reason)
        .increment(1);
}

/// An admission rejection met while selecting.
pub(crate) fn admission_rejection(limit: &'static str) {
    counter!("router_admission_rejections_total", "limit" => limit).increment(1);
}

/// A bucket that could not supply a complete selection, so the next one was tried.
pub(crate) fn bucket_fallback(model: &str, bucket: &str, reason: &'static str) {
    counter!("router_bucket_fallbacks_total", "model" => model.to_owned(), "bucket" => bucket.to_owned(), "reason" => reason)
        .increment(1);
}

/// A dispatch to an engine that failed.
pub(crate) fn engine_failure(worker: &str, kind: &'static str) {
    counter!("router_engine_failures_total", "worker" => worker.to_owned(), "kind" => kind)
        .increment(1);
}

/// The lookup outcomes of the prefix sources of one kind (`local` or `remote`), as absolute
/// counts (set at scrape time).
pub(crate) fn cache_lookups(source: &'static str, stats: &SourceStats) {
    for (outcome, count) in stats.outcomes() {
        counter!("router_cache_lookups_total", "source" => source, "outcome" => outcome)
            .absolute(count);
    }
}

/// `router_cache_matched_tokens`, a histogram per source kind, as Prometheus text. The
/// sources keep these counts themselves (lock-free, on the lookup path), so the family is
/// written here rather than through the recorder, which only takes single observations.
pub(crate) fn cache_matched_tokens(sources: &[(&'static str, MatchedTokens)]) -> String {
    use std::fmt::Write;
    const NAME: &str = "router_cache_matched_tokens";
    let mut out = String::new();
    if sources.is_empty() {
        return out;
    }
    let _ = writeln!(out, "# HELP {NAME} {}", help(NAME));
    let _ = writeln!(out, "# TYPE {NAME} histogram");
    for (source, matched) in sources {
        let mut cumulative = 0;
        let bounds = MATCHED_TOKEN_BOUNDS.iter().map(ToString::to_string);
        for (le, count) in bounds.chain(["+Inf".to_owned()]).zip(matched.counts) {
            cumulative += count;
            let _ = writeln!(out, "{NAME}_bucket{{source=\"{source}\",le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{NAME}_sum{{source=\"{source}\"}} {}", matched.sum);
        let _ = writeln!(out, "{NAME}_count{{source=\"{source}\"}} {cumulative}");
    }
    out
}

/// Unexpired predicted and approximate blocks (set at scrape time): the router's guesses, not
/// engine truth.
pub(crate) fn predicted_blocks(blocks: router_state_kv::PredictedBlocks) {
    gauge!("router_kv_predicted_blocks").set(blocks.predicted as f64);
    gauge!("router_kv_approximate_blocks").set(blocks.approximate as f64);
}

/// A chat request routed without a prefix lookup although its model has a tokenizer: it has
/// no exact rendering (`non_text_part`, `template_error`), so the engine renders it.
pub(crate) fn prefix_unmatchable(reason: &'static str) {
    counter!("router_prefix_unmatchable_total", "reason" => reason).increment(1);
}

/// A client request refused before it reached an inference handler: `queue_full` or
/// `queue_timeout` (the concurrency bound and its queue) or `unauthorized` (no valid client
/// key).
pub(crate) fn refused(reason: &'static str) {
    counter!("router_requests_refused_total", "reason" => reason).increment(1);
}

/// A request refused by the rate limits of client `key` (its name, or `anonymous`; never the
/// key): `limit` is `requests` or `tokens`.
pub(crate) fn rate_limited(key: &str, limit: &'static str) {
    counter!("router_rate_limited_total", "key" => key.to_owned(), "limit" => limit).increment(1);
}

/// An engine's circuit breaker changed state (`closed`, `open`, `half_open`).
pub(crate) fn breaker_transition(worker: &str, from: &'static str, to: &'static str) {
    counter!("router_breaker_transitions_total", "worker" => worker.to_owned(), "to" => to)
        .increment(1);
    gauge!("router_breaker_state", "worker" => worker.to_owned(), "state" => from).set(0.0);
    gauge!("router_breaker_state", "worker" => worker.to_owned(), "state" => to).set(1.0);
}

/// Requests waiting in the admission queue now.
pub(crate) fn queue_depth(depth: usize) {
    gauge!("router_queue_depth").set(depth as f64);
}

/// How long a request waited in the admission queue, and whether it got a slot.
pub(crate) fn queue_wait(waited: Duration, admitted: bool) {
    let outcome = if admitted { "admitted" } else { "timeout" };
    histogram!("router_queue_wait_seconds", "outcome" => outcome).record(waited.as_secs_f64());
}

/// A dispatch retried on another engine: `unreachable` or `status_<code>`.
pub(crate) fn retry(model: &str, reason: &str) {
    counter!("router_retries_total", "model" => model.to_owned(), "reason" => reason.to_owned())
        .increment(1);
}

/// A retry refused because the retry budget was spent.
pub(crate) fn retry_budget_exhausted(model: &str) {
    counter!("router_retry_budget_exhausted_total", "model" => model.to_owned()).increment(1);
}

/// An endpoint-picker stream began, with the filter's request body mode.
pub(crate) fn epp_stream(mode: &'static str) {
    counter!("router_epp_streams_total", "mode" => mode).increment(1);
}

/// An endpoint-picker stream ended: `closed` by Envoy, `reset` (broken, a client gone) or
/// `abandoned` (Envoy stopped reading).
pub(crate) fn epp_stream_end(end: &'static str) {
    counter!("router_epp_stream_ends_total", "end" => end).increment(1);
}

/// Endpoint-picker streams open now, moved by `delta`.
pub(crate) fn epp_stream_open(delta: f64) {
    gauge!("router_epp_open_streams").increment(delta);
}

/// A local reply the endpoint picker answered instead of a pick.
pub(crate) fn epp_immediate_response(status: u16) {
    counter!("router_epp_immediate_responses_total", "status" => status.to_string()).increment(1);
}

/// A pick with `count` fallbacks named after it.
pub(crate) fn epp_fallbacks(count: usize) {
    histogram!("router_epp_fallback_endpoints").record(count as f64);
}

#[cfg(test)]
mod tests {
    use router_workers::EngineStatus;

    use super::catalogue::{DESCRIPTIONS, Kind};
    use super::*;

    #[test]
    fn matched_tokens_render_as_a_cumulative_histogram_per_source() {
        let mut counts = [0; MATCHED_TOKEN_BOUNDS.len() + 1];
        counts[0] = 2; // misses
        counts[2] = 1; // at most 64
        counts[MATCHED_TOKEN_BOUNDS.len()] = 1; // above every bound
        let local = MatchedTokens { counts, sum: 100_032 };
        let text = cache_matched_tokens(&[("local", local), ("remote", MatchedTokens::default())]);
        for line in [
            "# TYPE router_cache_matched_tokens histogram",
            r#"router_cache_matched_tokens_bucket{source="local",le="0"} 2"#,
            r#"router_cache_matched_tokens_bucket{source="local",le="16"} 2"#,
            r#"router_cache_matched_tokens_bucket{source="local",le="64"} 3"#,
            r#"router_cache_matched_tokens_bucket{source="local",le="65536"} 3"#,
            r#"router_cache_matched_tokens_bucket{source="local",le="+Inf"} 4"#,
            r#"router_cache_matched_tokens_sum{source="local"} 100032"#,
            r#"router_cache_matched_tokens_count{source="local"} 4"#,
            r#"router_cache_matched_tokens_count{source="remote"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing from\n{text}");
        }
        assert_eq!(text.matches("# TYPE").count(), 1);
        assert_eq!(text.matches("# HELP router_cache_matched_tokens Longest").count(), 1);
        assert!(cache_matched_tokens(&[]).is_empty());
    }

    /// The value of one series, as rendered.
    fn value(name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        crate::tests::metric(name, labels)
    }

    #[test]
    fn request_series_carry_model_bucket_and_status_in_latency_buckets() {
        install();
        let secs = Duration::from_secs_f64;
        request("metrics-m", "short", 200, secs(0.2));
        request("metrics-m", "short", 200, secs(2.0));
        request("metrics-m", "short", 503, secs(0.004));
        request("metrics-m", "long", 200, secs(400.0));
        let series = |bucket, status| {
            let labels = [("model", "metrics-m"), ("bucket", bucket), ("status", status)];
            value("router_requests_total", &labels)
        };
        assert_eq!(series("short", "200"), Some(2.0));
        assert_eq!(series("short", "503"), Some(1.0));
        assert_eq!(series("long", "200"), Some(1.0));
        let duration = |suffix: &str, bucket, le: Option<&str>| {
            let mut labels = vec![("model", "metrics-m"), ("bucket", bucket)];
            labels.extend(le.map(|le| ("le", le)));
            value(&format!("router_request_duration_seconds{suffix}"), &labels)
        };
        assert_eq!(duration("_count", "short", None), Some(3.0));
        assert_eq!(duration("_bucket", "short", Some("0.005")), Some(1.0));
        assert_eq!(duration("_bucket", "short", Some("0.25")), Some(2.0));
        assert_eq!(duration("_bucket", "short", Some("2.5")), Some(3.0));
        assert_eq!(duration("_bucket", "long", Some("300")), Some(0.0), "the last bound");
        assert_eq!(duration("_bucket", "long", Some("+Inf")), Some(1.0));

        time_to_response_head("metrics-m", secs(0.03));
        selection("metrics-m", secs(0.0005));
        selection("metrics-m", secs(0.0005));
        let model = [("model", "metrics-m")];
        assert_eq!(value("router_upstream_head_seconds_count", &model), Some(1.0));
        assert_eq!(value("router_selection_seconds_count", &model), Some(2.0));
        let fast = [("model", "metrics-m"), ("le", "0.001")];
        assert_eq!(value("router_selection_seconds_bucket", &fast), Some(2.0));
    }

    #[test]
    fn answers_are_recorded_per_model_and_engine() {
        install();
        let ms = Duration::from_millis;
        let usage = Usage { prompt: 10, cached: 4, completion: 5 };
        answer("metrics-ans", "metrics-e1", Some(ms(20)), Some(ms(5)), ms(45), Some(usage));
        answer("metrics-ans", "metrics-e1", None, None, ms(30), None);
        answer("metrics-ans", "metrics-e2", None, None, ms(30), Some(usage));
        engine_selected("metrics-e1", "plain");
        engine_selected("metrics-e1", "plain");
        engine_selected("metrics-e1", "decode");
        let e1 = [("model", "metrics-ans"), ("worker", "metrics-e1")];
        let e2 = [("model", "metrics-ans"), ("worker", "metrics-e2")];
        assert_eq!(value("router_time_to_first_token_seconds_count", &e1), Some(1.0));
        assert_eq!(value("router_time_to_first_token_seconds_sum", &e1), Some(0.02));
        assert_eq!(value("router_inter_token_latency_seconds_sum", &e1), Some(0.005));
        assert_eq!(value("router_e2e_latency_seconds_count", &e1), Some(2.0));
        assert_eq!(value("router_e2e_latency_seconds_count", &e2), Some(1.0));
        assert_eq!(value("router_prompt_tokens_total", &e1), Some(10.0));
        assert_eq!(value("router_cached_tokens_total", &e1), Some(4.0));
        assert_eq!(value("router_completion_tokens_total", &e2), Some(5.0));
        let plain = [("worker", "metrics-e1"), ("stage", "plain")];
        let decode = [("worker", "metrics-e1"), ("stage", "decode")];
        assert_eq!(value("router_engine_selections_total", &plain), Some(2.0));
        assert_eq!(value("router_engine_selections_total", &decode), Some(1.0));
    }

    #[test]
    fn ttft_predictions_compare_with_what_the_client_saw() {
        install();
        ttft_prediction("metrics-ttft", "e1", 200.0, Duration::from_millis(300));
        let model = [("model", "metrics-ttft")];
        assert_eq!(value("router_predicted_ttft_seconds_sum", &model), Some(0.2));
        assert_eq!(value("router_observed_ttft_seconds_sum", &model), Some(0.3));
        let ratio = "router_ttft_observed_over_predicted_ratio";
        assert_eq!(value(&format!("{ratio}_sum"), &model), Some(1.5));
        let below = [("model", "metrics-ttft"), ("le", "1.25")];
        let at = [("model", "metrics-ttft"), ("le", "1.5")];
        assert_eq!(value(&format!("{ratio}_bucket"), &below), Some(0.0), "ratio buckets");
        assert_eq!(value(&format!("{ratio}_bucket"), &at), Some(1.0));
        // A prediction of zero has no ratio.
        ttft_prediction("metrics-ttft-zero", "e1", 0.0, Duration::from_millis(5));
        let zero = [("model", "metrics-ttft-zero")];
        assert_eq!(value("router_predicted_ttft_seconds_count", &zero), Some(1.0));
        assert_eq!(value(&format!("{ratio}_count"), &zero), None);
    }

    /// A series: its name, some of its labels and its value.
    type Series = (&'static str, &'static [(&'static str, &'static str)], f64);

    #[test]
    fn each_counter_and_gauge_has_its_name_and_labels() {
        install();
        pick("metrics-policy", "prefill", "metrics-reason");
        slo_request("metrics-m2", "ttft", true);
        slo_request("metrics-m2", "ttft", true);
        slo_request("metrics-m2", "tps", false);
        admission_rejection("metrics-limit");
        admission_rejection("metrics-limit");
        bucket_fallback("metrics-m2", "short", "admission");
        engine_failure("metrics-w1", "stalled");
        refused("metrics-refusal");
        retry("metrics-m2", "unreachable");
        retry_budget_exhausted("metrics-m2");
        inflight("metrics-w1", 7);
        engine_healthy("metrics-w1", false);
        engine_healthy("metrics-w2", true);
        load_freshness("metrics-w1", "stale", Some(4500));
        load_freshness("metrics-w2", "missing", None);
        kv_worker("metrics-w1", &[("blocks", 12), ("last_seq", 99)]);
        let stats = SourceStats { found: 3, refused: 1, ..SourceStats::default() };
        cache_lookups("metrics-source", &stats);
        #[rustfmt::skip]
        let series: [Series; 23] = [
            ("router_picks_total", &[("policy", "metrics-policy"), ("stage", "prefill"), ("reason", "metrics-reason")], 1.0),
            ("router_slo_requests_total", &[("model", "metrics-m2"), ("target", "ttft"), ("met", "true")], 2.0),
            ("router_slo_requests_total", &[("model", "metrics-m2"), ("target", "tps"), ("met", "false")], 1.0),
            ("router_admission_rejections_total", &[("limit", "metrics-limit")], 2.0),
            ("router_bucket_fallbacks_total", &[("model", "metrics-m2"), ("bucket", "short"), ("reason", "admission")], 1.0),
            ("router_engine_failures_total", &[("worker", "metrics-w1"), ("kind", "stalled")], 1.0),
            ("router_requests_refused_total", &[("reason", "metrics-refusal")], 1.0),
            ("router_retries_total", &[("model", "metrics-m2")], 1.0),
            ("router_retry_budget_exhausted_total", &[("model", "metrics-m2")], 1.0),
            ("router_engine_inflight", &[("worker", "metrics-w1")], 7.0),
            ("router_engine_healthy", &[("worker", "metrics-w1")], 0.0),
            ("router_engine_healthy", &[("worker", "metrics-w2")], 1.0),
            ("router_load_report_state", &[("worker", "metrics-w1"), ("state", "stale")], 1.0),
            ("router_load_report_state", &[("worker", "metrics-w1"), ("state", "fresh")], 0.0),
            ("router_load_report_state", &[("worker", "metrics-w1"), ("state", "missing")], 0.0),
            ("router_load_report_state", &[("worker", "metrics-w2"), ("state", "missing")], 1.0),
            ("router_load_report_age_seconds", &[("worker", "metrics-w1")], 4.5),
            ("router_kv_events", &[("worker", "metrics-w1"), ("counter", "blocks")], 12.0),
            ("router_kv_events", &[("worker", "metrics-w1"), ("counter", "last_seq")], 99.0),
            ("router_cache_lookups_total", &[("source", "metrics-source"), ("outcome", "found")], 3.0),
            ("router_cache_lookups_total", &[("source", "metrics-source"), ("outcome", "refused")], 1.0),
            ("router_cache_lookups_total", &[("source", "metrics-source"), ("outcome", "empty")], 0.0),
            ("router_cache_lookups_total", &[("source", "metrics-source"), ("outcome", "timeout")], 0.0),
        ];
        for (name, labels, expected) in series {
            assert_eq!(value(name, labels), Some(expected), "{name} {labels:?}");
        }
        assert_eq!(value("router_load_report_age_seconds", &[("worker", "metrics-w2")]), None);
        // Lookup counts are absolute: a later scrape sets, never adds.
        cache_lookups("metrics-source", &SourceStats { found: 5, ..SourceStats::default() });
        let found = [("source", "metrics-source"), ("outcome", "found")];
        assert_eq!(value("router_cache_lookups_total", &found), Some(5.0));
    }

    /// Records one observation of every metric the router exports.
    fn touch_every_metric() {
        let secs = Duration::from_secs_f64;
        request("help-m", "b", 200, secs(0.1));
        time_to_response_head("help-m", secs(0.1));
        selection("help-m", secs(0.001));
        ttft_prediction("help-m", "e1", 100.0, secs(0.1));
        slo_request("help-m", "ttft", true);
        pick("help-policy", "plain", "random");
        rank_choice("help-w", 0, "only_rank");
        admission_rejection("help-limit");
        bucket_fallback("help-m", "b", "admission");
        engine_failure("help-w", "status");
        inflight("help-w", 1);
        engine_healthy("help-w", true);
        engine_status("help-w", EngineStatus::ALL[0]);
        engine_drained("help-w", false);
        engine_accepting("help-w", true);
        load_freshness("help-w", "fresh", Some(10));
        kv_worker("help-w", &[("blocks", 1)]);
        kv_index(1, 1);
        segment_cache(
            "help-m",
            router_prepare::SegmentCacheStats { entries: 1, bytes: 68, hits: 1, misses: 1 },
        );
        cache_lookups("help-source", &SourceStats::default());
        predicted_blocks(router_state_kv::PredictedBlocks { predicted: 1, approximate: 2 });
        refused("help-reason");
        rate_limited("help-key", "requests");
        breaker_transition("help-w", "closed", "open");
        queue_depth(0);
        queue_wait(secs(0.01), true);
        retry("help-m", "unreachable");
        retry_budget_exhausted("help-m");
        prefix_unmatchable("non_text_part");
        kv_events_silent("help-w");
        epp_stream("none");
        epp_stream_end("closed");
        epp_stream_open(0.0);
        epp_immediate_response(503);
        epp_fallbacks(1);
    }

    #[test]
    fn the_recorder_is_upkept_by_its_own_thread() {
        install();
        let tasks = std::fs::read_dir("/proc/self/task").expect("this process's threads");
        let names: Vec<String> = tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim_end().to_owned())
            .collect();
        assert!(names.iter().any(|name| name == UPKEEP_THREAD), "threads: {names:?}");
    }

    #[test]
    fn every_exported_metric_has_help_and_type_and_docs_list_every_one() {
        let handle = install();
        touch_every_metric();
        let mut counts = [0; MATCHED_TOKEN_BOUNDS.len() + 1];
        counts[0] = 1;
        let mut text = handle.render();
        text.push_str(&cache_matched_tokens(&[("local", MatchedTokens { counts, sum: 0 })]));
        let lines: Vec<&str> = text.lines().collect();
        let mut typed = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
            let (name, kind) = rest.split_once(' ').expect("a name and a type");
            typed.push(name);
            let help_line = i.checked_sub(1).map(|j| lines[j]).unwrap_or_default();
            let help_text = help_line.strip_prefix(&format!("# HELP {name} "));
            assert!(help_text.is_some_and(|t| !t.is_empty()), "{name} has no HELP: {help_line:?}");
            let (_, described, _) = DESCRIPTIONS
                .iter()
                .find(|(n, _, _)| *n == name)
                .unwrap_or_else(|| panic!("{name} is exported but not described"));
            // A histogram without configured buckets renders as a summary (quantiles).
            let expected: &[&str] = match described {
                Kind::Counter => &["counter"],
                Kind::Gauge => &["gauge"],
                Kind::Histogram => &["histogram", "summary"],
            };
            assert!(expected.contains(&kind), "{name} is a {kind}, described as {described:?}");
        }
        let docs = include_str!("../../../docs/metrics.md");
        for (name, _, _) in DESCRIPTIONS {
            assert!(typed.contains(name), "{name} is described but was not exported");
            assert!(
                docs.contains(&format!("| `{name}` |")),
                "docs/metrics.md does not list {name}"
            );
        }
        for row in docs.lines().filter_map(|l| l.strip_prefix("| `router_")) {
            let name = format!("router_{}", row.split('`').next().unwrap_or_default());
            assert!(
                DESCRIPTIONS.iter().any(|(n, _, _)| *n == name),
                "docs/metrics.md lists {name}, which has no description"
            );
        }
    }
}
