//! One worker's `/v1/loads` polling, for SGLang engines as released today.
//!
//! `GET {url}/v1/loads?include=core` answers `{"timestamp", "version", "loads": [rank, ...]}`
//! (a bare array of ranks is accepted too), one object per data-parallel rank with
//! `dp_rank`, `num_running_reqs`, `num_waiting_reqs`, `num_used_tokens`,
//! `max_total_num_tokens` (required) and `num_waiting_uncached_tokens`, `num_total_tokens`,
//! `max_running_requests` (the native gauges), `gen_throughput` (output tokens per second over
//! the rank's requests, the decode speed's source), plus, when an engine adds them,
//! `total_prefill_uncached_tokens`, `total_prefill_busy_us` and `estimated_prefill_queue_ms`.
//! Other fields are ignored. Polled reports have instance id 0 and a local sequence; the
//! engine's timestamps are not used (the numbers count as captured on receipt).

use std::time::Duration;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::TaskContext;
use super::engine_http::{self, Get, PollError};
use crate::{EngineStatus, MissingReason, RankSample, RejectReason, Report, ReportKind};

/// The polling task of one worker; returns when `cancel` fires.
pub(crate) async fn run(ctx: TaskContext, interval: Duration, cancel: CancellationToken) {
    let uri = match engine_http::uri(ctx.worker.url(), "/v1/loads?include=core") {
        Ok(uri) => uri,
        Err(error) => {
            tracing::error!(worker = %ctx.worker.id(), error = &error as &dyn std::error::Error, "load polling disabled");
            ctx.mark_missing(MissingReason::PollFailed);
            cancel.cancelled().await;
            return;
        }
    };
    let client = engine_http::http_client(ctx.config.tls.as_deref());
    let authorization = ctx.worker.api_key().map(|key| key.authorization().clone());
    let get = Get {
        accept: "application/json",
        authorization: authorization.as_ref(),
        max_bytes: ctx.config.max_report_bytes,
        timeout: ctx.config.poll_timeout.min(interval).max(Duration::from_millis(1)),
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (worker, incarnation) = (ctx.worker.id(), ctx.worker.incarnation());
    let mut sequence = 0u64;
    let mut failing = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let fetched = tokio::select! {
            () = cancel.cancelled() => return,
            fetched = engine_http::fetch(&client, uri.clone(), get) => fetched,
        };
        match fetched {
            Ok(body) => {
                failing = false;
                match parse_v1_loads(&body) {
                    Ok(ranks) => {
                        sequence += 1;
                        let report = Report {
                            engine_id: worker.to_string(),
                            instance_id: 0,
                            sequence,
                            kind: ReportKind::Native,
                            status: EngineStatus::Unknown,
                            dp_size: ctx.worker.dp_size(),
                            interval: Some(interval),
                            ranks,
                        };
                        let _ = ctx.apply(report);
                    }
                    Err(reason) => ctx.table.reject(worker, incarnation, reason),
                }
            }
            Err(PollError::TooLarge(_)) => {
                ctx.table.reject(worker, incarnation, RejectReason::TooLarge);
            }
            Err(error) => {
                ctx.mark_missing(MissingReason::PollFailed);
                if !failing {
                    failing = true;
                    tracing::warn!(worker = %worker, %uri, error = &error as &dyn std::error::Error, "load poll failed");
                }
            }
        }
    }
}

/// Parses a `/v1/loads` body into one sample per rank entry, in the order given. Negative,
/// fractional or out-of-range numbers are [`RejectReason::AbsurdValue`]; anything else that does
/// not fit (bad JSON, missing required fields, wrong types) is [`RejectReason::Malformed`].
/// Completeness against the engine's `dp_size` is the table's check.
pub fn parse_v1_loads(body: &[u8]) -> Result<Vec<RankSample>, RejectReason> {
    let value: Value = serde_json::from_slice(body).map_err(|_| RejectReason::Malformed)?;
    let loads = match &value {
        Value::Array(loads) => loads,
        Value::Object(top) => {
            top.get("loads").and_then(Value::as_array).ok_or(RejectReason::Malformed)?
        }
        _ => return Err(RejectReason::Malformed),
    };
    loads.iter().map(parse_rank).collect()
}

