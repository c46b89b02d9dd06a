//! Buckets: length constraints, rank, and complete plain or PD engine selection.

use std::collections::HashMap;
use std::sync::Arc;

use router_policies::{LiveEstimator, Pick, PickError, PickRequest, RequestTokens};
use router_workers::{ModelId, Stage, Worker, WorkerId, WorkerRegistry};

use crate::error::{BucketError, MembershipError, StagePickError};
use crate::pair::warnings;
use crate::slo::{BucketSlo, SloEstimate, SloEstimates, SloTargets};
use crate::{EngineGroup, PairOn, PairingWarning};

/// The inclusive range of input lengths a bucket accepts, in tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenLimits {
    /// Smallest accepted input.
    pub min: u64,
    /// Largest accepted input; `None` = unbounded.
    pub max: Option<u64>,
}

impl TokenLimits {
    /// Whether `input_tokens` lies in the range.
    pub fn contains(&self, input_tokens: u64) -> bool {
        self.min <= input_tokens && self.max.is_none_or(|max| input_tokens <= max)
    }
}

/// The engine groups of a bucket: one plain group, or a prefill and a decode group. A partial
/// or mixed bucket cannot be represented.
#[derive(Debug)]
pub enum BucketGroups {
    /// One group of plain engines.
    Plain(EngineGroup),
    /// Prefill/decode disaggregation: both engines of a pair come from this bucket.
    Pd {
        /// The prefill group.
        prefill: EngineGroup,
        /// The decode group.
        decode: EngineGroup,
        /// The labels on which the pair's engines must agree ([`PairOn::none`] = any pair).
        pair_on: PairOn,
    },
}

impl BucketGroups {
    /// Whether this is a prefill/decode bucket.
    pub fn is_pd(&self) -> bool {
        matches!(self, BucketGroups::Pd { .. })
    }

    /// The groups in the order they are asked: plain, or prefill then decode.
    pub fn iter(&self) -> impl Iterator<Item = &EngineGroup> {
        let (first, second) = match self {
            BucketGroups::Plain(plain) => (plain, None),
            BucketGroups::Pd { prefill, decode, .. } => (prefill, Some(decode)),
        };
        std::iter::once(first).chain(second)
    }

    /// The pairing constraint of a PD bucket; `None` for a plain one.
    pub fn pair_on(&self) -> Option<&PairOn> {
        match self {
            BucketGroups::Plain(_) => None,
            BucketGroups::Pd { pair_on, .. } => Some(pair_on),
        }
    }

    /// Each group with the stage of the slot it fills.
    fn slots(&self) -> impl Iterator<Item = (Stage, &EngineGroup)> {
        let (first, second) = match self {
            BucketGroups::Plain(plain) => ((Stage::Plain, plain), None),
            BucketGroups::Pd { prefill, decode, .. } => {
                ((Stage::Prefill, prefill), Some((Stage::Decode, decode)))
            }
        };
        std::iter::once(first).chain(second)
    }
}

/// Everything needed to build a [`Bucket`].
#[derive(Debug)]
pub struct BucketSpec {
    /// Unique, non-empty id within the model.
    pub id: String,
    /// Tie-breaker between buckets of equal input capacity; lower is tried first.
    pub rank: u32,
    /// Accepted input lengths.
    pub limits: TokenLimits,
    /// Largest input plus requested output the bucket's engines hold; `None` = unbounded.
    pub max_context_tokens: Option<u64>,
    /// The bucket's groups.
    pub groups: BucketGroups,
    /// What the bucket says it delivers, for SLO-aware ordering ([`BucketSlo::NONE`]: nothing).
    pub slo: BucketSlo,
    /// Where `live` estimates come from; required when one of `slo` is `live`.
    pub live: Option<Arc<LiveEstimator>>,
}

/// A length class of requests and the engines that serve it.
#[derive(Debug)]
pub struct Bucket {
    id: Arc<str>,
    /// `id` as a header value, made once (see [`Bucket::id_header`]).
    id_header: http::HeaderValue,
    rank: u32,
    limits: TokenLimits,
    max_context_tokens: Option<u64>,
    groups: BucketGroups,
    slo: BucketSlo,
    live: Option<Arc<LiveEstimator>>,
}

