//! The generator's measurements: counts, throughput, time to first token, cache hit rate
//! from usage, per-engine share of requests and of uncached prompt tokens, and for trace
//! replays the oracle hit rates and the other bounds beside the measured ones; as text and as
//! one JSON object.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use super::client::Outcome;
use super::distribution::{Distribution, percentile};
use super::trace::ReplayReport;

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunReport {
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
    /// 90th percentile of the same.
    pub ttft_p90_ms: Option<f64>,
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
    /// Engine id (every engine of `engine_requests`) -> `prompt_tokens - cached_tokens` summed
    /// over its successful requests that reported usage.
    pub engine_uncached_tokens: BTreeMap<String, u64>,
    /// Engine id -> its fraction of those tokens; empty when there are none.
    pub engine_uncached_share: BTreeMap<String, f64>,
    /// The largest uncached share times the number of engines (1: even prefill work);
    /// `None` without any share.
    pub uncached_share_max_over_mean: Option<f64>,
    /// Session turns: the fraction of successful turns that named their engine and were
    /// served by their session's engine (the engine that served most of the session's
    /// turns, the first such on a tie); `None` without any such turn.
    pub session_engine_agreement: Option<f64>,
    /// Trace replays: the oracles and the other bounds over the requests sent.
    pub replay: Option<ReplayReport>,
}

