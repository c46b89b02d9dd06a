//! vLLM's load as its Prometheus `GET /metrics` states it, mapped to a BASIC report.
//!
//! vLLM (v1 engine) labels every load gauge with `model_name` and `engine`, the data-parallel
//! engine index (`engine="0"` for a single engine). Per engine it reads:
//!
//! | series | becomes |
//! |---|---|
//! | `vllm:num_requests_running` | running requests |
//! | `vllm:num_requests_waiting` | waiting requests |
//! | `vllm:kv_cache_usage_perc` (older: `vllm:gpu_cache_usage_perc`), a fraction 0..1 | KV used tokens: the fraction of the capacity |
//! | `vllm:cache_config_info` labels `kv_cache_size_tokens`, else `num_gpu_blocks` x `block_size` | KV capacity tokens (0, unknown, when it has neither) |
//! | `process_start_time_seconds` (no labels) | the instance id: the start time in milliseconds |
//!
//! The first three are required for every engine any of them names; a missing one, a count
//! that is negative, fractional, NaN or infinite, or a fraction outside 0..1 refuses the whole
//! scrape (never read as zero). The engines found, in ascending `engine` order, are ranks
//! `0..n`: a single engine, or the one rank an external-load-balancer API server fronts
//! (`engine="3"`), is rank 0. Whether `n` is the worker's `dp_size` is the table's check.
//! `process_start_time_seconds` is absent when vLLM runs several API server processes (its
//! multiprocess registry has no process collector): then there is no instance id.

use std::collections::BTreeMap;

use super::prometheus::{self, PromSample, PrometheusError};
use crate::{RankSample, RejectReason};

/// Running requests per engine.
pub(crate) const RUNNING: &str = "vllm:num_requests_running";
/// Waiting requests per engine.
pub(crate) const WAITING: &str = "vllm:num_requests_waiting";
/// KV-cache usage per engine, 1 meaning full.
pub(crate) const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
/// The same before vLLM renamed it.
pub(crate) const KV_USAGE_OLD: &str = "vllm:gpu_cache_usage_perc";
/// The cache configuration as labels of a gauge set to 1, per engine.
pub(crate) const CACHE_CONFIG: &str = "vllm:cache_config_info";
/// The start time of the process serving `/metrics`, in seconds since the epoch.
pub(crate) const PROCESS_START: &str = "process_start_time_seconds";

/// Largest `engine` label value taken as a rank index; beyond it the label is nonsense.
const MAX_ENGINE: u32 = 1 << 16;
/// Counts at or beyond 2^53 have no exact float; real ones are far below.
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;
/// Process start times beyond this (the year 5138) are not times.
const MAX_START_SECS: f64 = 1e11;
/// A usage fraction this far above 1 is float noise, read as 1.
const USAGE_SLACK: f64 = 1e-6;

/// What one scrape of vLLM's `/metrics` says about its load.
#[derive(Clone, Debug, PartialEq)]
pub struct VllmMetrics {
    /// The process serving `/metrics`, from `process_start_time_seconds` (its start in
    /// milliseconds since the epoch, at least 1); a restart changes it. `None` when the scrape
    /// has no such series.
    pub instance_id: Option<u64>,
    /// The `engine` label values found, ascending; the engine at position `r` is rank `r`.
    pub engines: Vec<u32>,
    /// One BASIC sample per engine, in rank order.
    pub ranks: Vec<RankSample>,
}

/// Why a `/metrics` body gives no vLLM load.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum VllmMetricsError {
    /// A line of a needed series does not fit the text format.
    #[error("not Prometheus text")]
    Syntax(#[source] PrometheusError),
    /// None of vLLM's load series is in the body: not a vLLM engine (or not one of its
    /// versions with the `vllm:` series).
    #[error("no vLLM load series ({RUNNING}, {WAITING}, {KV_USAGE})")]
    NotVllm,
    /// An engine lacks one of the required series.
    #[error("engine {engine} has no {series} sample")]
    MissingSeries {
        /// The engine index.
        engine: u32,
        /// The series it lacks.
        series: &'static str,
    },
    /// A series is sampled twice for one engine (or the process start twice).
    #[error("{series} sampled twice for engine {engine}")]
    Duplicate {
        /// The series.
        series: &'static str,
        /// The engine index (0 for the process start).
        engine: u32,
    },
    /// An `engine` label that is no engine index.
    #[error("{series} has engine label {value:?}, not an engine index")]
    BadEngine {
        /// The series.
        series: &'static str,
        /// The label value.
        value: String,
    },
    /// A value no engine states: a negative, fractional, NaN or infinite count, a usage
    /// fraction outside 0..1, a process start time that is no time.
    #[error("{series} is {value} for engine {engine}, which is no {expected}")]
    Absurd {
        /// The series.
        series: &'static str,
        /// The engine index (0 for the process start).
        engine: u32,
        /// The value stated.
        value: f64,
        /// What it should have been.
        expected: &'static str,
    },
}

impl VllmMetricsError {
    /// How the load table counts the refusal: [`RejectReason::AbsurdValue`] for nonsense
    /// values, [`RejectReason::Malformed`] for everything else.
    pub fn reject_reason(&self) -> RejectReason {
        match self {
            VllmMetricsError::Absurd { .. } => RejectReason::AbsurdValue,
            _ => RejectReason::Malformed,
        }
    }
}

/// The series this module reads.
fn wanted(name: &str) -> bool {
    matches!(name, RUNNING | WAITING | KV_USAGE | KV_USAGE_OLD | CACHE_CONFIG | PROCESS_START)
}