impl Bucket {
    /// Validates a spec: non-empty id, `min <= max`, a context capacity of at least 1 and not
    /// below `min`, each group in the slot of its own stage, and an estimator for `live`
    /// estimates.
    pub fn new(spec: BucketSpec) -> Result<Self, BucketError> {
        let BucketSpec { id, rank, limits, max_context_tokens, groups, slo, live } = spec;
        if id.trim().is_empty() {
            return Err(BucketError::EmptyId);
        }
        if let Some(max) = limits.max
            && limits.min > max
        {
            return Err(BucketError::InvertedRange { id, min: limits.min, max });
        }
        match max_context_tokens {
            Some(0) => return Err(BucketError::ZeroContext { id }),
            Some(context) if context < limits.min => {
                return Err(BucketError::ContextBelowMin { id, context, min: limits.min });
            }
            _ => {}
        }
        if let Some((slot, group)) = groups.slots().find(|(slot, group)| group.stage() != *slot) {
            return Err(BucketError::GroupInWrongSlot { id, slot, group: group.stage() });
        }
        if slo.is_live() && live.is_none() {
            return Err(BucketError::LiveWithoutEstimator { id });
        }
        let id_header = router_workers::id_header(&id);
        let id = Arc::from(id);
        Ok(Self { id, id_header, rank, limits, max_context_tokens, groups, slo, live })
    }

    /// The bucket id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// [`Bucket::id`] as a header value, made once: the router names the bucket that served
    /// each answer in a response header.
    pub fn id_header(&self) -> &http::HeaderValue {
        &self.id_header
    }

    /// The bucket's id, shared: a copy is a reference count, not a string.
    pub fn shared_id(&self) -> &Arc<str> {
        &self.id
    }

    /// The rank (lower is tried first among equal capacities).
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Accepted input lengths.
    pub fn limits(&self) -> TokenLimits {
        self.limits
    }

    /// The context capacity; `None` = unbounded.
    pub fn max_context_tokens(&self) -> Option<u64> {
        self.max_context_tokens
    }

    /// The groups.
    pub fn groups(&self) -> &BucketGroups {
        &self.groups
    }

    /// What the bucket declares it delivers.
    pub fn slo(&self) -> BucketSlo {
        self.slo
    }

    /// The bucket's estimates for the targets stated in `active` (the others are not
    /// estimated): declared values as they are; a live time to first token is the predicted
    /// one of the best candidate of the first group (plain, or prefill) for this request, and
    /// a live decode speed the best candidate's of the last group (plain, or decode).
    pub async fn slo_estimates(
        &self,
        workers: &WorkerRegistry,
        request: &BucketRequest<'_>,
        active: SloTargets,
    ) -> SloEstimates {
        let (first, last) = match &self.groups {
            BucketGroups::Plain(plain) => (plain, plain),
            BucketGroups::Pd { prefill, decode, .. } => (prefill, decode),
        };
        let mut estimates = SloEstimates::default();
        if active.ttft_ms.is_some() {
            estimates.ttft_ms = match (self.slo.ttft_ms, &self.live) {
                (Some(SloEstimate::Declared(ms)), _) => Some(ms.get() as f64),
                (Some(SloEstimate::Live), Some(live)) => {
                    let candidates = first.candidates(workers, request.model);
                    let pick_request = request.pick_request(&self.id, first.stage());
                    live.ttft_ms(&candidates, &pick_request).await
                }
                _ => None,
            };
        }
        if active.tokens_per_second.is_some() {
            estimates.tokens_per_second = match (self.slo.tokens_per_second, &self.live) {
                (Some(SloEstimate::Declared(tps)), _) => Some(tps.get()),
                (Some(SloEstimate::Live), Some(live)) => {
                    live.decode_tokens_per_sec(&last.candidates(workers, request.model))
                }
                _ => None,
            };
        }
        estimates
    }

    /// The largest input this bucket can take: the lesser of `limits.max` and the context
    /// capacity; `None` = unbounded. Buckets are tried in ascending input capacity.
    pub fn input_capacity(&self) -> Option<u64> {
        match (self.limits.max, self.max_context_tokens) {
            (Some(max), Some(context)) => Some(max.min(context)),
            (max, context) => max.or(context),
        }
    }

