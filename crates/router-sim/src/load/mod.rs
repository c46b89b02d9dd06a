//! The workload generator: multi-turn chat sessions that share system prompts (or a
//! Mooncake-style trace replay with its oracle hit rates), sent as streamed chat requests with
//! `stream_options.include_usage`, measured into a [`RunReport`].
//!
//! Bounded: a run stops when every session has played its turns (or every trace request has
//! been answered) or when `duration` has passed, whichever comes first; requests still in
//! flight then are dropped and not counted (the report's `sent` still counts them).

mod client;
mod distribution;
mod driver;
mod report;
mod trace;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use distribution::Distribution;
pub use report::RunReport;
pub use trace::{FleetOracle, OracleReport, Pace, ReplayReport, ScaledLoad, Schedule, TraceSpec};
pub use workload::SessionSpec;

use crate::tokens::PrepareError;

/// How requests arrive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrival {
    /// Closed loop: this many requests in flight at once (`--concurrency`, default 4).
    Concurrency(usize),
    /// Open loop: Poisson arrivals at this many requests per second (`--rate`).
    Rate(f64),
}

/// What to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// Multi-turn chat sessions.
    Sessions(SessionSpec),
    /// A request trace, replayed on its own clock (arrival is ignored; at most
    /// [`LoadgenConfig::max_in_flight`] requests in flight).
    Trace(TraceSpec),
}

/// One run of the generator.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadgenConfig {
    /// Base URL of the router or engine (`--target`); `/v1/chat/completions` is appended
    /// unless already there.
    pub target: String,
    /// Further targets (`--target` given more than once): requests go round robin over
    /// `target` and these, and a refused connection fails over to the next.
    pub more_targets: Vec<String>,
    /// The `model` of every request (`--model`).
    pub model: String,
    /// What to send.
    pub workload: Workload,
    /// How requests arrive (sessions only).
    pub arrival: Arrival,
    /// Upper bound of the run (`--duration`, default 60 s).
    pub duration: Duration,
    /// Header carrying the session id (`--session-header`); none when `None`.
    pub session_header: Option<String>,
    /// Bound on concurrent requests of open-loop arrivals and trace replays.
    pub max_in_flight: usize,
}

impl LoadgenConfig {
    /// A session workload with the command-line defaults.
    pub fn new(target: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            target: target.into(),
            more_targets: Vec::new(),
            model: model.into(),
            workload: Workload::Sessions(SessionSpec::default()),
            arrival: Arrival::Concurrency(4),
            duration: Duration::from_secs(60),
            session_header: None,
            max_in_flight: 1024,
        }
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// `--target` is not a URL.
    #[error("invalid target {target:?}")]
    Target {
        /// The value given.
        target: String,
        /// The parse error.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// Only plain `http://` targets are supported.
    #[error("target {target:?} is not an http:// URL")]
    Scheme {
        /// The value given.
        target: String,
    },
    /// `--session-header` is not a valid header name.
    #[error("invalid header name {name:?}")]
    HeaderName {
        /// The value given.
        name: String,
    },
    /// A numeric setting is out of range.
    #[error("invalid {flag}: {reason}")]
    Config {
        /// The flag at fault.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A flag was given without another it needs.
    #[error("{flag} needs {needs}")]
    Needs {
        /// The flag given.
        flag: &'static str,
        /// The flag it needs.
        needs: &'static str,
    },
    /// The trace file could not be read.
    #[error("cannot read trace {path}")]
    ReadTrace {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The tokenizer of `--tokenizer` could not be loaded or used.
    #[error("tokenizer failed")]
    Tokenizer(#[source] PrepareError),
    /// The tokenizer's vocabulary has no tokens trace text can be made of.
    #[error("tokenizer {tokenizer} has no word or letter tokens to make trace text of")]
    NoTraceTokens {
        /// The tokenizer file.
        tokenizer: PathBuf,
    },
    /// A trace prompt's text does not tokenize back to its tokens.
    #[error(
        "the text of trace request {request} does not tokenize back to its tokens with {tokenizer} (first difference at token {at})"
    )]
    TraceText {
        /// 0-based index of the request in the trace.
        request: usize,
        /// The tokenizer file.
        tokenizer: PathBuf,
        /// Index of the first differing token.
        at: usize,
    },
    /// The file of `--requests-out` could not be created or written.
    #[error("cannot write the requests to {path}")]
    RequestsOut {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A trace line is not a valid request.
    #[error("invalid trace line {path}:{line}")]
    ParseTrace {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
}

fn validate(config: &LoadgenConfig) -> Result<(), LoadError> {
    let bad = |flag: &'static str, reason: String| Err(LoadError::Config { flag, reason });
    match config.arrival {
        Arrival::Concurrency(0) => return bad("--concurrency", "must be at least 1".into()),
        Arrival::Rate(rate) if !(rate.is_finite() && rate > 0.0) => {
            return bad("--rate", format!("{rate} is not a positive rate"));
        }
        _ => {}
    }
    if config.max_in_flight == 0 {
        return bad("max_in_flight", "must be at least 1".into());
    }
    match &config.workload {
        Workload::Sessions(spec) => {
            if spec.output_tokens == 0 {
                return bad("--output-tokens", "must be at least 1".into());
            }
            if spec.turn_tokens == 0 {
                return bad("--turn-tokens", "must be at least 1".into());
            }
        }
        Workload::Trace(spec) => spec.validate()?,
    }
    Ok(())
}

/// The oracles of a whole trace (every request of `spec`, as if all were sent), computed as a
/// replay prepares them, without sending anything.
pub fn trace_oracle(spec: &TraceSpec) -> Result<OracleReport, LoadError> {
    let replay = trace::Replay::prepare(spec)?;
    Ok(replay.oracle_over(replay.requests.len()))
}

/// Runs the workload against `config.target` (and `config.more_targets`) and reports what it
/// measured.
pub async fn run(config: &LoadgenConfig) -> Result<RunReport, LoadError> {
    validate(config)?;
    let targets: Vec<String> =
        std::iter::once(config.target.clone()).chain(config.more_targets.iter().cloned()).collect();
    let client = client::Client::new(&targets, &config.model, config.session_header.as_deref())?;
    match &config.workload {
        Workload::Sessions(spec) => Ok(driver::sessions(config, spec, client).await),
        Workload::Trace(spec) => {
            // Created first, so that a path that cannot be written fails before the replay.
            let records =
                spec.requests_out.as_deref().map(trace::RecordsFile::create).transpose()?;
            let replay = Arc::new(trace::Replay::prepare(spec)?);
            let (report, outcomes) = driver::trace(config, Arc::clone(&replay), client).await;
            if let Some(records) = records {
                records.write(&replay, &outcomes, report.sent)?;
            }
            Ok(report)
        }
    }
}
