//! The scheduler's state under one lock: the waiting queue, the running batch, the prefix
//! cache with its KV slot accounting, and the counters behind load reports.
//!
//! KV capacity is counted in blocks. A running request reserves at admission every block its
//! prompt and its whole output can need, minus the cached prefix it reuses; a reserved block
//! moves into the prefix cache when it fills (prompt blocks after prefill, output blocks as
//! decoding fills them). Admission evicts unreferenced cached leaves, least recently used
//! first, to make room, and otherwise waits (first come, first served).

use std::collections::VecDeque;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Kind, Progress, Submission};
use crate::engine::cache::{PrefixCache, block_hash, chain_hashes};
use crate::engine::events::KvEvent;
use crate::engine::load::RankLoad;

/// What the scheduler loop does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Nothing to do until a request arrives.
    Idle,
    /// Prefill the newly admitted requests: this many tokens are not cached.
    Prefill { uncached_tokens: u64 },
    /// One decode step: one token for every decoding request.
    Decode,
}

#[derive(Debug)]
struct Waiting {
    prompt: Vec<u32>,
    prompt_hashes: Vec<u64>,
    output: Vec<u32>,
    kind: Kind,
    tx: mpsc::UnboundedSender<Progress>,
    uncached_estimate: u64,
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    Prefill,
    Decoding,
}

#[derive(Debug)]
struct Running {
    /// Prompt then the output generated so far.
    seq: Vec<u32>,
    prompt_len: usize,
    prompt_hashes: Vec<u64>,
    output: Vec<u32>,
    tx: mpsc::UnboundedSender<Progress>,
    phase: Phase,
    /// The chain of cached blocks this request references, from the root.
    tree: Vec<u64>,
    /// Reserved KV blocks not (yet) in the cache.
    private: usize,
    /// Tokens whose KV has been computed (or received).
    computed: usize,
    generated: usize,
    cached_tokens: usize,
}

/// Cumulative counters, never reset while the engine runs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    pub(crate) prefill_uncached_tokens: u64,
    pub(crate) prefill_busy_us: u64,
    pub(crate) prompt_tokens: u64,
    pub(crate) cached_tokens: u64,
    pub(crate) generated_tokens: u64,
}

#[derive(Debug)]
pub(crate) struct State {
    block_size: usize,
    capacity_blocks: usize,
    max_running: usize,
    /// False on decode engines: they keep no prefix cache and publish nothing.
    caching: bool,
    cache: PrefixCache,
    reserved: usize,
    waiting: VecDeque<Waiting>,
    waiting_prompt_tokens: u64,
    waiting_uncached_tokens: u64,
    running: Vec<Running>,
    pub(crate) counters: Counters,
    window_start: Option<Instant>,
    window_tokens: u64,
    gen_throughput: f64,
    events: Vec<KvEvent>,
}

/// Why a request cannot be queued at all.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    /// The prompt alone needs more KV than the engine has.
    #[error("prompt of {prompt} tokens does not fit the kv capacity of {capacity} tokens")]
    TooLong {
        /// Prompt tokens.
        prompt: usize,
        /// KV capacity in tokens.
        capacity: usize,
    },
    /// The request asked for no output.
    #[error("max_tokens must be at least 1")]
    NoOutput,
}

impl State {
    pub(crate) fn new(
        block_size: usize,
        capacity_tokens: usize,
        max_running: usize,
        caching: bool,
    ) -> Self {
        Self {
            block_size,
            capacity_blocks: capacity_tokens / block_size,
            max_running,
            caching,
            cache: PrefixCache::default(),
            reserved: 0,
            waiting: VecDeque::new(),
            waiting_prompt_tokens: 0,
            waiting_uncached_tokens: 0,
            running: Vec::new(),
            counters: Counters::default(),
            window_start: None,
            window_tokens: 0,
            gen_throughput: 0.0,
            events: Vec::new(),
        }
    }

    pub(crate) fn capacity_tokens(&self) -> usize {
        self.capacity_blocks * self.block_size
    }

