//! The policy contract: what every policy is given and what it may answer.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use router_state_kv::hash::{Salt, salted_block_hashes};
use router_workers::{ModelId, Stage, Worker, WorkerId};

use router_affinity::ScopeError;

use crate::admission::Rejection;
use crate::affinity::KeySource;
use crate::cache::{BlockSize, LookupError, PrefixMemo};

/// Chooses one engine among the candidates of an engine group.
///
/// A policy owns its selection algorithm, its fallbacks, its admission check and the shared
/// state handles it reads (given at construction). It never chooses another bucket and never
/// crosses a PD role boundary: it picks from `engines`, which the engine group has already
/// filtered to healthy members of the requested model and stage, sorted by id.
///
/// Picks are values: a policy does not count dispatches or record metrics as a side effect of
/// picking; the handler records what was actually dispatched.
pub trait Policy: Send + Sync + fmt::Debug {
    /// Picks one engine from `engines` for `request`.
    ///
    /// The future is boxed so that a remote prefix lookup can be awaited; local policies
    /// return an immediately ready future.
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>>;

    /// The engine to name after a pick, for a proxy that retries on its own (the endpoint
    /// picker's fallback list): chosen as [`Policy::pick`] chooses from `engines` (which the
    /// caller has already narrowed to exclude the engines named before), but leaving the
    /// policy's own state alone: a rotation does not advance and no key is bound, so naming
    /// fallbacks never changes what later requests get.
    ///
    /// The default is [`Policy::pick`], right for a policy whose picks change nothing;
    /// round-robin and the affinity policies override it.
    fn pick_fallback<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        self.pick(engines, request)
    }

    /// The configuration name of this policy (`round_robin`, `cache_aware`, ...), used as a
    /// metrics label.
    fn name(&self) -> &'static str;

    /// Whether this policy may be attached to a group of `stage`. Cache-aware selection, for
    /// one, is meaningless for decode engines.
    fn supports_stage(&self, stage: Stage) -> bool {
        let _ = stage;
        true
    }
}

/// A policy that decides on the spot, from state it reads without waiting (no remote lookup):
/// its [`SyncPolicy::choose`] is the whole pick. Every such policy is a [`Policy`] through the
/// blanket implementation, whose futures are ready at once.
pub trait SyncPolicy: Send + Sync + fmt::Debug {
    /// [`Policy::pick`], decided now.
    fn choose(&self, engines: &[Arc<Worker>], request: &PickRequest<'_>)
    -> Result<Pick, PickError>;

    /// [`Policy::pick_fallback`], decided now; by default [`SyncPolicy::choose`].
    fn choose_fallback(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        self.choose(engines, request)
    }

    /// [`Policy::name`].
    fn name(&self) -> &'static str;
}

impl<P: SyncPolicy> Policy for P {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(futures::future::ready(self.choose(engines, request)))
    }

    fn pick_fallback<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(futures::future::ready(self.choose_fallback(engines, request)))
    }

    fn name(&self) -> &'static str {
        SyncPolicy::name(self)
    }
}

/// The prologue every policy shares: no candidate is [`PickError::NoCandidates`]; a single one
/// is `Some` (picked as [`PickReason::OnlyCandidate`], there is nothing to compare); several
/// are `None`, for the policy to choose among.
pub(crate) fn sole_candidate<'e>(
    engines: &'e [Arc<Worker>],
    request: &PickRequest<'_>,
) -> Result<Option<&'e Arc<Worker>>, PickError> {
    match engines {
        [] => Err(PickError::NoCandidates { stage: request.stage }),
        [only] => Ok(Some(only)),
        _ => Ok(None),
    }
}

/// The facts of one request, as one engine group sees them. Built by the bucket for each
/// group it asks; carries no HTTP body, state handles or observations.
#[derive(Clone, Copy, Debug)]
pub struct PickRequest<'a> {
    /// The requested model.
    pub model: &'a ModelId,
    /// The stage of the group being asked.
    pub stage: Stage,
    /// The id of the bucket being tried.
    pub bucket: &'a str,
    /// Prompt length in tokens (exact when tokenized, else an estimate).
    pub input_tokens: u64,
    /// Input plus requested output, when the request bounds its output.
    pub expected_peak_tokens: Option<u64>,
    /// The prompt's token ids, when the request was tokenized.
    pub tokens: Option<&'a RequestTokens>,
    /// The session key from the configured session header; never empty.
    pub session_key: Option<&'a str>,
    /// The routing key from the configured routing-key header; never empty.
    pub routing_key: Option<&'a str>,
}

/// The token ids of one prepared request.
///
/// Prepared once per request and shared by every bucket attempt and by dispatch, so that
/// per-request work on the tokens (block hashes, the prefix lookup memo) is done once.
#[derive(Debug, Default)]
pub struct RequestTokens {
    ids: Vec<u32>,
    memo: PrefixMemo,
    /// Local block hashes (no LoRA name or cache salt) per block size, made on first use.
    hashes: Mutex<Vec<(BlockSize, Arc<[u64]>)>>,
}