/// Reads vLLM's load from a `/metrics` body (Prometheus text format 0.0.4).
pub fn parse_vllm_metrics(body: &[u8]) -> Result<VllmMetrics, VllmMetricsError> {
    let samples = prometheus::parse(body, wanted).map_err(VllmMetricsError::Syntax)?;
    let mut engines: BTreeMap<u32, Engine> = BTreeMap::new();
    let mut capacities: BTreeMap<u32, u64> = BTreeMap::new();
    let mut start: Option<f64> = None;
    for sample in &samples {
        let series = match sample.name {
            RUNNING => RUNNING,
            WAITING => WAITING,
            KV_USAGE => KV_USAGE,
            KV_USAGE_OLD => KV_USAGE_OLD,
            CACHE_CONFIG => {
                let engine = engine_of(CACHE_CONFIG, sample)?;
                // The first series of an engine counts; `None` labels (before the cache is
                // sized) leave the capacity unknown.
                if let Some(capacity) = capacity_of(sample) {
                    capacities.entry(engine).or_insert(capacity);
                }
                continue;
            }
            _ => {
                if start.replace(sample.value).is_some() {
                    return Err(VllmMetricsError::Duplicate { series: PROCESS_START, engine: 0 });
                }
                continue;
            }
        };
        let engine = engine_of(series, sample)?;
        let slot = engines.entry(engine).or_default().slot(series);
        if slot.replace(sample.value).is_some() {
            return Err(VllmMetricsError::Duplicate { series, engine });
        }
    }
    if engines.is_empty() {
        return Err(VllmMetricsError::NotVllm);
    }
    let instance_id = start.map(instance_of).transpose()?;
    let mut ranks = Vec::with_capacity(engines.len());
    for (rank, (&engine, values)) in engines.iter().enumerate() {
        // At most MAX_ENGINE + 1 engines, so every rank fits.
        let rank = u32::try_from(rank).unwrap_or(u32::MAX);
        let missing = |series| VllmMetricsError::MissingSeries { engine, series };
        let running = count(RUNNING, engine, values.running.ok_or_else(|| missing(RUNNING))?)?;
        let waiting = count(WAITING, engine, values.waiting.ok_or_else(|| missing(WAITING))?)?;
        let (usage_series, usage) = match (values.usage, values.usage_old) {
            (Some(usage), _) => (KV_USAGE, usage),
            (None, Some(usage)) => (KV_USAGE_OLD, usage),
            (None, None) => return Err(missing(KV_USAGE)),
        };
        let usage = fraction(usage_series, engine, usage)?;
        let capacity = capacities.get(&engine).copied().unwrap_or(0);
        let used = (usage * capacity as f64).round() as u64;
        ranks.push(RankSample::basic(rank, running, waiting, used.min(capacity), capacity));
    }
    Ok(VllmMetrics { instance_id, engines: engines.into_keys().collect(), ranks })
}

/// One engine's values of the load series.
#[derive(Debug, Default)]
struct Engine {
    running: Option<f64>,
    waiting: Option<f64>,
    usage: Option<f64>,
    usage_old: Option<f64>,
}

impl Engine {
    fn slot(&mut self, series: &str) -> &mut Option<f64> {
        match series {
            RUNNING => &mut self.running,
            WAITING => &mut self.waiting,
            KV_USAGE => &mut self.usage,
            _ => &mut self.usage_old,
        }
    }
}

/// The sample's engine index; a sample without the label is engine 0 (vLLM before the v1
/// engine labelled only `model_name`).
fn engine_of(series: &'static str, sample: &PromSample<'_>) -> Result<u32, VllmMetricsError> {
    let Some(value) = sample.label("engine") else { return Ok(0) };
    value
        .parse::<u32>()
        .ok()
        .filter(|engine| *engine <= MAX_ENGINE && value.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| VllmMetricsError::BadEngine { series, value: value.to_owned() })
}

/// KV capacity in tokens from `vllm:cache_config_info`'s labels, when they state it.
fn capacity_of(sample: &PromSample<'_>) -> Option<u64> {
    let number = |label| sample.label(label).and_then(|v| v.parse::<u64>().ok()).filter(|n| *n > 0);
    number("kv_cache_size_tokens")
        .or_else(|| number("num_gpu_blocks")?.checked_mul(number("block_size")?))
}

/// A gauge that counts: finite, non-negative, integral.
fn count(series: &'static str, engine: u32, value: f64) -> Result<u64, VllmMetricsError> {
    if value.is_finite() && value >= 0.0 && value.fract() == 0.0 && value < MAX_EXACT {
        Ok(value as u64)
    } else {
        Err(VllmMetricsError::Absurd { series, engine, value, expected: "count" })
    }
}

/// A usage fraction in 0..1 (float noise just above 1 read as 1).
fn fraction(series: &'static str, engine: u32, value: f64) -> Result<f64, VllmMetricsError> {
    if (0.0..=1.0 + USAGE_SLACK).contains(&value) {
        Ok(value.min(1.0))
    } else {
        Err(VllmMetricsError::Absurd { series, engine, value, expected: "fraction of 0..1" })
    }
}

/// The instance id of a process started `seconds` after the epoch: its start in milliseconds.
fn instance_of(seconds: f64) -> Result<u64, VllmMetricsError> {
    if seconds.is_finite() && seconds > 0.0 && seconds < MAX_START_SECS {
        Ok(((seconds * 1000.0).round() as u64).max(1))
    } else {
        Err(VllmMetricsError::Absurd {
            series: PROCESS_START,
            engine: 0,
            value: seconds,
            expected: "start time",
        })
    }
}

#[cfg(test)]
mod tests;
