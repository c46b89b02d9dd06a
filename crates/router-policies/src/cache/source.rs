//! `CacheSource`: the local index or a remote indexer, normalised into per-worker prefix results.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use router_state_kv::hash::{Salt, salted_block_hashes};
use router_state_kv::remote::{ClientConfig, ClientConfigError, RemoteError, RemoteIndexClient};
use router_state_kv::{KvIndex, Medium, Predictions, PrefixMatches};
use router_workers::{ModelId, Worker, WorkerId};

/// Tokens per KV block of an engine: never zero, so blocks convert to tokens only through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockSize(NonZeroU32);

impl BlockSize {
    /// `tokens` per block; `None` for zero.
    pub fn new(tokens: u32) -> Option<Self> {
        NonZeroU32::new(tokens).map(Self)
    }

    /// The blocks the router hashes prompts in for an engine that declares no block size and
    /// publishes no KV events: its cache is pictured from the router's own dispatches
    /// (approximate mode), so any fixed size works; 16 tokens, or 64 bytes of text where a
    /// prompt's ids are its bytes four at a time ([`crate::RequestTokens::from_text`]).
    pub const APPROXIMATE: BlockSize = BlockSize(NonZeroU32::new(16).expect("non-zero"));

    /// The block size of `worker`: its own, or its KV events', else [`BlockSize::APPROXIMATE`].
    pub fn of(worker: &Worker) -> Self {
        worker.block_size().and_then(Self::new).unwrap_or(Self::APPROXIMATE)
    }

    /// Whether the router knows `worker`'s cache only from its own dispatches: it has neither a
    /// block size nor KV events, so no index or indexer can hold its blocks.
    pub fn is_approximate(worker: &Worker) -> bool {
        worker.block_size().is_none()
    }

    /// Tokens per block.
    pub fn get(self) -> u32 {
        self.0.get()
    }

    /// Tokens in `blocks` blocks.
    pub fn tokens(self, blocks: u32) -> u64 {
        u64::from(blocks) * u64::from(self.get())
    }
}

impl fmt::Display for BlockSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The cached prefix of a request on one worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedPrefix {
    /// The worker.
    pub worker: WorkerId,
    /// The data-parallel rank holding it (the longest; the lowest on ties).
    pub rank: u32,
    /// Leading blocks held.
    pub blocks: u32,
    /// Leading tokens held: `blocks x block size`, capped at the tokens looked up.
    pub tokens: u64,
    /// The slowest tier among those blocks (each at its fastest copy).
    pub tier: Medium,
}

/// FNV-1a: worker ids are short strings looked up once per candidate per pick, where SipHash
/// would cost more than the rest of the lookup. Ids come from configuration, not from clients.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Every worker holding at least the first block of a request, for one block size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedPrefixes {
    block_size: BlockSize,
    query_blocks: usize,
    /// In the backend's order: longest first, then fastest tier.
    prefixes: Vec<CachedPrefix>,
    /// Worker to position in `prefixes`.
    by_worker: HashMap<WorkerId, usize, BuildHasherDefault<Fnv>>,
}

impl CachedPrefixes {
    /// Normalises a lookup result for a query of `query_tokens` tokens hashed in blocks of
    /// `block_size`.
    pub fn new(matches: PrefixMatches, block_size: BlockSize, query_tokens: u64) -> Self {
        let prefixes: Vec<CachedPrefix> = matches
            .matches
            .into_iter()
            .map(|m| CachedPrefix {
                tokens: block_size.tokens(m.blocks).min(query_tokens),
                worker: m.worker,
                rank: m.rank,
                blocks: m.blocks,
                tier: m.tier,
            })
            .collect();
        let by_worker = prefixes.iter().enumerate().map(|(at, p)| (p.worker.clone(), at)).collect();
        Self { block_size, query_blocks: matches.query_blocks, prefixes, by_worker }
    }

    /// The block size the request was hashed with.
    pub fn block_size(&self) -> BlockSize {
        self.block_size
    }

    /// Full blocks in the query.
    pub fn query_blocks(&self) -> usize {
        self.query_blocks
    }

    /// The prefix `worker` holds, if it holds the first block.
    pub fn get(&self, worker: &WorkerId) -> Option<&CachedPrefix> {
        self.by_worker.get(worker).map(|&at| &self.prefixes[at])
    }

    /// Every holder, longest match first (the backend's order).
    pub fn iter(&self) -> impl Iterator<Item = &CachedPrefix> {
        self.prefixes.iter()
    }

