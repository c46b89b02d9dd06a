//! The generator's measurements: counts, throughput, time to first token, cache hit rate
//! from usage, per-engine share, and for trace replays the oracle hit rates beside the
//! measured one; as text and as one JSON object.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use super::client::Outcome;
use super::trace::OracleReport;

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Requests sent (finished or still in flight when the run ended).
    pub sent: u64,
    /// Requests that finished, successfully or not.
    pub requests: u64,
    /// Requests answered completely.
    pub ok: u64,
    /// Requests that failed (non-2xx, transport error, broken stream).
    pub errors: u64,
    /// Failures by class (`status_500`, `connect`, `broken_stream`, ...).
    pub error_kinds: BTreeMap<String, u64>,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Successful requests per second.
    pub throughput_rps: f64,
    /// Median time to the first content token of successful requests.
    pub ttft_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub ttft_p99_ms: Option<f64>,
    /// Mean of the same.
    pub ttft_mean_ms: Option<f64>,
    /// Median end-to-end latency of successful requests.
    pub latency_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub latency_p99_ms: Option<f64>,
    /// Sum of `usage.prompt_tokens` over successful requests that reported usage.
    pub prompt_tokens: u64,
    /// Sum of `usage.prompt_tokens_details.cached_tokens` over the same requests.
    pub cached_tokens: u64,
    /// Sum of `usage.completion_tokens`.
    pub completion_tokens: u64,
    /// `cached_tokens / prompt_tokens` (0 when nothing reported usage).
    pub cache_hit_rate: f64,
    /// Engine id -> fraction of the requests that named their engine in `x-router-engine`
    /// (or `x-router-decode-engine`); empty when no response did.
    pub engine_share: BTreeMap<String, f64>,
    /// Engine id -> number of those requests.
    pub engine_requests: BTreeMap<String, u64>,
    /// Trace replays: the oracle hit rates over the requests sent.
    pub oracle: Option<OracleReport>,
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Report {
    /// Builds the report of `outcomes` over `elapsed`, of `sent` requests.
    pub(crate) fn new(
        outcomes: &[Outcome],
        elapsed: Duration,
        sent: u64,
        oracle: Option<OracleReport>,
    ) -> Self {
        let mut report = Report { elapsed, sent, oracle, ..Report::default() };
        let mut ttfts = Vec::new();
        let mut latencies = Vec::new();
        for outcome in outcomes {
            report.requests += 1;
            if let Some(engine) = &outcome.engine {
                *report.engine_requests.entry(engine.clone()).or_default() += 1;
            }
            if let Some(kind) = &outcome.error {
                report.errors += 1;
                *report.error_kinds.entry(kind.clone()).or_default() += 1;
                continue;
            }
            report.ok += 1;
            ttfts.extend(outcome.ttft.map(ms));
            latencies.push(ms(outcome.latency));
            if let Some(prompt) = outcome.prompt_tokens {
                report.prompt_tokens += prompt;
                report.cached_tokens += outcome.cached_tokens.unwrap_or(0);
            }
            report.completion_tokens += outcome.completion_tokens.unwrap_or(0);
        }
        ttfts.sort_by(f64::total_cmp);
        latencies.sort_by(f64::total_cmp);
        report.ttft_p50_ms = percentile(&ttfts, 50.0);
        report.ttft_p99_ms = percentile(&ttfts, 99.0);
        report.ttft_mean_ms =
            (!ttfts.is_empty()).then(|| ttfts.iter().sum::<f64>() / ttfts.len() as f64);
        report.latency_p50_ms = percentile(&latencies, 50.0);
        report.latency_p99_ms = percentile(&latencies, 99.0);
        let secs = elapsed.as_secs_f64();
        report.throughput_rps = if secs > 0.0 { report.ok as f64 / secs } else { 0.0 };
        report.cache_hit_rate = if report.prompt_tokens > 0 {
            report.cached_tokens as f64 / report.prompt_tokens as f64
        } else {
            0.0
        };
        let named: u64 = report.engine_requests.values().sum();
        report.engine_share = report
            .engine_requests
            .iter()
            .map(|(engine, n)| (engine.clone(), *n as f64 / named as f64))
            .collect();
        report
    }

    /// The JSON object `--json` prints last. Its keys `sent`, `requests`, `errors`,
    /// `throughput_rps`, `ttft_p50_ms`, `ttft_p99_ms`, `cache_hit_rate`, `engine_share` (and
    /// for a trace replay `oracle_hit_rate`, `oracle_fleet_hit_rate`, `oracle_prompt_tokens`)
    /// are a contract; latencies without any sample are `null`, and so is
    /// `oracle_fleet_hit_rate` without `--fleet-capacity-tokens`.
    pub fn to_json(&self) -> Value {
        let mut value = json!({
            "sent": self.sent,
            "requests": self.requests,
            "errors": self.errors,
            "ok": self.ok,
            "throughput_rps": self.throughput_rps,
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p99_ms": self.ttft_p99_ms,
            "ttft_mean_ms": self.ttft_mean_ms,
            "latency_p50_ms": self.latency_p50_ms,
            "latency_p99_ms": self.latency_p99_ms,
            "cache_hit_rate": self.cache_hit_rate,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "duration_s": self.elapsed.as_secs_f64(),
            "engine_share": self.engine_share,
            "engine_requests": self.engine_requests,
            "error_kinds": self.error_kinds,
        });
        if let Some(oracle) = &self.oracle {
            value["oracle_hit_rate"] = json!(oracle.hit_rate());
            value["oracle_fleet_hit_rate"] = json!(oracle.fleet_hit_rate());
            value["oracle_prompt_tokens"] = json!(oracle.prompt_tokens);
            value["oracle_cached_tokens"] = json!(oracle.hit_tokens);
            value["fleet_capacity_tokens"] =
                json!(oracle.fleet.as_ref().map(|f| f.capacity_tokens));
        }
        value
    }

    /// A human-readable summary, several lines.
    pub fn summary(&self) -> String {
        let opt = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1} ms"));
        let mut out = String::new();
        let _ = writeln!(
            out,
            "requests {} (ok {}, errors {}) of {} sent in {:.2} s: {:.2} req/s",
            self.requests,
            self.ok,
            self.errors,
            self.sent,
            self.elapsed.as_secs_f64(),
            self.throughput_rps
        );
        let _ = writeln!(
            out,
            "ttft p50 {}, p99 {}, mean {}; latency p50 {}, p99 {}",
            opt(self.ttft_p50_ms),
            opt(self.ttft_p99_ms),
            opt(self.ttft_mean_ms),
            opt(self.latency_p50_ms),
            opt(self.latency_p99_ms)
        );
        let _ = writeln!(
            out,
            "cache hit rate {:.3} ({} cached of {} prompt tokens), {} completion tokens",
            self.cache_hit_rate, self.cached_tokens, self.prompt_tokens, self.completion_tokens
        );
        if let Some(oracle) = &self.oracle {
            let rate = |r: Option<f64>| r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.3}"));
            let fleet = match &oracle.fleet {
                Some(fleet) => format!(
                    ", fleet oracle {} (one LRU cache of {} tokens)",
                    rate(oracle.fleet_hit_rate()),
                    fleet.capacity_tokens
                ),
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "oracle hit rate {} (one unlimited cache){fleet}, over {} prompt tokens sent",
                rate(oracle.hit_rate()),
                oracle.prompt_tokens
            );
        }
        if self.engine_share.is_empty() {
            let _ = writeln!(out, "engine share: no x-router-engine header seen");
        } else {
            let shares: Vec<String> = self
                .engine_share
                .iter()
                .map(|(engine, share)| format!("{engine} {share:.3}"))
                .collect();
            let _ = writeln!(out, "engine share: {}", shares.join(", "));
        }
        if !self.error_kinds.is_empty() {
            let kinds: Vec<String> =
                self.error_kinds.iter().map(|(k, n)| format!("{k} x{n}")).collect();
            let _ = writeln!(out, "errors: {}", kinds.join(", "));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(ttft_ms: u64, prompt: u64, cached: u64, engine: Option<&str>) -> Outcome {
        Outcome {
            ttft: Some(Duration::from_millis(ttft_ms)),
            latency: Duration::from_millis(ttft_ms * 2),
            prompt_tokens: Some(prompt),
            cached_tokens: Some(cached),
            completion_tokens: Some(4),
            engine: engine.map(str::to_owned),
            ..Outcome::default()
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(50.0));
        assert_eq!(percentile(&values, 99.0), Some(99.0));
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn report_counts_hits_shares_and_errors() {
        let outcomes = vec![
            ok(10, 100, 0, Some("e1")),
            ok(20, 100, 50, Some("e2")),
            ok(30, 200, 150, Some("e1")),
            Outcome {
                error: Some("status_500".into()),
                engine: Some("e2".into()),
                ..Outcome::default()
            },
        ];
        let report = Report::new(&outcomes, Duration::from_secs(2), 5, None);
        assert_eq!((report.sent, report.requests, report.ok, report.errors), (5, 4, 3, 1));
        assert_eq!(report.throughput_rps, 1.5);
        assert_eq!(report.cache_hit_rate, 200.0 / 400.0);
        assert_eq!(report.ttft_p50_ms, Some(20.0));
        assert_eq!(report.ttft_p99_ms, Some(30.0));
        assert_eq!(report.engine_share["e1"], 0.5);
        assert_eq!(report.engine_share["e2"], 0.5);
        let json = report.to_json();
        for key in [
            "sent",
            "requests",
            "errors",
            "throughput_rps",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "cache_hit_rate",
            "engine_share",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
        assert!(json.get("oracle_hit_rate").is_none(), "sessions have no oracle");
        assert!(json.get("oracle_fleet_hit_rate").is_none());
        assert_eq!(json["error_kinds"]["status_500"], 1);
        assert!(report.summary().contains("errors: status_500 x1"));
        assert!(report.summary().contains("of 5 sent"));
    }

    #[test]
    fn no_header_means_empty_share() {
        let report = Report::new(&[ok(1, 10, 0, None)], Duration::from_secs(1), 1, None);
        assert!(report.engine_share.is_empty());
        assert_eq!(report.to_json()["engine_share"], json!({}));
    }

    #[test]
    fn trace_replays_print_the_oracles_beside_the_measured_rate() {
        let oracle = OracleReport { prompt_tokens: 40, hit_tokens: 10, fleet: None };
        let report =
            Report::new(&[ok(1, 40, 8, None)], Duration::from_secs(1), 1, Some(oracle.clone()));
        let json = report.to_json();
        assert_eq!(json["cache_hit_rate"], json!(0.2));
        assert_eq!(json["oracle_hit_rate"], json!(0.25));
        assert_eq!(json["oracle_fleet_hit_rate"], Value::Null, "null without a fleet capacity");
        assert_eq!(json["oracle_prompt_tokens"], json!(40));
        let summary = report.summary();
        assert!(summary.contains("cache hit rate 0.200"), "{summary}");
        assert!(summary.contains("oracle hit rate 0.250 (one unlimited cache), over 40"));

        let fleet = crate::load::FleetOracle { capacity_tokens: 4096, hit_tokens: 6 };
        let oracle = OracleReport { fleet: Some(fleet), ..oracle };
        let report = Report::new(&[ok(1, 40, 8, None)], Duration::from_secs(1), 1, Some(oracle));
        assert_eq!(report.to_json()["oracle_fleet_hit_rate"], json!(0.15));
        assert_eq!(report.to_json()["fleet_capacity_tokens"], json!(4096));
        assert!(report.summary().contains("fleet oracle 0.150 (one LRU cache of 4096 tokens)"));
    }
}