    /// The longest output that fits beside `prompt` tokens; `None` if the prompt alone
    /// does not fit.
    pub(crate) fn output_room(&self, prompt: usize) -> Option<usize> {
        self.capacity_tokens().checked_sub(prompt).filter(|room| *room > 0)
    }

    /// Queues a request. The output is cut to what fits the KV capacity.
    pub(crate) fn submit(&mut self, mut submission: Submission) -> Result<(), SubmitError> {
        let prompt = submission.prompt.len();
        let capacity = self.capacity_tokens();
        let room = self.output_room(prompt).ok_or(SubmitError::TooLong { prompt, capacity })?;
        if submission.output.is_empty() {
            return Err(SubmitError::NoOutput);
        }
        submission.output.truncate(room);
        let prompt_hashes = if self.caching {
            chain_hashes(None, &submission.prompt, self.block_size)
        } else {
            Vec::new()
        };
        let uncached_estimate = match submission.kind {
            Kind::Full => {
                let matchable = self.matchable_blocks(prompt).min(prompt_hashes.len());
                let matched = self.cache.matched(&prompt_hashes[..matchable]);
                (prompt - matched * self.block_size) as u64
            }
            Kind::Decode { .. } => 0,
        };
        self.waiting_prompt_tokens += prompt as u64;
        self.waiting_uncached_tokens += uncached_estimate;
        self.waiting.push_back(Waiting {
            prompt: submission.prompt,
            prompt_hashes,
            output: submission.output,
            kind: submission.kind,
            tx: submission.tx,
            uncached_estimate,
        });
        Ok(())
    }

    /// At most this many prompt blocks are reused: the last prompt token is always computed
    /// (as vLLM does), so a fully cached prompt still costs one token of prefill.
    fn matchable_blocks(&self, prompt: usize) -> usize {
        if self.caching { prompt.saturating_sub(1) / self.block_size } else { 0 }
    }

    fn pop_waiting(&mut self) -> Option<Waiting> {
        let waiting = self.waiting.pop_front()?;
        self.waiting_prompt_tokens -= waiting.prompt.len() as u64;
        self.waiting_uncached_tokens -= waiting.uncached_estimate;
        Some(waiting)
    }

    /// Admits waiting requests in order while a running slot and KV room exist, then says
    /// which pass to run.
    pub(crate) fn plan(&mut self) -> Pass {
        self.admit();
        let uncached: u64 = self
            .running
            .iter()
            .filter(|r| r.phase == Phase::Prefill)
            .map(|r| (r.prompt_len - r.computed) as u64)
            .sum();
        if self.running.iter().any(|r| r.phase == Phase::Prefill) {
            Pass::Prefill { uncached_tokens: uncached }
        } else if self.running.is_empty() {
            Pass::Idle
        } else {
            Pass::Decode
        }
    }

    fn admit(&mut self) {
        while self.running.len() < self.max_running {
            let Some(front) = self.waiting.front() else { break };
            if front.tx.is_closed() {
                self.pop_waiting();
                continue;
            }
            let prompt_len = front.prompt.len();
            let total_blocks = (prompt_len + front.output.len()).div_ceil(self.block_size);
            let matchable = match front.kind {
                Kind::Full => self.matchable_blocks(prompt_len).min(front.prompt_hashes.len()),
                Kind::Decode { .. } => 0,
            };
            let matched: Vec<u64> = front.prompt_hashes[..matchable]
                .iter()
                .copied()
                .take_while(|h| self.cache.contains(*h))
                .collect();
            let private = total_blocks - matched.len();
            // Reference the reused prefix first so that eviction cannot take it.
            for hash in &matched {
                self.cache.lock(*hash);
            }
            let free = self.capacity_blocks.saturating_sub(self.cache.len() + self.reserved);
            if private > free {
                let missing = private - free;
                if missing > self.cache.reclaimable() {
                    for hash in &matched {
                        self.cache.unlock(*hash);
                    }
                    break;
                }
                let removed = self.cache.evict(missing);
                self.events.push(KvEvent::Removed { hashes: removed });
            }
            self.reserved += private;
            let Some(waiting) = self.pop_waiting() else { break };
            let cached_tokens = match waiting.kind {
                Kind::Full => matched.len() * self.block_size,
                Kind::Decode { cached_tokens } => cached_tokens,
            };
            let (phase, computed) = match waiting.kind {
                Kind::Full => (Phase::Prefill, cached_tokens),
                // The KV arrived from the prefill engine: decoding starts at once.
                Kind::Decode { .. } => (Phase::Decoding, prompt_len),
            };
            self.counters.prompt_tokens += prompt_len as u64;
            self.counters.cached_tokens += cached_tokens as u64;
            let mut seq = waiting.prompt;
            seq.reserve(waiting.output.len());
            self.running.push(Running {
                seq,
                prompt_len,
                prompt_hashes: waiting.prompt_hashes,
                output: waiting.output,
                tx: waiting.tx,
                phase,
                tree: matched,
                private,
                computed,
                generated: 0,
                cached_tokens,
            });
        }
    }

