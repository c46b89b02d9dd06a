//! The sections of the configuration file that configure one service each: health checks
//! and the breaker (`health`), retries (`server.retry`), trace export (`telemetry`) and the
//! client keys' rate limits (`server.rate_limit`, an `api_keys` entry's `rate_limit`), with
//! their defaults and the checks of their values. The services read them from here.

use std::fmt;
use std::num::NonZeroU64;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// Health checking and circuit-breaker settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSection {
    /// Seconds between probes.
    pub interval_secs: u64,
    /// Probe timeout in seconds.
    pub timeout_secs: u64,
    /// Path probed on each engine.
    pub endpoint: String,
    /// Consecutive failed probes before an engine is unhealthy.
    pub unhealthy_after: u32,
    /// Consecutive successful probes before an unhealthy engine is healthy again.
    pub healthy_after: u32,
    /// Consecutive dispatch failures (5xx or transport, never 4xx) that open the breaker; 0
    /// turns the breaker off (`--disable-circuit-breaker`): failures never open it.
    pub breaker_failures: u32,
    /// Seconds the breaker stays open before trial requests are let through.
    pub breaker_open_secs: u64,
    /// Trial requests in flight at once while half-open.
    pub breaker_trials: u32,
    /// Successful trials that close a half-open breaker.
    pub breaker_successes: u32,
}

impl Default for HealthSection {
    fn default() -> Self {
        Self {
            interval_secs: 10,
            timeout_secs: 5,
            endpoint: "/health".to_owned(),
            unhealthy_after: 3,
            healthy_after: 2,
            breaker_failures: 10,
            breaker_open_secs: 30,
            breaker_trials: 1,
            breaker_successes: 1,
        }
    }
}

/// `server.retry`: how plain dispatches are retried on another engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySection {
    /// Retries per request after the first attempt; 0 turns retries off.
    pub max_retries: u32,
    /// Delay before the first retry, multiplied by `backoff_multiplier` for each further one
    /// (with jitter).
    pub backoff_ms: u64,
    /// Factor the delay grows by from one retry to the next.
    pub backoff_multiplier: f64,
    /// Longest delay before a retry, in milliseconds, before jitter.
    pub max_backoff_ms: u64,
    /// Jitter: each delay is lengthened by a random fraction of itself in `[0, jitter_factor)`,
    /// so that clients failed together do not come back together.
    pub jitter_factor: f64,
    /// Retries may add this fraction of the recent requests.
    pub budget_ratio: f64,
    /// Retries allowed per second on top of the ratio.
    pub budget_min_per_sec: f64,
    /// What "recent" means for the budget, in seconds.
    pub budget_window_secs: u64,
    /// Engine statuses that decline a request, retried on another engine.
    pub on_status: Vec<u16>,
    /// Longest hold-off an engine's `Retry-After` gets, in seconds.
    pub max_retry_after_secs: u64,
}

impl Default for RetrySection {
    fn default() -> Self {
        Self {
            max_retries: 2,
            backoff_ms: 10,
            backoff_multiplier: 2.0,
            max_backoff_ms: 10_000,
            jitter_factor: 0.5,
            budget_ratio: 0.2,
            budget_min_per_sec: 10.0,
            budget_window_secs: 10,
            on_status: vec![429, 502, 503, 504],
            max_retry_after_secs: 30,
        }
    }
}

impl RetrySection {
    /// Problems with these settings, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut problems = Vec::new();
        if !(0.0..=1.0).contains(&self.budget_ratio) {
            problems.push(("budget_ratio", "must be within [0, 1]"));
        }
        if !self.budget_min_per_sec.is_finite() || self.budget_min_per_sec < 0.0 {
            problems.push(("budget_min_per_sec", "must be a non-negative number"));
        }
        if self.budget_window_secs == 0 {
            problems.push(("budget_window_secs", "must be at least 1"));
        }
        if self.max_retries > 10 {
            problems.push(("max_retries", "must be at most 10"));
        }
        if self.backoff_ms > 60_000 {
            problems.push(("backoff_ms", "must be at most 60000"));
        }
        if !self.backoff_multiplier.is_finite() || !(1.0..=10.0).contains(&self.backoff_multiplier)
        {
            problems.push(("backoff_multiplier", "must be within [1, 10]"));
        }
        if self.max_backoff_ms > 60_000 {
            problems.push(("max_backoff_ms", "must be at most 60000"));
        }
        if !self.jitter_factor.is_finite() || !(0.0..=1.0).contains(&self.jitter_factor) {
            problems.push(("jitter_factor", "must be within [0, 1]"));
        }
        if self.budget_window_secs > 3600 {
            problems.push(("budget_window_secs", "must be at most 3600"));
        }
        if self.on_status.iter().any(|s| !(400..=599).contains(s) || [401, 403].contains(s)) {
            problems.push((
                "on_status",
                "must list 4xx or 5xx statuses other than 401 and 403 (a refused credential)",
            ));
        }
        if self.max_retry_after_secs > 3600 {
            problems.push(("max_retry_after_secs", "must be at most 3600"));
        }
        problems
    }
}

