//! Trace replay (`--trace`): the requests of a Mooncake-style JSONL trace, their prompts, and
//! the oracle hit rates the replay is judged against.
//!
//! Each line is one request: `timestamp` (ms from the start), `input_length` and
//! `output_length` (tokens) and `hash_ids` (one id per block of `--trace-block-tokens` tokens;
//! equal leading ids mean a shared prefix). A request is sent at `timestamp / time_scale`, as
//! one user message whose text the configured tokenizer turns into exactly the tokens of its
//! hash ids in order, cut at `input_length` ([`text`]), with `max_tokens = output_length`.
//! `length_scale` shrinks the block size, the input and the output lengths together, so every
//! request keeps its number of blocks and the prefix structure is unchanged.
//!
//! Before the clock starts, every request's prompt is rendered and tokenized as the engines do
//! and fed to the [`oracle`]s; the report then gives their hit rates over the requests sent.

mod oracle;
mod text;

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub use oracle::{FleetOracle, OracleReport};
pub(crate) use text::TraceText;

use super::LoadError;
use crate::tokens::{ChatMessage, Preprocessor};
use oracle::{Oracle, Step};

/// A trace to replay (`--trace`), with the command-line defaults from [`TraceSpec::new`].
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSpec {
    /// The JSONL file: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.
    pub path: PathBuf,
    /// Divides every arrival time (`--time-scale`, default 1): 10 replays ten times faster.
    pub time_scale: f64,
    /// Replays only the first N requests (`--max-requests`).
    pub max_requests: Option<usize>,
    /// Tokens per trace hash id, before length scaling (`--trace-block-tokens`, 512 for the
    /// Mooncake traces).
    pub block_tokens: usize,
    /// Scales the block size, input and output lengths together (`--trace-length-scale`,
    /// default 1; 0.125 turns 512-token blocks into 64-token ones).
    pub length_scale: f64,
    /// The engines' `tokenizer.json` (`--tokenizer`), with the chat template beside it; `None`
    /// is the built-in byte-level tokenizer and ChatML.
    pub tokenizer: Option<PathBuf>,
    /// The engines' KV block size, the unit of the oracles (`--block-size`, default 16).
    pub engine_block_size: usize,
    /// The fleet's total KV capacity in tokens, for the fleet oracle
    /// (`--fleet-capacity-tokens`); `None`: no fleet oracle.
    pub fleet_capacity_tokens: Option<usize>,
}

impl TraceSpec {
    /// A replay of `path` with the defaults: real time, every request, 512-token blocks at full
    /// length, the built-in tokenizer, engine blocks of 16 tokens, no fleet oracle.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            time_scale: 1.0,
            max_requests: None,
            block_tokens: 512,
            length_scale: 1.0,
            tokenizer: None,
            engine_block_size: 16,
            fleet_capacity_tokens: None,
        }
    }

    /// Tokens per hash id after length scaling (at least 1).
    pub fn scaled_block_tokens(&self) -> usize {
        let scaled = (self.block_tokens as f64 * self.length_scale).round();
        if scaled >= 1.0 { scaled as usize } else { 1 }
    }

    /// A length of the trace scaled like the blocks, rounded up, so that a request keeps its
    /// number of blocks: `ceil(len * scaled_block / block)`.
    fn scale_length(&self, len: usize) -> usize {
        let scaled = len as u128 * self.scaled_block_tokens() as u128;
        usize::try_from(scaled.div_ceil(self.block_tokens as u128)).unwrap_or(usize::MAX)
    }

    /// Rejects values a replay cannot run with, naming the flag.
    pub(crate) fn validate(&self) -> Result<(), LoadError> {
        let bad = |flag: &'static str, reason: String| Err(LoadError::Config { flag, reason });
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return bad("--time-scale", format!("{} is not a positive factor", self.time_scale));
        }
        if !(self.length_scale.is_finite() && self.length_scale > 0.0) {
            return bad(
                "--trace-length-scale",
                format!("{} is not a positive factor", self.length_scale),
            );
        }
        if self.block_tokens == 0 {
            return bad("--trace-block-tokens", "must be at least 1".into());
        }
        if self.engine_block_size == 0 {
            return bad("--block-size", "must be at least 1".into());
        }
        if let Some(capacity) = self.fleet_capacity_tokens
            && capacity < self.engine_block_size
        {
            return bad(
                "--fleet-capacity-tokens",
                format!("{capacity} is less than one block of {}", self.engine_block_size),
            );
        }
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
struct TraceLine {
    timestamp: f64,
    input_length: usize,
    output_length: usize,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// One request of a trace, scaled.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TraceRequest {
    /// Position in the trace (0-based), which also seeds any padding.
    pub(crate) index: usize,
    /// Send time after the start of the replay: `timestamp / time_scale`.
    pub(crate) at: Duration,
    /// Prompt tokens (scaled).
    pub(crate) input_length: usize,
    /// `max_tokens` (scaled, at least 1).
    pub(crate) output_length: usize,
    pub(crate) hash_ids: Vec<u64>,
}