    /// Completes a prefill pass of `busy_us`: prompt blocks enter the cache and every
    /// prefilled request gets its first token.
    pub(crate) fn finish_prefill(&mut self, uncached_tokens: u64, busy_us: u64) {
        self.counters.prefill_uncached_tokens += uncached_tokens;
        self.counters.prefill_busy_us += busy_us;
        let mut running = std::mem::take(&mut self.running);
        for request in running.iter_mut().filter(|r| r.phase == Phase::Prefill) {
            request.computed = request.prompt_len;
            request.phase = Phase::Decoding;
            if self.caching {
                let hashes = request.prompt_hashes[request.tree.len()..].to_vec();
                self.commit(request, &hashes);
            }
            self.emit_token(request);
        }
        self.running = running;
        self.reap();
    }

    /// Completes one decode step: a token for every decoding request.
    pub(crate) fn finish_decode(&mut self, now: Instant) {
        let mut running = std::mem::take(&mut self.running);
        let mut tokens = 0u64;
        for request in running.iter_mut().filter(|r| r.phase == Phase::Decoding) {
            if request.generated > 0 {
                // The previous token's KV is computed in this step.
                request.computed += 1;
                if self.caching {
                    let full = request.computed / self.block_size;
                    if full > request.tree.len() {
                        let parent = request.tree.last().copied();
                        let start = request.tree.len() * self.block_size;
                        let tokens = &request.seq[start..full * self.block_size];
                        let hashes = chain_hashes(parent, tokens, self.block_size);
                        self.commit(request, &hashes);
                    }
                }
            }
            self.emit_token(request);
            tokens += 1;
        }
        self.running = running;
        self.count_generated(tokens, now);
        self.reap();
    }

    fn count_generated(&mut self, tokens: u64, now: Instant) {
        self.counters.generated_tokens += tokens;
        let start = *self.window_start.get_or_insert(now);
        self.window_tokens += tokens;
        let elapsed = now.duration_since(start).as_secs_f64();
        if elapsed >= 1.0 {
            self.gen_throughput = self.window_tokens as f64 / elapsed;
            self.window_start = Some(now);
            self.window_tokens = 0;
        }
    }

    /// Moves blocks into the cache (or references the cached copy), publishing the new ones
    /// as runs of consecutive blocks.
    fn commit(&mut self, request: &mut Running, hashes: &[u64]) {
        let mut run: Vec<u64> = Vec::new();
        let mut run_parent = request.tree.last().copied();
        let mut run_start = request.tree.len();
        for &hash in hashes {
            let parent = request.tree.last().copied();
            debug_assert_eq!(hash, {
                let i = request.tree.len() * self.block_size;
                block_hash(parent, &request.seq[i..i + self.block_size])
            });
            let new = self.cache.insert(parent, hash);
            request.tree.push(hash);
            request.private = request.private.saturating_sub(1);
            self.reserved = self.reserved.saturating_sub(1);
            if new {
                if run.is_empty() {
                    run_parent = parent;
                    run_start = request.tree.len() - 1;
                }
                run.push(hash);
            } else if !run.is_empty() {
                self.flush_run(request, &mut run, run_parent, run_start);
            }
        }
        if !run.is_empty() {
            self.flush_run(request, &mut run, run_parent, run_start);
        }
    }