    /// Whether nobody holds even the first block (a confirmed miss).
    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }
}

/// Why a source could not say what is cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unavailable {
    /// The remote client's in-flight limit was reached.
    Busy,
    /// The remote indexer did not answer within the query timeout.
    Timeout,
    /// The remote indexer could not be reached or failed the call.
    Unreachable,
    /// The remote indexer answered something that is not a lookup result.
    Malformed,
    /// The request has no token ids to look up (it was not tokenized).
    NoTokens,
}

impl Unavailable {
    /// A stable `snake_case` name for metrics labels and traces.
    pub fn as_str(self) -> &'static str {
        match self {
            Unavailable::Busy => "busy",
            Unavailable::Timeout => "timeout",
            Unavailable::Unreachable => "unreachable",
            Unavailable::Malformed => "malformed",
            Unavailable::NoTokens => "no_tokens",
        }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a lookup established: the cached prefixes (possibly none: a confirmed miss), or that
/// the backend could not tell. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrefixOutcome {
    /// The backend answered; empty means a confirmed miss.
    Found(Arc<CachedPrefixes>),
    /// The backend could not answer; selection falls back, without calling it a miss.
    Unavailable(Unavailable),
}

/// A lookup that is an explicit error rather than a fallback: the query itself is invalid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// The remote indexer refused the query.
    #[error("the kv indexer refused the prefix lookup")]
    Refused(#[source] RemoteError),
}

/// Lookup counters of one source, counted apart by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Lookups performed (each memoised request counts once per block size).
    pub lookups: u64,
    /// Lookups where some worker held at least the first block.
    pub found: u64,
    /// Confirmed misses: the backend answered and nobody held the first block.
    pub empty: u64,
    /// Unavailable: the remote in-flight limit was reached.
    pub busy: u64,
    /// Unavailable: the remote query timed out.
    pub timeouts: u64,
    /// Unavailable: the remote indexer was unreachable or failed.
    pub unreachable: u64,
    /// Unavailable: the remote answer was malformed.
    pub malformed: u64,
    /// Refused as invalid queries.
    pub refused: u64,
}

impl SourceStats {
    /// All unavailable outcomes.
    pub fn unavailable(&self) -> u64 {
        self.busy + self.timeouts + self.unreachable + self.malformed
    }

    /// Each outcome with its `snake_case` name (every lookup has exactly one): `found`,
    /// `empty`, the [`Unavailable`] names `busy`, `timeout`, `unreachable`, `malformed`, and
    /// `refused`.
    pub fn outcomes(&self) -> [(&'static str, u64); 7] {
        [
            ("found", self.found),
            ("empty", self.empty),
            (Unavailable::Busy.as_str(), self.busy),
            (Unavailable::Timeout.as_str(), self.timeouts),
            (Unavailable::Unreachable.as_str(), self.unreachable),
            (Unavailable::Malformed.as_str(), self.malformed),
            ("refused", self.refused),
        ]
    }

    /// These counters plus `other`'s.
    pub fn merged(self, other: &SourceStats) -> SourceStats {
        SourceStats {
            lookups: self.lookups + other.lookups,
            found: self.found + other.found,
            empty: self.empty + other.empty,
            busy: self.busy + other.busy,
            timeouts: self.timeouts + other.timeouts,
            unreachable: self.unreachable + other.unreachable,
            malformed: self.malformed + other.malformed,
            refused: self.refused + other.refused,
        }
    }
}

/// Upper bounds, in tokens, of the buckets of [`MatchedTokens`]; a last bucket holds the rest.
pub const MATCHED_TOKEN_BOUNDS: [u64; 12] =
    [0, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536];

/// How many tokens the answered lookups of a source matched: for each lookup the longest
/// prefix any worker holds (0 for a confirmed miss), counted in the buckets of
/// [`MATCHED_TOKEN_BOUNDS`]. Unavailable and refused lookups are not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatchedTokens {
    /// Lookups per bucket (not cumulative): `counts[i]` matched at most
    /// `MATCHED_TOKEN_BOUNDS[i]` tokens and more than the bound before; the last, more than
    /// every bound.
    pub counts: [u64; MATCHED_TOKEN_BOUNDS.len() + 1],
    /// Matched tokens summed over the counted lookups.
    pub sum: u64,
}

impl MatchedTokens {
    /// Lookups counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// These counts plus `other`'s.
    pub fn merged(mut self, other: &MatchedTokens) -> MatchedTokens {
        for (count, more) in self.counts.iter_mut().zip(other.counts) {
            *count += more;
        }
        self.sum += other.sum;
        self
    }
}