/// `telemetry`: trace export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySection {
    /// OTLP/gRPC collector to export spans to (`http://host:4317`); unset = no export (the
    /// client's trace context still reaches the engines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// Share of new traces sampled, 0 to 1; a client's sampled flag is honoured.
    pub sample_ratio: f64,
    /// `service.name` of the exported spans.
    pub service_name: String,
}

impl Default for TelemetrySection {
    fn default() -> Self {
        Self { otlp_endpoint: None, sample_ratio: 1.0, service_name: "llm-router".to_owned() }
    }
}

impl TelemetrySection {
    /// What is wrong with the section: `(field, message)` pairs.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            problems.push(("sample_ratio", "must be between 0 and 1".to_owned()));
        }
        if let Some(endpoint) = &self.otlp_endpoint {
            match url::Url::parse(endpoint) {
                Ok(url) if matches!(url.scheme(), "http" | "https") => {}
                _ => problems.push(("otlp_endpoint", format!("{endpoint:?} is no http(s) URL"))),
            }
        }
        if self.service_name.trim().is_empty() {
            problems.push(("service_name", "must not be empty".to_owned()));
        }
        problems
    }
}

/// `server.rate_limit`, or one key's `rate_limit` (which replaces it whole for that key). A
/// limit left out is no limit; so an empty section limits nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSection {
    /// Requests per second a key may send, on average.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<Rate>,
    /// Requests a key may send at once (the request bucket's size); default one second of
    /// `requests_per_second`, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<NonZeroU64>,
    /// Tokens per second a key may spend, on average: prompt tokens plus the requested
    /// output (`max_tokens` / `max_completion_tokens`), charged at admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<Rate>,
    /// Tokens a key may spend at once (the token bucket's size, and so the largest request
    /// it can send); default one second of `tokens_per_second`, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_burst: Option<NonZeroU64>,
}

impl RateLimitSection {
    /// Problems with these settings, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut problems = Vec::new();
        if self.burst.is_some() && self.requests_per_second.is_none() {
            problems.push(("burst", "needs requests_per_second"));
        }
        if self.tokens_burst.is_some() && self.tokens_per_second.is_none() {
            problems.push(("tokens_burst", "needs tokens_per_second"));
        }
        problems
    }

    /// The request bucket's rate and size.
    pub fn requests(&self) -> Option<(f64, f64)> {
        self.requests_per_second.map(|rate| rate.with_burst(self.burst))
    }

    /// The token bucket's rate and size.
    pub fn tokens(&self) -> Option<(f64, f64)> {
        self.tokens_per_second.map(|rate| rate.with_burst(self.tokens_burst))
    }
}

/// A rate: a finite number above 0 per second.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(into = "f64")]
pub struct Rate(f64);

impl Rate {
    /// `per_second`, when it is a finite number above 0.
    pub fn new(per_second: f64) -> Option<Self> {
        (per_second.is_finite() && per_second > 0.0).then_some(Self(per_second))
    }

    /// The rate and its bucket's size: `burst`, else one second of the rate (at least 1).
    fn with_burst(self, burst: Option<NonZeroU64>) -> (f64, f64) {
        let size = burst.map_or(self.0.max(1.0), |burst| burst.get() as f64);
        (self.0, size)
    }
}

impl From<Rate> for f64 {
    fn from(rate: Rate) -> f64 {
        rate.0
    }
}

/// Read by a visitor, so that a refused number is an error at the value (which the parser
/// names by its path) rather than at the section holding it.
impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RateVisitor;

        impl Visitor<'_> for RateVisitor {
            type Value = Rate;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a finite number above 0")
            }

            fn visit_f64<E: de::Error>(self, per_second: f64) -> Result<Rate, E> {
                Rate::new(per_second).ok_or_else(|| {
                    E::custom(format_args!("must be a finite number above 0, got {per_second}"))
                })
            }

            fn visit_u64<E: de::Error>(self, per_second: u64) -> Result<Rate, E> {
                self.visit_f64(per_second as f64)
            }

            fn visit_i64<E: de::Error>(self, per_second: i64) -> Result<Rate, E> {
                self.visit_f64(per_second as f64)
            }
        }

        deserializer.deserialize_f64(RateVisitor)
    }
}