impl RequestTokens {
    /// Wraps the prompt's token ids.
    pub fn new(ids: Vec<u32>) -> Self {
        Self { ids, memo: PrefixMemo::default(), hashes: Mutex::default() }
    }

    /// Routing ids for prompt text the router has no tokenizer for: its bytes four at a time
    /// (the last group zero-padded), so about one id per token of the size estimate and one
    /// [`BlockSize::APPROXIMATE`] block per 64 bytes. They never equal an engine's blocks: only
    /// the router's own dispatches (approximate mode) can match them.
    pub fn from_text(text: &[u8]) -> Self {
        let ids = text
            .chunks(4)
            .map(|chunk| {
                let mut word = [0u8; 4];
                word[..chunk.len()].copy_from_slice(chunk);
                u32::from_le_bytes(word)
            })
            .collect();
        Self::new(ids)
    }

    /// The local block hashes of the full blocks of `block_size` tokens, as the prefix index
    /// keys them: computed once per block size, then shared by every lookup and by the
    /// predicted entries recorded at dispatch.
    pub fn block_hashes(&self, block_size: BlockSize) -> Arc<[u64]> {
        let mut hashes = self.hashes.lock();
        if let Some((_, found)) = hashes.iter().find(|(size, _)| *size == block_size) {
            return Arc::clone(found);
        }
        let made: Arc<[u64]> =
            salted_block_hashes(&self.ids, block_size.get(), Salt::default()).into();
        hashes.push((block_size, Arc::clone(&made)));
        made
    }

    /// The token ids.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The prefix lookups made for these tokens so far (one per cache source and block size).
    pub fn memo(&self) -> &PrefixMemo {
        &self.memo
    }
}

/// The engine a policy chose, and why.
#[derive(Clone, Debug)]
pub struct Pick {
    /// The chosen engine; one of the candidates, and admitted.
    pub worker: Arc<Worker>,
    /// The path the policy took, for metrics and traces.
    pub reason: PickReason,
    /// The prefill work the policy expects the request to cost this engine (its uncached
    /// prompt tokens there), when the policy looked the prefix up. The dispatcher records it
    /// for the recent-dispatch correction; without it the whole input counts.
    pub uncached_tokens: Option<u64>,
    /// The time to first token the policy predicted on this engine, in milliseconds
    /// (`predicted_ttft`), for comparison with the observed one.
    pub predicted_ttft_ms: Option<f64>,
    /// The prefill work that prediction put before the first token (queued there plus this
    /// request's uncached tokens): with the observed first token, a sample of the engine's
    /// prefill rate (`router_state_load::PrefillRates`).
    pub predicted_work_tokens: Option<u64>,
    /// The request's prefix as the policy found it on this engine: the data-parallel rank
    /// holding it and its length in tokens, when the policy looked it up and the engine holds
    /// some of it. The rank choice inside the engine reads it ([`crate::choose_rank`]).
    pub cached_prefix: Option<HeldPrefix>,
}

/// A prefix held by one data-parallel rank of an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldPrefix {
    /// The rank holding it (the longest holder; the lowest on ties).
    pub rank: u32,
    /// Leading tokens of the request it holds.
    pub tokens: u64,
}

impl Pick {
    /// A pick of `worker` for `reason`.
    pub fn new(worker: Arc<Worker>, reason: PickReason) -> Self {
        Self {
            worker,
            reason,
            uncached_tokens: None,
            predicted_ttft_ms: None,
            predicted_work_tokens: None,
            cached_prefix: None,
        }
    }

    /// This pick, expecting `tokens` of uncached prefill work on its engine.
    pub fn with_uncached_tokens(mut self, tokens: u64) -> Self {
        self.uncached_tokens = Some(tokens);
        self
    }

    /// This pick, with the request's prefix held on its engine, if any.
    pub fn with_cached_prefix(mut self, held: Option<HeldPrefix>) -> Self {
        self.cached_prefix = held;
        self
    }

    /// This pick, with the predicted time to first token on its engine.
    pub fn with_predicted_ttft_ms(mut self, ms: f64) -> Self {
        self.predicted_ttft_ms = Some(ms);
        self
    }

    /// This pick, predicting `tokens` of prefill work before its first token.
    pub fn with_predicted_work(mut self, tokens: u64) -> Self {
        self.predicted_work_tokens = Some(tokens);
        self
    }
}