#[derive(Default)]
struct Counters {
    lookups: AtomicU64,
    found: AtomicU64,
    empty: AtomicU64,
    busy: AtomicU64,
    timeouts: AtomicU64,
    unreachable: AtomicU64,
    malformed: AtomicU64,
    refused: AtomicU64,
    matched: [AtomicU64; MATCHED_TOKEN_BOUNDS.len() + 1],
    matched_sum: AtomicU64,
}

enum Backend {
    Local(Arc<KvIndex>),
    Remote(RemoteIndexClient),
}

/// Where cache-aware selection learns which engine holds which prefix: the local index fed by
/// KV events, or a remote indexer. Shared as `Arc<CacheSource>`; the [`PrefixMemo`] of a
/// request keys its entries by that `Arc`.
///
/// [`PrefixMemo`]: crate::PrefixMemo
pub struct CacheSource {
    backend: Backend,
    counters: Counters,
    /// What the router just dispatched, laid over the backend's answer.
    predictions: Option<Arc<Predictions>>,
}

impl fmt::Debug for CacheSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("CacheSource");
        match &self.backend {
            Backend::Local(_) => d.field("backend", &"local"),
            Backend::Remote(client) => d.field("backend", client),
        };
        d.field("stats", &self.stats()).finish()
    }
}

impl CacheSource {
    /// The local prefix index, with the predicted entries it contradicts (when it has them)
    /// laid over its answers.
    pub fn local(index: Arc<KvIndex>) -> Self {
        let predictions = index.predictions().cloned();
        Self { backend: Backend::Local(index), counters: Counters::default(), predictions }
    }

    /// A remote indexer.
    pub fn remote(client: RemoteIndexClient) -> Self {
        Self { backend: Backend::Remote(client), counters: Counters::default(), predictions: None }
    }

    /// This source with `predictions` laid over every answer (for a remote indexer: they
    /// expire by age only, since this router sees no engine events for them).
    pub fn with_predictions(mut self, predictions: Arc<Predictions>) -> Self {
        self.predictions = Some(predictions);
        self
    }

