//! Prometheus metrics: the recorder, and one function per thing the router measures so that
//! names and labels live in one place (`docs/metrics.md` lists them).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use router_policies::{MATCHED_TOKEN_BOUNDS, MatchedTokens, SourceStats};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Latency buckets in seconds: from sub-millisecond router work to long generations.
const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// Buckets of observed over predicted time to first token: 1 is a perfect prediction.
const RATIO_BUCKETS: &[f64] = &[0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 8.0];

/// Installs the process-wide recorder once and returns its handle.
pub(crate) fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_ratio".into()), RATIO_BUCKETS)
                })
                .map(PrometheusBuilder::build_recorder);
            match recorder {
                Ok(recorder) => {
                    let handle = recorder.handle();
                    // Fails only if another recorder was installed first; then this handle
                    // renders nothing, which the metrics test would catch.
                    let _ = metrics::set_global_recorder(recorder);
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

/// Runs `f` on `model`'s cached series, creating them on first use.
fn with_model(model: &str, f: impl FnOnce(&str, &mut ModelSeries)) {
    SERIES.with_borrow_mut(|series| {
        if !series.contains_key(model) {
            let created = ModelSeries { head: None, selection: None, buckets: HashMap::new() };
            series.insert(model.to_owned(), created);
        }
        if let Some(found) = series.get_mut(model) {
            f(model, found);
        }
    });
}

/// A finished chat request.
pub(crate) fn request(model: &str, bucket: &str, status: u16, elapsed: Duration) {
    with_model(model, |model, series| {
        if !series.buckets.contains_key(bucket) {
            let duration = histogram!("router_request_duration_seconds", "model" => model.to_owned(), "bucket" => bucket.to_owned());
            series
                .buckets
                .insert(bucket.to_owned(), BucketSeries { duration, requests: Vec::new() });
        }
        let Some(bucket_series) = series.buckets.get_mut(bucket) else { return };
        bucket_series.duration.record(elapsed.as_secs_f64());
        match bucket_series.requests.iter().find(|(s, _)| *s == status) {
            Some((_, counter)) => counter.increment(1),
            None => {
                let counter = counter!("router_requests_total", "model" => model.to_owned(), "bucket" => bucket.to_owned(), "status" => status.to_string());
                counter.increment(1);
                bucket_series.requests.push((status, counter));
            }
        }
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

/// A streamed request whose policy predicted its time to first token (`predicted_ttft`):
/// the prediction, what the client saw from dispatch to the first byte, and their ratio.
pub(crate) fn ttft_prediction(model: &str, predicted_ms: f64, observed: Duration) {
    let observed_s = observed.as_secs_f64();
    histogram!("router_predicted_ttft_seconds", "model" => model.to_owned())
        .record(predicted_ms / 1000.0);
    histogram!("router_observed_ttft_seconds", "model" => model.to_owned()).record(observed_s);
    if predicted_ms > 0.0 {
        histogram!("router_ttft_observed_over_predicted_ratio", "model" => model.to_owned())
            .record(observed_s * 1000.0 / predicted_ms);
    }
}

/// A successful pick by a policy.
pub(crate) fn pick(policy: &'static str, stage: &'static str, reason: &'static str) {
    counter!("router_picks_total", "policy" => policy, "stage" => stage, "reason" => reason)
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

/// Router-local in-flight requests of an engine (set at scrape time).
pub(crate) fn inflight(worker: &str, count: u64) {
    gauge!("router_engine_inflight", "worker" => worker.to_owned()).set(count as f64);
}

/// Engine health as the router sees it (set at scrape time).
pub(crate) fn engine_healthy(worker: &str, healthy: bool) {
    gauge!("router_engine_healthy", "worker" => worker.to_owned()).set(if healthy {
        1.0
    } else {
        0.0
    });
}

/// Load-report freshness of an engine: 1 for the state it is in, 0 for the others.
pub(crate) fn load_freshness(worker: &str, state: &'static str, age_ms: Option<u64>) {
    for candidate in ["fresh", "stale", "missing"] {
        gauge!("router_load_report_state", "worker" => worker.to_owned(), "state" => candidate)
            .set(if candidate == state { 1.0 } else { 0.0 });
    }
    if let Some(age) = age_ms {
        gauge!("router_load_report_age_seconds", "worker" => worker.to_owned())
            .set(age as f64 / 1000.0);
    }
}

/// KV-event counters of one engine rank (absolute values, set at scrape time).
pub(crate) fn kv_worker(worker: &str, counters: &[(&'static str, u64)]) {
    for (name, value) in counters {
        gauge!("router_kv_events", "worker" => worker.to_owned(), "counter" => *name)
            .set(*value as f64);
    }
}

/// Size of the prefix index (set at scrape time).
pub(crate) fn kv_index(nodes: u64, bytes: u64) {
    gauge!("router_kv_index_nodes").set(nodes as f64);
    gauge!("router_kv_index_bytes").set(bytes as f64);
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

/// Unexpired predicted blocks (set at scrape time): the router's guesses, not engine truth.
pub(crate) fn predicted_blocks(blocks: u64) {
    gauge!("router_kv_predicted_blocks").set(blocks as f64);
}

/// A client request refused before it reached the chat handler: `overloaded` (the concurrency
/// bound) or `unauthorized` (no valid client key).
pub(crate) fn refused(reason: &'static str) {
    counter!("router_requests_refused_total", "reason" => reason).increment(1);
}

/// A dispatch retried after an engine could not be reached.
pub(crate) fn retry(model: &str) {
    counter!("router_retries_total", "model" => model.to_owned()).increment(1);
}

/// A retry refused because the retry budget was spent.
pub(crate) fn retry_budget_exhausted(model: &str) {
    counter!("router_retry_budget_exhausted_total", "model" => model.to_owned()).increment(1);
}

#[cfg(test)]
mod tests {
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
        assert!(cache_matched_tokens(&[]).is_empty());
    }
}
