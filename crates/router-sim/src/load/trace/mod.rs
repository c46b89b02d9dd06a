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
//! and fed to the [`oracle`]s (and to [`belady`], which needs them all); then the time scale
//! is decided, given or chosen for an offered load ([`bounds`]). The report gives the
//! oracles' hit rates and the other bounds over the requests sent.

mod belady;
mod bounds;
mod oracle;
mod records;
mod text;

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub use bounds::{ReplayReport, ScaledLoad, Schedule};
pub use oracle::{FleetOracle, OracleReport};
pub(crate) use records::RecordsFile;
pub(crate) use text::TraceText;

use super::LoadError;
use crate::tokens::{ChatMessage, Preprocessor};
use oracle::{Blocks, Oracle, Step};

/// How fast a trace is replayed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// Divides every arrival time (`--time-scale`): 10 replays ten times faster.
    TimeScale(f64),
    /// Chooses the time scale at which the uncached prefill work the fleet oracle leaves
    /// arrives at this fraction of the fleet's prefill speed (`--offered-load`, in (0, 2]).
    /// Needs the fleet oracle, [`TraceSpec::engines`] and [`TraceSpec::prefill_tokens_per_sec`].
    OfferedLoad(f64),
}

/// A trace to replay (`--trace`), with the command-line defaults from [`TraceSpec::new`].
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSpec {
    /// The JSONL file: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.
    pub path: PathBuf,
    /// How fast to replay (default: `--time-scale 1`, real time).
    pub pace: Pace,
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
    /// The number of engines of the fleet (`--engines`), for the offered load.
    pub engines: Option<usize>,
    /// The prefill speed of each engine for uncached prompt tokens
    /// (`--prefill-tokens-per-sec`), for the TTFT floor and the offered load.
    pub prefill_tokens_per_sec: Option<f64>,
    /// Where to write one JSON line per request sent (`--requests-out`): what the oracles and
    /// the floor allowed it beside what it met; `None`: nowhere.
    pub requests_out: Option<PathBuf>,
}

impl TraceSpec {
    /// A replay of `path` with the defaults: real time, every request, 512-token blocks at full
    /// length, the built-in tokenizer, engine blocks of 16 tokens, no fleet oracle, no fleet
    /// size or speed.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            pace: Pace::TimeScale(1.0),
            max_requests: None,
            block_tokens: 512,
            length_scale: 1.0,
            tokenizer: None,
            engine_block_size: 16,
            fleet_capacity_tokens: None,
            engines: None,
            prefill_tokens_per_sec: None,
            requests_out: None,
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
        let needs = |flag: &'static str, needs: &'static str| Err(LoadError::Needs { flag, needs });
        match self.pace {
            Pace::TimeScale(scale) if !(scale.is_finite() && scale > 0.0) => {
                return bad("--time-scale", format!("{scale} is not a positive factor"));
            }
            Pace::TimeScale(_) => {}
            Pace::OfferedLoad(load) => {
                if !(load > 0.0 && load <= 2.0) {
                    return bad("--offered-load", format!("{load} is not in (0, 2]"));
                }
                if self.fleet_capacity_tokens.is_none() {
                    return needs("--offered-load", "--fleet-capacity-tokens");
                }
                if self.engines.is_none() {
                    return needs("--offered-load", "--engines");
                }
                if self.prefill_tokens_per_sec.is_none() {
                    return needs("--offered-load", "--prefill-tokens-per-sec");
                }
            }
        }
        if self.engines == Some(0) {
            return bad("--engines", "must be at least 1".into());
        }
        if let Some(speed) = self.prefill_tokens_per_sec
            && !(speed.is_finite() && speed > 0.0)
        {
            return bad("--prefill-tokens-per-sec", format!("{speed} is not a positive speed"));
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

/// One request of a trace, lengths scaled.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TraceRequest {
    /// Position in the trace (0-based), which also seeds any padding.
    pub(crate) index: usize,
    /// Arrival in the trace, ms from its start (`timestamp`).
    pub(crate) timestamp_ms: f64,
    /// Prompt tokens (scaled).
    pub(crate) input_length: usize,
    /// `max_tokens` (scaled, at least 1).
    pub(crate) output_length: usize,
    pub(crate) hash_ids: Vec<u64>,
}

impl TraceRequest {
    /// Send time after the start of a replay at `time_scale`: `timestamp / time_scale`.
    pub(crate) fn at(&self, time_scale: f64) -> Duration {
        let at_ms = (self.timestamp_ms / time_scale).max(0.0);
        Duration::try_from_secs_f64(at_ms / 1000.0).unwrap_or(Duration::MAX)
    }
}

/// Reads a trace, keeping at most `spec.max_requests` requests, with lengths scaled.
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
        requests.push(TraceRequest {
            index: requests.len(),
            timestamp_ms: parsed.timestamp,
            input_length: spec.scale_length(parsed.input_length),
            output_length: spec.scale_length(parsed.output_length).max(1),
            hash_ids: parsed.hash_ids,
        });
    }
    Ok(requests)
}