/// Why a policy chose its engine: the path taken through its algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PickReason {
    /// The group had one candidate.
    OnlyCandidate,
    /// Next in rotation.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// Power-of-two compared reported engine pressure.
    ReportedPressure,
    /// Power-of-two compared router-local in-flight counts (a report was missing or basic).
    LocalPressure,
    /// Least-load used reported load with the recent-dispatch correction.
    LeastReportedLoad,
    /// Least-load used router-local in-flight counts (telemetry missing).
    LeastLocalLoad,
    /// Cache-aware chose an engine holding the prefix.
    CacheHit,
    /// Cache-aware chose an engine it pictures holding the prefix from its own dispatches:
    /// the engine has no KV events (approximate mode).
    CacheApproximate,
    /// Cache-aware pinned to a prefix holder while every engine was queued.
    SaturationPin,
    /// Cache-aware found no usable prefix holder and ran its load fallback.
    CacheMiss,
    /// Cache-aware could not reach its prefix source and ran its load fallback.
    CacheUnavailable,
    /// Predicted-TTFT chose the engine with the lowest predicted time to first token, from
    /// the engines' load reports, the router's dispatches since and the prefix index.
    PredictedTtft,
    /// Predicted-TTFT compared router-local in-flight work, every token counted as uncached:
    /// some candidate had no usable load report.
    PredictedTtftLocal,
    /// An existing, admitted session or routing-key binding was reused.
    AffinityReused,
    /// A new binding was created from the fallback's choice.
    AffinityBound,
    /// No key: the fallback's choice, with no binding created.
    AffinityKeyless,
}

impl PickReason {
    /// A stable `snake_case` name for metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            PickReason::OnlyCandidate => "only_candidate",
            PickReason::RoundRobin => "round_robin",
            PickReason::Random => "random",
            PickReason::ReportedPressure => "reported_pressure",
            PickReason::LocalPressure => "local_pressure",
            PickReason::LeastReportedLoad => "least_reported_load",
            PickReason::LeastLocalLoad => "least_local_load",
            PickReason::CacheHit => "cache_hit",
            PickReason::CacheApproximate => "cache_approximate",
            PickReason::SaturationPin => "saturation_pin",
            PickReason::CacheMiss => "cache_miss",
            PickReason::CacheUnavailable => "cache_unavailable",
            PickReason::PredictedTtft => "predicted_ttft",
            PickReason::PredictedTtftLocal => "predicted_ttft_local",
            PickReason::AffinityReused => "affinity_reused",
            PickReason::AffinityBound => "affinity_bound",
            PickReason::AffinityKeyless => "affinity_keyless",
        }
    }
}

impl fmt::Display for PickReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a policy returned no engine. The bucket loop acts on these: the first three move on
/// to the next bucket, the rest stop routing.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PickError {
    /// No eligible engine: the group is empty, or the policy's selection missed.
    #[error("no candidates for {stage}")]
    NoCandidates {
        /// The stage that had none.
        stage: Stage,
    },
    /// The policy tried every engine it could and admission rejected each.
    #[error("no admissible engine: {}", join(rejections))]
    NoAdmissibleEngine {
        /// Every rejection, in the order met.
        rejections: Vec<Rejection>,
    },
    /// The engine the policy chose failed admission after selection.
    #[error("admission rejected: {0}")]
    AdmissionRejected(Rejection),
    /// The request's session or routing key cannot name a binding (too long): the client's
    /// mistake.
    #[error("invalid {key}")]
    InvalidKey {
        /// Which key.
        key: KeySource,
        /// Why.
        #[source]
        error: ScopeError,
    },
    /// The prefix source refused the lookup as an invalid query.
    #[error("prefix lookup refused")]
    Lookup(#[source] Arc<LookupError>),
    /// The policy was asked to pick for a stage it does not serve (a configuration the
    /// builders refuse, so a caller bug).
    #[error("policy {policy} does not select {stage} engines")]
    UnsupportedStage {
        /// The policy's configuration name.
        policy: &'static str,
        /// The stage asked for.
        stage: Stage,
    },
    /// The policy returned an engine outside the exact candidate set.
    #[error("policy picked {worker}, which is not one of its candidates")]
    OutsideCandidates {
        /// The foreign engine.
        worker: WorkerId,
    },
}

impl PickError {
    /// Whether the bucket loop should try the next bucket (missing candidates or admission),
    /// rather than stop routing.
    pub fn advances_bucket(&self) -> bool {
        matches!(
            self,
            PickError::NoCandidates { .. }
                | PickError::NoAdmissibleEngine { .. }
                | PickError::AdmissionRejected(_)
        )
    }

    /// The admission rejections this outcome carries, if any.
    pub fn rejections(&self) -> &[Rejection] {
        match self {
            PickError::NoAdmissibleEngine { rejections } => rejections,
            PickError::AdmissionRejected(rejection) => std::slice::from_ref(rejection),
            _ => &[],
        }
    }
}

fn join(rejections: &[Rejection]) -> String {
    rejections.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}
