//! `--requests-out FILE`: one JSON line per request a replay sent, in trace order, putting
//! what the oracles and the TTFT floor allowed it beside what it met. The run's report gives
//! distributions; these lines say which requests make them (which ones the p99 is, what their
//! engine had cached, which hits the fleet LRU oracle had and the fleet did not).
//!
//! Every line has the trace's side: `index` (0-based in the trace), `sent_ms` (when it was due
//! after the start of the replay), `prompt_tokens` (as the engines tokenize it),
//! `unlimited_hit_tokens`, `fleet_lru_hit_tokens` and `belady_hit_tokens` (`null` without
//! `--fleet-capacity-tokens`), `floor_ms` (`null` without `--prefill-tokens-per-sec`). Then what
//! it met: `error` (`null` on success; `unfinished` for a request still in flight when the run
//! ended, with every other field of this part `null`), `ttft_ms`, `latency_ms`, `usage_prompt_tokens`,
//! `cached_tokens`, `completion_tokens` and `engine` (each `null` where the answer had none).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::Replay;
use crate::load::LoadError;
use crate::load::client::Outcome;

/// The file of `--requests-out`, created before the replay starts.
#[derive(Debug)]
pub(crate) struct RecordsFile {
    path: PathBuf,
    file: BufWriter<File>,
}

impl RecordsFile {
    /// Creates (or truncates) `path`.
    pub(crate) fn create(path: &Path) -> Result<Self, LoadError> {
        let file = File::create(path)
            .map_err(|source| LoadError::RequestsOut { path: path.to_owned(), source })?;
        Ok(Self { path: path.to_owned(), file: BufWriter::new(file) })
    }

    /// Writes the line of each of the first `sent` requests of `replay`, from the `outcomes`
    /// of those that finished (in any order).
    pub(crate) fn write(
        mut self,
        replay: &Replay,
        outcomes: &[Outcome],
        sent: u64,
    ) -> Result<(), LoadError> {
        let sent = usize::try_from(sent).unwrap_or(usize::MAX).min(replay.steps.len());
        let mut finished: Vec<Option<&Outcome>> = vec![None; sent];
        for outcome in outcomes {
            if let Some(slot) = outcome.trace_index.and_then(|i| finished.get_mut(i)) {
                *slot = Some(outcome);
            }
        }
        let mut written = || -> std::io::Result<()> {
            for (index, outcome) in finished.iter().enumerate() {
                serde_json::to_writer(&mut self.file, &record(replay, index, *outcome))?;
                self.file.write_all(b"\n")?;
            }
            self.file.flush()
        };
        written().map_err(|source| LoadError::RequestsOut { path: self.path, source })
    }
}

/// One line of the file.
#[derive(Debug, Serialize)]
struct Record<'a> {
    index: usize,
    sent_ms: f64,
    prompt_tokens: u64,
    unlimited_hit_tokens: u64,
    fleet_lru_hit_tokens: Option<u64>,
    belady_hit_tokens: Option<u64>,
    floor_ms: Option<f64>,
    error: Option<&'a str>,
    ttft_ms: Option<f64>,
    latency_ms: Option<f64>,
    usage_prompt_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    engine: Option<&'a str>,
}

/// The record of request `index`, which finished with `outcome` (`None`: still in flight).
fn record<'a>(replay: &Replay, index: usize, outcome: Option<&'a Outcome>) -> Record<'a> {
    let step = &replay.steps[index];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Record {
        index,
        sent_ms: ms(replay.at(index)),
        prompt_tokens: step.prompt_tokens,
        unlimited_hit_tokens: step.hit_tokens,
        fleet_lru_hit_tokens: step.fleet_hit_tokens,
        belady_hit_tokens: step.belady_hit_tokens,
        floor_ms: replay.prefill_tokens_per_sec.map(|speed| step.floor_ms(speed)),
        error: outcome.map_or(Some("unfinished"), |o| o.error.as_deref()),
        ttft_ms: outcome.and_then(|o| o.ttft).map(ms),
        latency_ms: outcome.map(|o| ms(o.latency)),
        usage_prompt_tokens: outcome.and_then(|o| o.prompt_tokens),
        cached_tokens: outcome.and_then(|o| o.cached_tokens),
        completion_tokens: outcome.and_then(|o| o.completion_tokens),
        engine: outcome.and_then(|o| o.engine.as_deref()),
    }
}