    /// Whether a request fits: the input lies in the limits and the context capacity holds the
    /// expected peak when known, else the input.
    pub fn fits(&self, input_tokens: u64, expected_peak_tokens: Option<u64>) -> bool {
        let needed = expected_peak_tokens.unwrap_or(input_tokens);
        self.limits.contains(input_tokens)
            && self.max_context_tokens.is_none_or(|context| needed <= context)
    }

    /// The order key: input capacity ascending with unbounded last, then rank, then id.
    pub(crate) fn order_key(&self) -> (bool, Option<u64>, u32, &str) {
        let capacity = self.input_capacity();
        (capacity.is_none(), capacity, self.rank, &self.id)
    }

    /// Whether a complete selection is possible for `model` now, admission aside: each group
    /// has a candidate, and with a pairing constraint some prefill candidate has a compatible
    /// decode candidate. For readiness.
    pub fn has_candidates(&self, workers: &WorkerRegistry, model: &ModelId) -> bool {
        match &self.groups {
            BucketGroups::Pd { prefill, decode, pair_on } if !pair_on.is_empty() => {
                let decodes = decode.candidates(workers, model);
                prefill
                    .candidates(workers, model)
                    .iter()
                    .any(|p| decodes.iter().any(|d| pair_on.compatible(p, d)))
            }
            groups => groups.iter().all(|group| !group.candidates(workers, model).is_empty()),
        }
    }

    /// What an operator should hear about this bucket's pairing constraint, judged over the
    /// model's `workers` whatever their health (a configuration check): `pair_on` labels no
    /// worker carries, and prefill members with no compatible decode member. With `only`, just
    /// whether that prefill engine (one just added, say) has a partner. Nothing for a plain
    /// bucket or one without `pair_on`.
    pub fn pairing_warnings(
        &self,
        workers: &[Arc<Worker>],
        only: Option<&WorkerId>,
    ) -> Vec<PairingWarning> {
        match &self.groups {
            BucketGroups::Pd { prefill, decode, pair_on } => {
                warnings(&self.id, pair_on, prefill, decode, workers, only)
            }
            BucketGroups::Plain(_) => Vec::new(),
        }
    }

    /// Reports every `worker_ids` entry of this bucket's groups naming an unknown worker or
    /// one of another role. `workers` are the model's configured workers and their roles.
    pub fn check_membership(&self, workers: &HashMap<WorkerId, Stage>) -> Vec<MembershipError> {
        self.groups.iter().flat_map(|group| group.check_membership(&self.id, workers)).collect()
    }

    /// Selects the complete set of engines for `request` from this bucket: the plain group's
    /// pick, or the prefill group's then the decode group's.
    ///
    /// Each group is given a `PickRequest` carrying this bucket's id and the group's stage.
    /// A failure keeps its stage; when decode fails, the tentative prefill pick is dropped
    /// (nothing was reserved or sent for it), so a later bucket selects both engines again.
    ///
    /// With a pairing constraint ([`PairOn`]), the decode group is offered only the decode
    /// candidates compatible with the chosen prefill engine, and none is a `NoCandidates` of
    /// the decode stage. The prefill group is offered only the prefill candidates that have
    /// at least one compatible decode candidate now (a prefill engine whose partners are all
    /// down would only make the bucket fail); when no prefill candidate has one, that too is
    /// a `NoCandidates` of the decode stage, since decode engines are what is missing.
    pub async fn pick_engines(
        &self,
        workers: &WorkerRegistry,
        request: &BucketRequest<'_>,
    ) -> Result<BucketPick, StagePickError> {
        let model = request.model;
        match &self.groups {
            BucketGroups::Plain(plain) => {
                let candidates = plain.candidates(workers, model);
                self.pick_in(plain, candidates, request).await.map(BucketPick::Plain)
            }
            BucketGroups::Pd { prefill, decode, pair_on } if pair_on.is_empty() => {
                let prefill = self.pick_in(prefill, prefill.candidates(workers, model), request);
                let prefill = prefill.await?;
                // On failure, `prefill` is dropped here: nothing was reserved or sent for it.
                let decode = self.pick_in(decode, decode.candidates(workers, model), request);
                Ok(BucketPick::Pd { prefill, decode: decode.await? })
            }
            BucketGroups::Pd { prefill: prefill_group, decode: decode_group, pair_on } => {
                let mut prefills = prefill_group.candidates(workers, model);
                if !prefills.is_empty() {
                    let decodes = decode_group.candidates(workers, model);
                    prefills.retain(|p| decodes.iter().any(|d| pair_on.compatible(p, d)));
                    if prefills.is_empty() {
                        return Err(no_candidates(Stage::Decode));
                    }
                }
                let prefill = self.pick_in(prefill_group, prefills, request).await?;
                // Read again: the prefill policy may have waited on a remote lookup.
                let mut decodes = decode_group.candidates(workers, model);
                decodes.retain(|d| pair_on.compatible(&prefill.worker, d));
                let decode = self.pick_in(decode_group, decodes, request).await?;
                Ok(BucketPick::Pd { prefill, decode })
            }
        }
    }