/// The fraction of successful, engine-naming session turns served by their session's engine.
fn session_engine_agreement(outcomes: &[Outcome]) -> Option<f64> {
    let mut by_session: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for outcome in outcomes.iter().filter(|o| o.error.is_none()) {
        if let (Some(session), Some(engine)) = (&outcome.session, &outcome.engine) {
            by_session.entry(session).or_default().push(engine);
        }
    }
    let (mut agreeing, mut turns) = (0usize, 0usize);
    for engines in by_session.values() {
        let mut counts: Vec<(&str, usize)> = Vec::new();
        for engine in engines {
            match counts.iter_mut().find(|(e, _)| e == engine) {
                Some((_, n)) => *n += 1,
                None => counts.push((engine, 1)),
            }
        }
        // The first engine with the most turns.
        let most = counts.iter().fold(0, |best, &(_, n)| best.max(n));
        agreeing += most;
        turns += engines.len();
    }
    (turns > 0).then(|| agreeing as f64 / turns as f64)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl RunReport {
    /// Builds the report of `outcomes` over `elapsed`, of `sent` requests.
    pub(crate) fn new(
        outcomes: &[Outcome],
        elapsed: Duration,
        sent: u64,
        replay: Option<ReplayReport>,
    ) -> Self {
        let mut report = RunReport { elapsed, sent, replay, ..RunReport::default() };
        let mut ttfts = Vec::new();
        let mut latencies = Vec::new();
        for outcome in outcomes {
            report.requests += 1;
            if let Some(engine) = &outcome.engine {
                *report.engine_requests.entry(engine.clone()).or_default() += 1;
                report.engine_uncached_tokens.entry(engine.clone()).or_default();
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
                let cached = outcome.cached_tokens.unwrap_or(0);
                report.prompt_tokens += prompt;
                report.cached_tokens += cached;
                if let Some(engine) = &outcome.engine {
                    *report.engine_uncached_tokens.entry(engine.clone()).or_default() +=
                        prompt.saturating_sub(cached);
                }
            }
            report.completion_tokens += outcome.completion_tokens.unwrap_or(0);
        }
        ttfts.sort_by(f64::total_cmp);
        latencies.sort_by(f64::total_cmp);
        report.ttft_p50_ms = percentile(&ttfts, 50.0);
        report.ttft_p90_ms = percentile(&ttfts, 90.0);
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
        report.session_engine_agreement = session_engine_agreement(outcomes);
        let uncached: u64 = report.engine_uncached_tokens.values().sum();
        if uncached > 0 {
            report.engine_uncached_share = report
                .engine_uncached_tokens
                .iter()
                .map(|(engine, n)| (engine.clone(), *n as f64 / uncached as f64))
                .collect();
            let max = report.engine_uncached_share.values().copied().fold(0.0, f64::max);
            report.uncached_share_max_over_mean =
                Some(max * report.engine_uncached_share.len() as f64);
        }
        report
    }

    /// The JSON object `--json` prints last. Its keys `sent`, `requests`, `errors`,
    /// `throughput_rps`, `ttft_p50_ms`, `ttft_p99_ms`, `cache_hit_rate`, `engine_share` (and
    /// for a trace replay `oracle_hit_rate`, `oracle_fleet_hit_rate`, `oracle_prompt_tokens`,
    /// `oracle_cached_tokens`, `fleet_capacity_tokens`) are a contract; latencies without any
    /// sample are `null`, and so is `oracle_fleet_hit_rate` without `--fleet-capacity-tokens`.
    /// A trace replay adds `time_scale` and `bounds`: `hit_rate_unlimited`,
    /// `hit_rate_fleet_lru`, `hit_rate_belady`, `ttft_floor_ms` (`mean`, `p50`, `p90`, `p99`)
    /// and `offered_load`, each `null` when what it needs is missing.
    pub fn to_json(&self) -> Value {
        let mut value = json!({
            "sent": self.sent,
            "requests": self.requests,
            "errors": self.errors,
            "ok": self.ok,
            "throughput_rps": self.throughput_rps,
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p90_ms": self.ttft_p90_ms,
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
            "engine_uncached_tokens": self.engine_uncached_tokens,
            "engine_uncached_share": self.engine_uncached_share,
            "uncached_share_max_over_mean": self.uncached_share_max_over_mean,
            "error_kinds": self.error_kinds,
            "session_engine_agreement": self.session_engine_agreement,
        });
        if let Some(replay) = &self.replay {
            let oracle = &replay.oracle;
            value["oracle_hit_rate"] = json!(oracle.hit_rate());
            value["oracle_fleet_hit_rate"] = json!(oracle.fleet_hit_rate());
            value["oracle_prompt_tokens"] = json!(oracle.prompt_tokens);
            value["oracle_cached_tokens"] = json!(oracle.hit_tokens);
            value["fleet_capacity_tokens"] =
                json!(oracle.fleet.as_ref().map(|f| f.capacity_tokens));
            value["time_scale"] = json!(replay.schedule.time_scale);
            value["bounds"] = json!({
                "hit_rate_unlimited": oracle.hit_rate(),
                "hit_rate_fleet_lru": oracle.fleet_hit_rate(),
                "hit_rate_belady": oracle.belady_hit_rate(),
                "ttft_floor_ms": replay.ttft_floor_ms.map(Distribution::to_json),
                "offered_load": replay.offered_load,
            });
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
            "ttft p50 {}, p90 {}, p99 {}, mean {}; latency p50 {}, p99 {}",
            opt(self.ttft_p50_ms),
            opt(self.ttft_p90_ms),
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
        if let Some(replay) = &self.replay {
            let oracle = &replay.oracle;
            let rate = |r: Option<f64>| r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.3}"));
            if let Some(scaled) = &replay.schedule.scaled {
                let _ = writeln!(
                    out,
                    "offered load {:.2}: time scale {:.2} (uncached work {} tokens over {:.1} s of trace)",
                    scaled.offered_load,
                    replay.schedule.time_scale,
                    scaled.uncached_tokens,
                    scaled.span_secs
                );
            }
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
            let floor = replay.ttft_floor_ms.map_or_else(
                || "n/a".to_owned(),
                |f| format!("p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms", f.p50, f.p90, f.p99),
            );
            let _ = writeln!(
                out,
                "bounds: hit rate unlimited {}, fleet LRU {}, Belady {}; ttft floor {floor}; offered load {}",
                rate(oracle.hit_rate()),
                rate(oracle.fleet_hit_rate()),
                rate(oracle.belady_hit_rate()),
                rate(replay.offered_load)
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
            let imbalance = self
                .uncached_share_max_over_mean
                .map_or_else(String::new, |r| format!("; uncached share max/mean {r:.3}"));
            let _ = writeln!(out, "engine share: {}{imbalance}", shares.join(", "));
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
    use crate::load::{FleetOracle, OracleReport, ScaledLoad, Schedule};

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
    fn session_engine_agreement_counts_turns_on_the_sessions_engine() {
        let turn = |session: &str, engine: &str| Outcome {
            session: Some(session.to_owned()),
            ..ok(1, 10, 0, Some(engine))
        };
        let failed = Outcome {
            session: Some("s1".to_owned()),
            error: Some("connect".to_owned()),
            ..Outcome::default()
        };
        // s1: 3 of 4 on e1; s2: 2 of 2 on e2; a failure and a trace request do not count.
        let outcomes = vec![
            turn("s1", "e1"),
            turn("s1", "e2"),
            turn("s1", "e1"),
            turn("s1", "e1"),
            turn("s2", "e2"),
            turn("s2", "e2"),
            failed,
            ok(1, 10, 0, Some("e3")),
        ];
        let report = RunReport::new(&outcomes, Duration::from_secs(1), 8, None);
        assert_eq!(report.session_engine_agreement, Some(5.0 / 6.0));
        assert_eq!(report.to_json()["session_engine_agreement"], 5.0 / 6.0);
        let none = RunReport::new(&[ok(1, 10, 0, Some("e1"))], Duration::from_secs(1), 1, None);
        assert_eq!(none.session_engine_agreement, None);
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
        let report = RunReport::new(&outcomes, Duration::from_secs(2), 5, None);
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
        let report = RunReport::new(&[ok(1, 10, 0, None)], Duration::from_secs(1), 1, None);
        assert!(report.engine_share.is_empty());
        assert_eq!(report.to_json()["engine_share"], json!({}));
    }

    #[test]
    fn trace_replays_print_the_oracles_beside_the_measured_rate() {
        let oracle = OracleReport { prompt_tokens: 40, hit_tokens: 10, fleet: None };
        let replay = ReplayReport {
            oracle: oracle.clone(),
            schedule: Schedule { time_scale: 2.5, scaled: None },
            ..ReplayReport::default()
        };
        let report = RunReport::new(&[ok(1, 40, 8, None)], Duration::from_secs(1), 1, Some(replay));
        let json = report.to_json();
        assert_eq!(json["cache_hit_rate"], json!(0.2));
        assert_eq!(json["oracle_hit_rate"], json!(0.25));
        assert_eq!(json["oracle_fleet_hit_rate"], Value::Null, "null without a fleet capacity");
        assert_eq!(json["oracle_prompt_tokens"], json!(40));
        assert_eq!(json["time_scale"], json!(2.5));
        let bounds = &json["bounds"];
        assert_eq!(bounds["hit_rate_unlimited"], json!(0.25));
        for key in ["hit_rate_fleet_lru", "hit_rate_belady", "ttft_floor_ms", "offered_load"] {
            assert_eq!(bounds[key], Value::Null, "{key} needs flags not given");
        }
        let summary = report.summary();
        assert!(summary.contains("cache hit rate 0.200"), "{summary}");
        assert!(summary.contains("oracle hit rate 0.250 (one unlimited cache), over 40"));
        assert!(!summary.contains("offered load 0"), "an explicit time scale: {summary}");

        let fleet = FleetOracle { capacity_tokens: 4096, hit_tokens: 6, belady_hit_tokens: 8 };
        let replay = ReplayReport {
            oracle: OracleReport { fleet: Some(fleet), ..oracle },
            schedule: Schedule {
                time_scale: 12.5,
                scaled: Some(ScaledLoad {
                    offered_load: 0.8,
                    uncached_tokens: 30,
                    span_secs: 60.0,
                }),
            },
            ttft_floor_ms: Distribution::of(vec![3.0, 1.0, 2.0]),
            offered_load: Some(0.8),
        };
        let report = RunReport::new(&[ok(1, 40, 8, None)], Duration::from_secs(1), 1, Some(replay));
        let json = report.to_json();
        assert_eq!(json["oracle_fleet_hit_rate"], json!(0.15));
        assert_eq!(json["fleet_capacity_tokens"], json!(4096));
        assert_eq!(json["bounds"]["hit_rate_fleet_lru"], json!(0.15));
        assert_eq!(json["bounds"]["hit_rate_belady"], json!(0.2));
        assert_eq!(
            json["bounds"]["ttft_floor_ms"],
            json!({ "mean": 2.0, "p50": 2.0, "p90": 3.0, "p99": 3.0 })
        );
        assert_eq!(json["bounds"]["offered_load"], json!(0.8));
        let summary = report.summary();
        assert!(summary.contains("fleet oracle 0.150 (one LRU cache of 4096 tokens)"));
        assert!(
            summary.contains(
                "offered load 0.80: time scale 12.50 (uncached work 30 tokens over 60.0 s of trace)"
            ),
            "{summary}"
        );
        assert!(
            summary.contains(
                "bounds: hit rate unlimited 0.250, fleet LRU 0.150, Belady 0.200; ttft floor p50 2.0 ms, p90 3.0 ms, p99 3.0 ms; offered load 0.800"
            ),
            "{summary}"
        );
    }

    #[test]
    fn uncached_tokens_are_shared_by_the_engines_that_prefilled_them() {
        let outcomes = vec![
            ok(10, 100, 20, Some("e1")),
            ok(20, 100, 100, Some("e2")),
            ok(30, 300, 100, Some("e1")),
            ok(40, 120, 0, Some("e3")),
            Outcome {
                error: Some("connect".into()),
                engine: Some("e4".into()),
                ..Outcome::default()
            },
        ];
        let report = RunReport::new(&outcomes, Duration::from_secs(1), 5, None);
        // e1: 80 + 200, e2: 0, e3: 120, e4 (failed only): 0; of 400.
        let tokens: Vec<_> = report.engine_uncached_tokens.values().copied().collect();
        assert_eq!(tokens, [280, 0, 120, 0]);
        assert_eq!(report.engine_uncached_share["e1"], 0.7);
        assert_eq!(report.engine_uncached_share["e4"], 0.0);
        assert_eq!(report.uncached_share_max_over_mean, Some(0.7 * 4.0));
        assert_eq!(report.ttft_p90_ms, Some(40.0));
        let json = report.to_json();
        assert_eq!(json["ttft_p90_ms"], json!(40.0));
        assert_eq!(json["engine_uncached_tokens"]["e3"], json!(120));
        assert_eq!(json["engine_uncached_share"]["e3"], json!(0.3));
        assert_eq!(json["uncached_share_max_over_mean"], json!(2.8));
        assert!(report.summary().contains("ttft p50 20.0 ms, p90 40.0 ms, p99 40.0 ms"));
        assert!(report.summary().contains("uncached share max/mean 2.800"));

        let none = RunReport::new(&[ok(1, 10, 0, None)], Duration::from_secs(1), 1, None);
        assert!(none.engine_uncached_tokens.is_empty());
        assert_eq!(none.to_json()["uncached_share_max_over_mean"], Value::Null);
    }
}