    /// `local` or `remote`, for traces.
    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Local(_) => "local",
            Backend::Remote(_) => "remote",
        }
    }

    /// The remote client, for a remote source.
    pub fn remote_client(&self) -> Option<&RemoteIndexClient> {
        match &self.backend {
            Backend::Remote(client) => Some(client),
            Backend::Local(_) => None,
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> SourceStats {
        let c = &self.counters;
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        SourceStats {
            lookups: get(&c.lookups),
            found: get(&c.found),
            empty: get(&c.empty),
            busy: get(&c.busy),
            timeouts: get(&c.timeouts),
            unreachable: get(&c.unreachable),
            malformed: get(&c.malformed),
            refused: get(&c.refused),
        }
    }

    /// The matched tokens of the answered lookups so far.
    pub fn matched_tokens(&self) -> MatchedTokens {
        let c = &self.counters;
        MatchedTokens {
            counts: std::array::from_fn(|i| c.matched[i].load(Ordering::Relaxed)),
            sum: c.matched_sum.load(Ordering::Relaxed),
        }
    }

    /// Which workers of `model` hold how much of `tokens`, hashed in blocks of `block_size`
    /// (with no LoRA name or cache salt: requests carry neither yet). Matched tokens are
    /// `blocks x block_size`, capped at `tokens.len()`.
    ///
    /// A remote backend that times out, is busy, unreachable or malformed gives
    /// [`PrefixOutcome::Unavailable`]; only a query the indexer refuses is an error.
    pub async fn lookup(
        &self,
        model: &ModelId,
        tokens: &[u32],
        block_size: BlockSize,
    ) -> Result<PrefixOutcome, LookupError> {
        let hashes = salted_block_hashes(tokens, block_size.get(), Salt::default());
        self.lookup_hashes(model, &hashes, tokens.len() as u64, block_size).await
    }

    /// [`CacheSource::lookup`] for a query of `query_tokens` tokens already hashed in blocks
    /// of `block_size` ([`crate::RequestTokens::block_hashes`]).
    pub async fn lookup_hashes(
        &self,
        model: &ModelId,
        hashes: &[u64],
        query_tokens: u64,
        block_size: BlockSize,
    ) -> Result<PrefixOutcome, LookupError> {
        let c = &self.counters;
        c.lookups.fetch_add(1, Ordering::Relaxed);
        let matches = match &self.backend {
            Backend::Local(index) => index.lookup(model, hashes),
            // Boxed: a gRPC call's future is kilobytes, and unboxed it would be part of every
            // request's future, copied as that is built, in local deployments too.
            Backend::Remote(client) => match Box::pin(client.lookup(model, hashes)).await {
                Ok(matches) => matches,
                Err(error) => {
                    let (counter, outcome) = match &error {
                        RemoteError::Busy { .. } => (&c.busy, Unavailable::Busy),
                        RemoteError::Timeout { .. } => (&c.timeouts, Unavailable::Timeout),
                        RemoteError::Malformed { .. } => (&c.malformed, Unavailable::Malformed),
                        RemoteError::InvalidQuery { .. } => {
                            c.refused.fetch_add(1, Ordering::Relaxed);
                            return Err(LookupError::Refused(error));
                        }
                        _ => (&c.unreachable, Unavailable::Unreachable),
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        error = &error as &dyn std::error::Error,
                        "prefix lookup unavailable"
                    );
                    return Ok(PrefixOutcome::Unavailable(outcome));
                }
            },
        };
        let matches = match &self.predictions {
            Some(predictions) => {
                predictions.overlay(model, hashes, matches, std::time::Instant::now())
            }
            None => matches,
        };
        let prefixes = CachedPrefixes::new(matches, block_size, query_tokens);
        let counter = if prefixes.is_empty() { &c.empty } else { &c.found };
        counter.fetch_add(1, Ordering::Relaxed);
        let matched = prefixes.iter().map(|p| p.tokens).max().unwrap_or(0);
        let bucket = MATCHED_TOKEN_BOUNDS.partition_point(|&bound| bound < matched);
        c.matched[bucket].fetch_add(1, Ordering::Relaxed);
        c.matched_sum.fetch_add(matched, Ordering::Relaxed);
        Ok(PrefixOutcome::Found(Arc::new(prefixes)))
    }
}

/// The cache sources of an application, handed to policy construction: the local index's
/// source, and one shared remote source per distinct indexer configuration, so that every
/// policy querying the same indexer shares one client and its in-flight limit. Cheap to clone;
/// clones share the remote sources.
#[derive(Clone, Default)]
pub struct CacheSources {
    local: Option<Arc<CacheSource>>,
    remote: Arc<Mutex<Vec<Arc<CacheSource>>>>,
    predictions: Option<Arc<Predictions>>,
}

impl fmt::Debug for CacheSources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheSources")
            .field("local", &self.local.is_some())
            .field("remote", &self.remote.lock().len())
            .finish()
    }
}

impl CacheSources {
    /// Sources with no local index (remote sources are created on demand).
    pub fn new() -> Self {
        Self::default()
    }

    /// These sources with `index` as the local one.
    pub fn with_local(mut self, index: Arc<KvIndex>) -> Self {
        self.local = Some(Arc::new(CacheSource::local(index)));
        self
    }

    /// The local index's source, when the application keeps a local index.
    pub fn local(&self) -> Option<&Arc<CacheSource>> {
        self.local.as_ref()
    }

    /// Every source: the local one (when kept), then the remote ones created so far.
    pub fn all(&self) -> Vec<Arc<CacheSource>> {
        self.local.iter().cloned().chain(self.remote.lock().iter().cloned()).collect()
    }

    /// These sources laying `predictions` over the remote indexers' answers (the local
    /// source takes its index's own). Set it before any remote source is created.
    pub fn with_predictions(mut self, predictions: Arc<Predictions>) -> Self {
        self.predictions = Some(predictions);
        self
    }

    /// The predicted entries these sources read, when enabled.
    pub fn predictions(&self) -> Option<&Arc<Predictions>> {
        self.predictions.as_ref()
    }

    /// The shared source for a remote indexer configuration, created on first request.
    /// Connects to nothing.
    pub fn remote(&self, config: &ClientConfig) -> Result<Arc<CacheSource>, ClientConfigError> {
        let mut remote = self.remote.lock();
        let existing = remote
            .iter()
            .find(|source| source.remote_client().is_some_and(|client| client.config() == config));
        if let Some(source) = existing {
            return Ok(Arc::clone(source));
        }
        let mut source = CacheSource::remote(RemoteIndexClient::new(config.clone())?);
        if let Some(predictions) = &self.predictions {
            source = source.with_predictions(Arc::clone(predictions));
        }
        let source = Arc::new(source);
        remote.push(Arc::clone(&source));
        Ok(source)
    }
}