/// A trace ready to replay: its requests, their text, each request's oracle step, and the
/// time scale.
#[derive(Debug)]
pub(crate) struct Replay {
    pub(crate) requests: Vec<TraceRequest>,
    pub(crate) text: TraceText,
    steps: Vec<Step>,
    fleet_capacity_tokens: Option<usize>,
    schedule: Schedule,
    engines: Option<usize>,
    prefill_tokens_per_sec: Option<f64>,
}

impl Replay {
    /// Reads the trace, loads the tokenizer, runs every prompt through the oracles in trace
    /// order (checking that each prompt's text tokenizes back to exactly its tokens), then
    /// decides the time scale.
    pub(crate) fn prepare(spec: &TraceSpec) -> Result<Self, LoadError> {
        spec.validate()?;
        let preprocessor = match &spec.tokenizer {
            Some(path) => Preprocessor::from_tokenizer_file(path).map_err(LoadError::Tokenizer)?,
            None => Preprocessor::builtin(),
        };
        let requests = read_trace(spec)?;
        let text = TraceText::new(preprocessor, spec.scaled_block_tokens())?;
        let block_size = spec.engine_block_size;
        let mut oracle = Oracle::new(block_size, spec.fleet_capacity_tokens);
        let mut steps = Vec::with_capacity(requests.len());
        // Kept for Belady, which needs every prompt before it can play the first.
        let mut prompts = Vec::with_capacity(requests.len());
        for request in &requests {
            let ids = text.content_ids(request);
            let content = text.checked_text(&ids, request.index)?;
            let prompt = text
                .preprocessor()
                .prompt_ids(&[ChatMessage::new("user", content)])
                .map_err(LoadError::Tokenizer)?;
            let blocks = Blocks::new(&prompt, block_size);
            steps.push(oracle.observe(&blocks));
            if spec.fleet_capacity_tokens.is_some() {
                prompts.push(blocks);
            }
        }
        if let Some(capacity) = spec.fleet_capacity_tokens {
            let capacity = oracle::capacity_blocks(capacity, block_size);
            for (step, hits) in steps.iter_mut().zip(belady::hit_blocks(&prompts, capacity)) {
                step.belady_hit_tokens = Some((hits * block_size.max(1)) as u64);
            }
        }
        let schedule = bounds::schedule(spec, &requests, &steps)?;
        Ok(Self {
            requests,
            text,
            steps,
            fleet_capacity_tokens: spec.fleet_capacity_tokens,
            schedule,
            engines: spec.engines,
            prefill_tokens_per_sec: spec.prefill_tokens_per_sec,
        })
    }

    /// The send time of request `index` after the start of the replay.
    pub(crate) fn at(&self, index: usize) -> Duration {
        self.requests[index].at(self.schedule.time_scale)
    }

    /// The oracle hit rates over the first `sent` requests (a replay sends in trace order).
    pub(crate) fn oracle_over(&self, sent: usize) -> OracleReport {
        OracleReport::sum(&self.steps[..sent.min(self.steps.len())], self.fleet_capacity_tokens)
    }

    /// The oracles and the other bounds over the first `sent` requests.
    pub(crate) fn report_over(&self, sent: usize) -> ReplayReport {
        let sent = sent.min(self.steps.len());
        ReplayReport {
            oracle: self.oracle_over(sent),
            schedule: self.schedule.clone(),
            ttft_floor_ms: bounds::ttft_floor_ms(&self.steps[..sent], self.prefill_tokens_per_sec),
            offered_load: bounds::offered_load(
                &self.requests[..sent],
                &self.steps[..sent],
                self.schedule.time_scale,
                self.engines,
                self.prefill_tokens_per_sec,
            ),
        }
    }
}

#[cfg(test)]
mod tests;