/// Reads a trace, keeping at most `spec.max_requests` requests, with times and lengths scaled.
pub(crate) fn read_trace(spec: &TraceSpec) -> Result<Vec<TraceRequest>, LoadError> {
    let path = spec.path.as_path();
    let file = std::fs::File::open(path)
        .map_err(|source| LoadError::ReadTrace { path: path.to_owned(), source })?;
    let limit = spec.max_requests.unwrap_or(usize::MAX);
    let mut requests = Vec::new();
    for (line_index, line) in std::io::BufReader::new(file).lines().enumerate() {
        if requests.len() >= limit {
            break;
        }
        let line = line.map_err(|source| LoadError::ReadTrace { path: path.to_owned(), source })?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: TraceLine = serde_json::from_str(&line).map_err(|source| {
            LoadError::ParseTrace { path: path.to_owned(), line: line_index + 1, source }
        })?;
        let at_ms = (parsed.timestamp / spec.time_scale).max(0.0);
        requests.push(TraceRequest {
            index: requests.len(),
            at: Duration::try_from_secs_f64(at_ms / 1000.0).unwrap_or(Duration::MAX),
            input_length: spec.scale_length(parsed.input_length),
            output_length: spec.scale_length(parsed.output_length).max(1),
            hash_ids: parsed.hash_ids,
        });
    }
    Ok(requests)
}

/// A trace ready to replay: its requests, their text, and each request's oracle step.
#[derive(Debug)]
pub(crate) struct Replay {
    pub(crate) requests: Vec<TraceRequest>,
    pub(crate) text: TraceText,
    steps: Vec<Step>,
    fleet_capacity_tokens: Option<usize>,
}

impl Replay {
    /// Reads the trace, loads the tokenizer, and runs every prompt through the oracles in trace
    /// order, checking that each prompt's text tokenizes back to exactly its tokens.
    pub(crate) fn prepare(spec: &TraceSpec) -> Result<Self, LoadError> {
        spec.validate()?;
        let preprocessor = match &spec.tokenizer {
            Some(path) => Preprocessor::from_tokenizer_file(path).map_err(LoadError::Tokenizer)?,
            None => Preprocessor::builtin(),
        };
        let requests = read_trace(spec)?;
        let text = TraceText::new(preprocessor, spec.scaled_block_tokens())?;
        let mut oracle = Oracle::new(spec.engine_block_size, spec.fleet_capacity_tokens);
        let mut steps = Vec::with_capacity(requests.len());
        for request in &requests {
            let ids = text.content_ids(request);
            let content = text.checked_text(&ids, request.index)?;
            let prompt = text
                .preprocessor()
                .prompt_ids(&[ChatMessage::new("user", content)])
                .map_err(LoadError::Tokenizer)?;
            steps.push(oracle.observe(&prompt));
        }
        Ok(Self { requests, text, steps, fleet_capacity_tokens: spec.fleet_capacity_tokens })
    }

    /// The oracle hit rates over the first `sent` requests (a replay sends in trace order).
    pub(crate) fn oracle_over(&self, sent: usize) -> OracleReport {
        OracleReport::sum(&self.steps[..sent.min(self.steps.len())], self.fleet_capacity_tokens)
    }
}

#[cfg(test)]
mod tests;