    async fn pick_in(
        &self,
        group: &EngineGroup,
        candidates: Vec<Arc<Worker>>,
        request: &BucketRequest<'_>,
    ) -> Result<Pick, StagePickError> {
        group
            .pick_among(candidates, &self.id, request)
            .await
            .map_err(|error| StagePickError { stage: group.stage(), error })
    }
}

fn no_candidates(stage: Stage) -> StagePickError {
    StagePickError { stage, error: PickError::NoCandidates { stage } }
}

/// The prepared facts of one request, shared by every bucket attempt.
#[derive(Clone, Copy, Debug)]
pub struct BucketRequest<'a> {
    /// The requested model.
    pub model: &'a ModelId,
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
    /// The request's SLO targets ([`SloTargets::NONE`]: none); a target whose preference the
    /// resolver has disabled is ignored.
    pub slo: SloTargets,
    /// Engines this request must not be sent to (those that already failed it: a retry
    /// selects among the others).
    pub excluded: &'a [WorkerId],
    /// When set, the only workers that may be candidates, in any order (an endpoint picker's
    /// subset hint): every group intersects its candidates with it, so an empty list leaves
    /// every group without candidates. `None`: no restriction.
    pub subset: Option<&'a [WorkerId]>,
}

impl<'a> BucketRequest<'a> {
    /// Narrows `candidates` to this request's subset, if it has one, without the engines it
    /// excludes.
    pub(crate) fn narrow(&self, candidates: &mut Vec<Arc<Worker>>) {
        if let Some(subset) = self.subset {
            candidates.retain(|worker| subset.contains(worker.id()));
        }
        if !self.excluded.is_empty() {
            candidates.retain(|worker| !self.excluded.contains(worker.id()));
        }
    }

    /// The request as the `stage` group of bucket `bucket` sees it.
    pub fn pick_request<'b>(&self, bucket: &'b str, stage: Stage) -> PickRequest<'b>
    where
        'a: 'b,
    {
        PickRequest {
            model: self.model,
            stage,
            bucket,
            input_tokens: self.input_tokens,
            expected_peak_tokens: self.expected_peak_tokens,
            tokens: self.tokens,
            session_key: self.session_key,
            routing_key: self.routing_key,
        }
    }
}

/// A complete selection from one bucket.
#[derive(Clone, Debug)]
pub enum BucketPick {
    /// One plain engine.
    Plain(Pick),
    /// A prefill and a decode engine from the same bucket.
    Pd {
        /// The prefill engine.
        prefill: Pick,
        /// The decode engine.
        decode: Pick,
    },
}

impl BucketPick {
    /// Each pick with its stage: the plain one, or prefill then decode.
    pub fn iter(&self) -> impl Iterator<Item = (Stage, &Pick)> {
        let (first, second) = match self {
            BucketPick::Plain(plain) => ((Stage::Plain, plain), None),
            BucketPick::Pd { prefill, decode } => {
                ((Stage::Prefill, prefill), Some((Stage::Decode, decode)))
            }
        };
        std::iter::once(first).chain(second)
    }

    /// The chosen engines, in the order of [`BucketPick::iter`].
    pub fn workers(&self) -> impl Iterator<Item = &Arc<Worker>> {
        self.iter().map(|(_, pick)| &pick.worker)
    }
}