fn parse_rank(value: &Value) -> Result<RankSample, RejectReason> {
    let obj = value.as_object().ok_or(RejectReason::Malformed)?;
    let required = |key| count(obj, key)?.ok_or(RejectReason::Malformed);
    Ok(RankSample {
        dp_rank: u32::try_from(required("dp_rank")?).map_err(|_| RejectReason::AbsurdValue)?,
        age: Duration::ZERO,
        running_requests: required("num_running_reqs")?,
        waiting_requests: required("num_waiting_reqs")?,
        kv_used_tokens: required("num_used_tokens")?,
        kv_capacity_tokens: required("max_total_num_tokens")?,
        waiting_uncached_tokens: count(obj, "num_waiting_uncached_tokens")?,
        total_kv_tokens: count(obj, "num_total_tokens")?,
        max_running_requests: count(obj, "max_running_requests")?,
        total_prefill_uncached_tokens: count(obj, "total_prefill_uncached_tokens")?,
        total_prefill_busy_us: count(obj, "total_prefill_busy_us")?,
        estimated_prefill_queue_ms: number(obj, "estimated_prefill_queue_ms")?,
        decode_tokens_per_sec: number(obj, "gen_throughput")?,
    })
}

/// A number field, left for the table to judge; absent or null is `None`.
fn number(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>, RejectReason> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(RejectReason::Malformed),
    }
}

/// A non-negative integer field; absent or null is `None`.
fn count(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, RejectReason> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            if let Some(v) = n.as_u64() {
                return Ok(Some(v));
            }
            // Integral floats (`12.0`) are accepted; negatives and fractions are not counts.
            let f = n.as_f64().ok_or(RejectReason::Malformed)?;
            if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f < 9_007_199_254_740_992.0 {
                let v = f as u64;
                Ok(Some(v))
            } else {
                Err(RejectReason::AbsurdValue)
            }
        }
        Some(_) => Err(RejectReason::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sglang_core_response() {
        let body = br#"{"timestamp": "2026-08-06T09:15:23.481920+00:00", "version": "0.5.4",
            "loads": [
              {"dp_rank": 1, "num_running_reqs": 19, "num_waiting_reqs": 0,
               "num_waiting_uncached_tokens": 0, "num_used_tokens": 291044,
               "num_total_tokens": 291044, "max_total_num_tokens": 524288,
               "max_running_requests": 256, "token_usage": 0.5551, "gen_throughput": 1521.08,
               "cache_hit_rate": 0.713, "utilization": 0.0, "memory": null},
              {"dp_rank": 0, "num_running_reqs": 24, "num_waiting_reqs": 3,
               "num_waiting_uncached_tokens": 6144, "num_used_tokens": 382910,
               "num_total_tokens": 401294, "max_total_num_tokens": 524288,
               "max_running_requests": 256}
            ]}"#;
        let ranks = parse_v1_loads(body).expect("valid");
        assert_eq!(ranks.len(), 2);
        assert_eq!(
            ranks[1],
            RankSample::basic(0, 24, 3, 382_910, 524_288).with_native(6144, 401_294, 256)
        );
        assert_eq!(ranks[0].dp_rank, 1);
        assert_eq!(ranks[0].decode_tokens_per_sec, Some(1521.08), "gen_throughput");
    }

    #[test]
    fn accepts_a_bare_array_and_integral_floats_and_missing_native_fields() {
        let body = br#"[{"dp_rank": 0, "num_running_reqs": 2.0, "num_waiting_reqs": 1,
            "num_used_tokens": 10, "max_total_num_tokens": 100}]"#;
        let ranks = parse_v1_loads(body).expect("valid");
        assert_eq!(ranks, vec![RankSample::basic(0, 2, 1, 10, 100)]);
    }

    #[test]
    fn rejects_negative_fractional_and_malformed_input() {
        let rank = |field: &str| {
            format!(
                r#"{{"loads": [{{"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 1,
                "num_used_tokens": 1, "max_total_num_tokens": 1, {field}}}]}}"#
            )
        };
        let absurd = [
            r#""num_waiting_uncached_tokens": -5"#,
            r#""num_total_tokens": 1.5"#,
            r#""max_running_requests": 1e300"#,
        ];
        for field in absurd {
            assert_eq!(
                parse_v1_loads(rank(field).as_bytes()),
                Err(RejectReason::AbsurdValue),
                "{field}"
            );
        }
        let malformed = [
            rank(r#""num_total_tokens": "12""#),
            rank(r#""estimated_prefill_queue_ms": NaN"#),
            rank(r#""gen_throughput": "fast""#),
            r#"{"loads": [{"dp_rank": 0}]}"#.to_owned(),
            r#"{"version": "0.5"}"#.to_owned(),
            "[1, 2]".to_owned(),
            "not json".to_owned(),
            "42".to_owned(),
        ];
        for body in malformed {
            assert_eq!(parse_v1_loads(body.as_bytes()), Err(RejectReason::Malformed), "{body}");
        }
    }
}