    fn flush_run(
        &mut self,
        request: &Running,
        run: &mut Vec<u64>,
        parent: Option<u64>,
        start: usize,
    ) {
        let first = start * self.block_size;
        let token_ids = request.seq[first..first + run.len() * self.block_size].to_vec();
        self.events.push(KvEvent::Stored { hashes: std::mem::take(run), parent, token_ids });
    }

    fn emit_token(&self, request: &mut Running) {
        let Some(&token) = request.output.get(request.generated) else { return };
        request.seq.push(token);
        request.generated += 1;
        let progress = if request.generated == 1 {
            Progress::First { cached_tokens: request.cached_tokens }
        } else {
            Progress::Token
        };
        // A closed receiver means the client left; `reap` releases the request.
        let _ = request.tx.send(progress);
    }

    /// Releases finished requests (sending `Done`) and those whose client went away.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let request = &self.running[i];
            let finished = request.generated >= request.output.len();
            if finished || request.tx.is_closed() {
                let request = self.running.swap_remove(i);
                if finished {
                    let _ = request.tx.send(Progress::Done);
                }
                for hash in &request.tree {
                    self.cache.unlock(*hash);
                }
                self.reserved = self.reserved.saturating_sub(request.private);
            } else {
                i += 1;
            }
        }
    }

    /// Events gathered since the last call.
    pub(crate) fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Drops the whole cache when nothing runs or waits; the number of requests in the way
    /// otherwise.
    pub(crate) fn flush_cache(&mut self) -> Result<(), usize> {
        let busy = self.running.len() + self.waiting.len();
        if busy > 0 || !self.cache.clear() {
            return Err(busy);
        }
        if self.caching {
            self.events.push(KvEvent::Cleared);
        }
        Ok(())
    }

    /// The load of this (single) rank right now.
    pub(crate) fn load(&self, dp_rank: u32, now: Instant) -> RankLoad {
        let private_tokens: usize = self
            .running
            .iter()
            .map(|r| r.computed.saturating_sub(r.tree.len() * self.block_size))
            .sum();
        let used = (self.cache.referenced() * self.block_size + private_tokens) as u64;
        let stale =
            self.window_start.is_none_or(|start| now.duration_since(start).as_secs_f64() > 2.0);
        RankLoad {
            dp_rank,
            running: self.running.len() as u64,
            waiting: self.waiting.len() as u64,
            waiting_uncached_tokens: self.waiting_uncached_tokens,
            kv_used_tokens: used,
            kv_capacity_tokens: self.capacity_tokens() as u64,
            total_kv_tokens: used + self.waiting_prompt_tokens,
            max_running: self.max_running as u64,
            total_prefill_uncached_tokens: self.counters.prefill_uncached_tokens,
            total_prefill_busy_us: self.counters.prefill_busy_us,
            cached_blocks: self.cache.len() as u64,
            gen_throughput: if stale { 0.0 } else { self.gen_throughput },
            cache_hit_rate: if self.counters.prompt_tokens == 0 {
                0.0
            } else {
                self.counters.cached_tokens as f64 / self.counters.prompt_tokens as f64
            },
        }
    }

    /// Checks the slot accounting (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        self.cache.check();
        assert!(self.cache.len() + self.reserved <= self.capacity_blocks, "over capacity");
        assert_eq!(self.reserved, self.running.iter().map(|r| r.private).sum::<usize>());
        assert!(self.running.len() <= self.max_running);
    }

    #[cfg(test)]
    pub(crate) fn cached_blocks(&self) -> usize {
        self.cache.len()
    }
}
